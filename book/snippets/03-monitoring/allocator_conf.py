# The same three training steps under PyTorch's two kinds of segments, each in a fresh
# process: the allocator reads PYTORCH_CUDA_ALLOC_CONF once, when CUDA starts.
import os
import subprocess
import sys

JOB = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(4)]).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(1024, 2048, device="cuda")
for step in range(3):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
s = torch.cuda.memory_stats()
print(s["requested_bytes.all.peak"], s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"])
"""

MiB = 2**20
print(f"{'PYTORCH_CUDA_ALLOC_CONF':28} {'peak requested':>15} {'peak allocated':>15}",
      f"{'peak reserved':>14}")
for conf in ["expandable_segments:False", "expandable_segments:True"]:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
    out = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True,
                         text=True, check=True).stdout
    requested, allocated, reserved = (int(v) / MiB for v in out.split())
    print(f"{conf:28} {requested:>11.2f} MiB {allocated:>11.2f} MiB {reserved:>10.2f} MiB")
