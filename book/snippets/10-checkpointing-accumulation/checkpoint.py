# One forward and backward of 8 residual MLP blocks with dropout (batch 8192 x 1024):
# the peak above what was allocated before it, the time, and how far the gradients are
# from the first run's, with no checkpoint, each block in checkpoint(use_reentrant=False),
# and each block under a selective policy that saves the matrix products' outputs.
import functools, time
import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

MiB = 2**20
torch.manual_seed(0)
blocks = nn.ModuleList(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Dropout(0.1),
                                     nn.Linear(4096, 1024), nn.LayerNorm(1024))
                       for _ in range(8)).cuda()
x = torch.randn(8192, 1024, device="cuda", requires_grad=True)
params = [x, *blocks.parameters()]


def keep_products(ctx, op, *args, **kwargs):
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def forward_backward(mode):
    selective = functools.partial(create_selective_checkpoint_contexts, keep_products)
    h = x
    for block in blocks:
        if mode == "none":
            h = h + block(h)
        elif mode == "checkpoint":
            h = h + checkpoint(block, h, use_reentrant=False)
        else:
            h = h + checkpoint(block, h, use_reentrant=False, context_fn=selective)
    h.square().mean().backward()


reference = None
for mode in ("none", "checkpoint", "selective"):
    forward_backward(mode)  # warm-up: cuBLAS's workspaces, first calls
    for p in params:
        p.grad = None
    torch.manual_seed(1)  # the same dropout masks in every run
    torch.cuda.synchronize(), torch.cuda.reset_peak_memory_stats()
    before, t = torch.cuda.memory_allocated(), time.perf_counter()
    forward_backward(mode)
    torch.cuda.synchronize()
    ms, peak = (time.perf_counter() - t) * 1e3, torch.cuda.max_memory_allocated() - before
    grads = [p.grad.clone() for p in params]
    reference = reference or grads
    diff = max((a - b).abs().max().item() for a, b in zip(grads, reference))
    print(f"{mode:11} peak {peak / MiB:8.1f} MiB  {ms:7.1f} ms  "
          f"max |grad difference|: {diff:.1e}")
