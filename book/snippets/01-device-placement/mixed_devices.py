# An operation on tensors of two devices fails: it never copies behind your back.
import torch

on_gpu = torch.ones(3, device="cuda")
on_host = torch.full((3,), 2.0)
try:
    on_gpu + on_host
except RuntimeError as e:
    print(f"cuda + cpu fails: {e}")

# The fix is an explicit copy of one input.
print(f"cuda + cpu.to('cuda'): {(on_gpu + on_host.to(on_gpu.device)).tolist()}")
# The one exception: a zero-dimensional CPU tensor travels as a kernel argument.
print(f"cuda + zero-dimensional cpu tensor: {(on_gpu + torch.tensor(2.0)).tolist()}")
