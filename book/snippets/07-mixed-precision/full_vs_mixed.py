# Full against mixed precision: an MLP 4096 wide (4 hidden layers), batch 256, Adam,
# trained in float32, under autocast to bfloat16, and under autocast to float16 with a
# GradScaler. Peak memory allocated during a step (MiB) and the median step time.
import time
import torch
from torch import nn

MiB = 2**20
x = torch.randn(256, 4096, device="cuda")
y = (x @ torch.randn(4096, 16, device="cuda")).argmax(1)
print(f"{'precision':32} {'peak MiB':>9} {'step ms':>8}")
for name, dtype in [("float32", None), ("autocast bfloat16", torch.bfloat16),
                    ("autocast float16 + GradScaler", torch.float16)]:
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(4096, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    # ANCHOR: step
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    # ANCHOR_END: step
    step(); step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(10):
        t = time.perf_counter(); step(); torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / MiB
    print(f"{name:32} {peak:9.2f} {sorted(times)[5] * 1e3:8.2f}")
    del model, opt, layers
