# Two processes on one GPU, each capped with set_per_process_memory_fraction(0.4): each
# fills its share with tensors until its own cap refuses, holds them while the other does
# the same, and reports.
import subprocess
import sys
import time

import torch

if len(sys.argv) > 1:
    torch.cuda.set_per_process_memory_fraction(0.4)
    total = torch.cuda.get_device_properties(0).total_memory
    held = []
    try:
        while True:
            held.append(torch.empty(total // 40, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        refusal = str(e)
    reserved = torch.cuda.memory_reserved()
    time.sleep(1.5)  # the other process fills its share meanwhile
    free, _ = torch.cuda.mem_get_info()
    print(f"child {sys.argv[1]}: held {len(held)} tensors, {reserved / 2**30:.2f} GiB reserved;"
          f" free on the device while holding: {free / 2**30:.2f} GiB")
    print(f"child {sys.argv[1]}: {refusal}")
    sys.exit(0)
children = [subprocess.Popen([sys.executable, __file__, str(i)], stdout=subprocess.PIPE,
                             text=True) for i in range(2)]
for c in children:
    out, _ = c.communicate()
    print(out, end="")
print(f"exit statuses: {[c.returncode for c in children]}")
