# What a process holds on the GPU besides its allocator's memory: the CUDA context and
# the libraries' kernels, read three ways after each step.
import subprocess

import torch
import torch.nn.functional as F

MiB = 2**20


def smi_used():
    """Memory used on the whole of GPU 0, as nvidia-smi reports it, in MiB."""
    return int(subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout)


def row(label, cuda=True):
    used = reserved = "-"
    if cuda:                               # mem_get_info needs a context: makes one if none
        free, total = torch.cuda.mem_get_info()
        used, reserved = f"{(total - free) / MiB:,.0f}", f"{torch.cuda.memory_reserved() / MiB:,.0f}"
    print(f"{label:28} {smi_used():>10,} {used:>13} {reserved:>9}")


print(f"{'after':28} {'nvidia-smi':>10} {'total - free':>13} {'reserved':>9}  (MiB)")
row("import torch", cuda=False)
torch.cuda.init()
row("torch.cuda.init()", cuda=False)
row("torch.cuda.mem_get_info()")
x = torch.zeros(1, device="cuda")
row("a first tensor")
a = torch.randn(1024, 1024, device="cuda")
b = a @ a                                             # cuBLAS: its kernels, a workspace
row("a first matrix product")
img = torch.randn(8, 3, 64, 64, device="cuda")
y = F.conv2d(img, torch.randn(16, 3, 3, 3, device="cuda"))   # cuDNN
row("a first convolution")
