# Requests larger than what the GPU has. On Linux a request past the device's memory
# fails with an out-of-memory error; nothing spills into host memory (Windows' WDDM
# driver can spill into "shared GPU memory" instead).
import torch

total = torch.cuda.get_device_properties(0).total_memory
print(f"device memory: {total / 2**30:.2f} GiB")
# ANCHOR: requests
try:
    x = torch.randn(100000, 100000, device="cuda")  # 100000 x 100000 float32
    print(f"randn(100000, 100000): served, {x.nbytes / 2**30:.2f} GiB")
    del x
except torch.cuda.OutOfMemoryError as e:
    print("randn(100000, 100000):", e)
torch.cuda.empty_cache()
try:
    y = torch.empty(total * 3 // 2, dtype=torch.uint8, device="cuda")
    print("1.5 x the device: served")
except torch.cuda.OutOfMemoryError as e:
    print("1.5 x the device:", e)
# ANCHOR_END: requests
