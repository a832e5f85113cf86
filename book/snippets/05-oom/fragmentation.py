# The same requests under both settings of expandable_segments, each in a process of
# its own (the setting is read when CUDA starts): 5 MiB blocks until a 400 MiB memory
# fraction refuses, three of every four freed, then one request of 60 MiB.
import os
import subprocess
import sys

CHILD = r"""
import torch
MiB = 2**20
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(400 * MiB / total)
blocks = []
try:
    while True:
        blocks.append(torch.empty(5 * MiB, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    pass
n = len(blocks)
blocks = blocks[::4]  # keep one of every four
a, r = torch.cuda.memory_allocated() / MiB, torch.cuda.memory_reserved() / MiB
try:
    big = torch.empty(60 * MiB, dtype=torch.uint8, device="cuda")
    result = "served"
except torch.cuda.OutOfMemoryError as e:
    result = "out of memory: " + str(e)
print(f"{n} blocks, {len(blocks)} kept: {a:.2f} MiB allocated, {r:.2f} MiB reserved")
print(f"60 MiB: {result}")
"""
for conf in ["expandable_segments:False", "expandable_segments:True"]:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True)
    print(f"PYTORCH_CUDA_ALLOC_CONF={conf}\n{out.stdout}")
