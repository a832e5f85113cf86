# mem_get_info, memory_reserved and nvidia-smi side by side: a 1 GiB tensor made,
# dropped, and its memory returned to the driver.
import subprocess

import torch

MiB, GiB = 2**20, 2**30


def smi(field):
    """One of nvidia-smi's figures for GPU 0, in MiB."""
    return int(subprocess.run(
        ["nvidia-smi", "-i", "0", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout)


def row(label):
    free, total = torch.cuda.mem_get_info()
    used, reserved = (total - free) / MiB, torch.cuda.memory_reserved() / MiB
    print(f"{label:16} {torch.cuda.memory_allocated() / MiB:>9,.0f} {reserved:>9,.0f}"
          f" {used:>13,.0f} {smi('memory.used'):>11,} {used - reserved:>17,.0f}")


torch.zeros(1, device="cuda")                          # the context, first
free, total = torch.cuda.mem_get_info()
print(f"total: mem_get_info {total / MiB:,.0f} MiB, get_device_properties "
      f"{torch.cuda.get_device_properties(0).total_memory / MiB:,.0f} MiB, "
      f"nvidia-smi {smi('memory.total'):,} MiB of which {smi('memory.reserved'):,} MiB "
      f"reserved for the driver")
print(f"{'after':16} {'allocated':>9} {'reserved':>9} {'total - free':>13}"
      f" {'nvidia-smi':>11} {'used - reserved':>17}  (MiB)")
row("the context")
x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
row("x: 1 GiB")
del x
row("del x")
torch.cuda.empty_cache()
row("empty_cache()")
