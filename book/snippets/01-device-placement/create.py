# Tensors created on the GPU, and the common detour through host memory.
import torch

torch.manual_seed(42)
made_on_gpu = {
    "zeros": torch.zeros(1024, 1024, device="cuda"),
    "randn": torch.randn(1024, 1024, device="cuda"),
    "arange": torch.arange(1024 * 1024, dtype=torch.float32, device="cuda").view(1024, 1024),
}
for how, x in made_on_gpu.items():
    first = [round(v, 4) for v in x[0, :3].tolist()]
    print(f"{how:7} device={x.device} is_cuda={x.is_cuda} shape={tuple(x.shape)} "
          f"dtype={x.dtype} first={first}")
print(f"GPU memory these three hold: {torch.cuda.memory_allocated() / 2**20:.2f} MiB")

# The detour: made in host memory, then copied over the bus (two allocations, one copy).
on_host = torch.randn(1024, 1024)
moved = on_host.cuda()  # the same call as on_host.to("cuda")
print(f"torch.randn(1024, 1024).cuda(): made on {on_host.device}, copied to {moved.device}; "
      f"the host tensor is still alive on {on_host.device}")
