# Saved activations offloaded to host memory: one forward and backward of 8 residual MLP
# blocks (batch 4096 x 1024), its peak above what was allocated before it and its
# time, as it is, under save_on_cpu(pin_memory=True) and under save_on_cpu() (pageable).
import contextlib, time
import torch
from torch import nn
from torch.autograd.graph import save_on_cpu

MiB = 2**20
torch.manual_seed(0)
blocks = nn.ModuleList(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(),
                                     nn.Linear(4096, 1024)) for _ in range(8)).cuda()
x = torch.randn(4096, 1024, device="cuda", requires_grad=True)
modes = {"on the GPU": contextlib.nullcontext,
         "save_on_cpu(pin_memory=True)": lambda: save_on_cpu(pin_memory=True),
         "save_on_cpu() (pageable)": save_on_cpu}


def forward_backward(hooks):
    with hooks():
        h = x
        for block in blocks:
            h = h + block(h)
        loss = h.square().mean()
    loss.backward()


for name, hooks in modes.items():
    forward_backward(hooks)  # warm-up: cuBLAS's workspaces, the pinned host blocks
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    torch.cuda.synchronize(), torch.cuda.reset_peak_memory_stats()
    before, t = torch.cuda.memory_allocated(), time.perf_counter()
    forward_backward(hooks)
    torch.cuda.synchronize()
    ms, peak = (time.perf_counter() - t) * 1e3, torch.cuda.max_memory_allocated() - before
    print(f"{name:29} peak {peak / MiB:8.1f} MiB  {ms:8.1f} ms")
