# How many GPUs, which one is current, and a block that makes another current: "cuda"
# without an index means the current device.
import torch

n = torch.cuda.device_count()
print(f"device_count() = {n}, current_device() = {torch.cuda.current_device()}")
for i in range(n):
    print(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")
with torch.cuda.device(n - 1):  # the last GPU: cuda:1 on two GPUs
    x = torch.randn(100, device="cuda")
    print(f"inside torch.cuda.device({n - 1}): current_device() = "
          f"{torch.cuda.current_device()}, x.device = {x.device}")
print(f"after the block: current_device() = {torch.cuda.current_device()}")
