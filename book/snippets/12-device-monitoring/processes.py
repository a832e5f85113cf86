# Who is on the GPU, as PyTorch and nvidia-smi list it, beside this process's own
# allocator.
import os
import subprocess

import torch

x = torch.empty(2**30, dtype=torch.uint8, device="cuda")     # 1 GiB
print(f"this process: pid {os.getpid()}, "
      f"memory_reserved() {torch.cuda.memory_reserved() / 2**20:,.0f} MiB")
print()
print(torch.cuda.list_gpu_processes())                       # through NVML (pynvml)
print()
print(subprocess.run(
    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
    capture_output=True, text=True, check=True).stdout, end="")
