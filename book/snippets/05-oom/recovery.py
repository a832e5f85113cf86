# Recovering from out-of-memory in a training loop: catch it, clean up outside the except
# clause (its traceback still holds the failed step's tensors), empty the cache, halve
# the batch. Memory above the model and optimizer state after each attempt.
import torch
from torch import nn

MiB = 2**20
torch.manual_seed(0)
sizes = [1024, 1024, 1024, 1024, 1024, 16]
layers = []
for i, (m, n) in enumerate(zip(sizes, sizes[1:])):
    layers += [nn.Linear(m, n)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
model = nn.Sequential(*layers).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)


def step(batch):
    x, y = torch.randn(batch, 1024, device="cuda"), torch.randn(batch, 16, device="cuda")
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


step(8)  # Adam's state exists from the first step on
torch.cuda.empty_cache()
baseline = torch.cuda.memory_allocated()
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 256 * MiB) / total)
# ANCHOR: recover
batch = 32768
while True:
    try:
        step(batch)
        ok = True
    except torch.cuda.OutOfMemoryError:
        ok = False  # clean up below, once the exception and its traceback are gone
    if not ok:
        opt.zero_grad()  # gradients the failed backward left
        torch.cuda.empty_cache()
    above = (torch.cuda.memory_allocated() - baseline) / MiB
    print(f"batch {batch}: {'ran' if ok else 'out of memory'}, {above:.2f} MiB above baseline")
    if ok:
        break
    batch //= 2
# ANCHOR_END: recover
