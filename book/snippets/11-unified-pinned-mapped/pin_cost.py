# What pinning costs beyond a copy: clone() makes a pageable copy of a tensor,
# pin_memory() a pinned one, each in memory never used before in this process.
import time

import torch

torch.empty(1, pin_memory=True)  # creates the CUDA context outside the timings


# ANCHOR: pin_cost
def ms(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1e3


print("size       clone()   pin_memory()")
for mib in (256, 1024):
    x = torch.randn(mib << 18)  # `mib` MiB of float32, its pages in place
    pageable = ms(x.clone)  # malloc, first-touch page faults, memcpy
    pinned = ms(x.pin_memory)  # a new pinned block: lock every page, then memcpy
    print(f"{mib:5} MiB {pageable:7.1f} ms {pinned:9.1f} ms")
# ANCHOR_END: pin_cost
