# A batch-size finder, as PyTorch Lightning's BatchSizeFinder in "binsearch" mode: double
# until out-of-memory, then binary search. Each trial is a fresh model with Adam and two
# training steps, under a memory fraction of 256 MiB; the cache is emptied after each.
import torch
from torch import nn

MiB = 2**20
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(256 * MiB / total)


def run(batch):
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        x, y = torch.randn(batch, 1024, device="cuda"), torch.randn(batch, 16, device="cuda")
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


# ANCHOR: finder
def fits(batch):
    try:
        run(batch)
        ok = True
    except torch.cuda.OutOfMemoryError:
        ok = False
    torch.cuda.empty_cache()
    print(f"batch {batch}: {'ran' if ok else 'out of memory'}")
    return ok


good, batch = 0, 1
while batch <= 1 << 20 and fits(batch):
    good, batch = batch, batch * 2
bad = batch
while bad - good > 1:
    mid = (good + bad) // 2
    good, bad = (mid, bad) if fits(mid) else (good, mid)
# ANCHOR_END: finder
print(f"largest batch that fits: {good}; allocated after: {torch.cuda.memory_allocated()} B")
