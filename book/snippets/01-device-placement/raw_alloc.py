# What a trip to the driver costs, seen from PyTorch: torch.empty with nothing cached
# calls cudaMalloc, and empty_cache() hands the segment back with cudaFree. Against
# that, the same torch.empty + del served from the cache.
import statistics
import time

import torch

torch.empty(1, device="cuda")  # create the context first: it is not what is timed


def us(samples):
    return f"{statistics.median(samples) * 1e6:.1f} us"


print(f"{'bytes':>13} {'empty(): cudaMalloc':>20} {'empty_cache(): cudaFree':>24} "
      f"{'empty()+del, cached':>20}")
for size in [512, 1 << 20, 20 << 20, 256 << 20, 1 << 30]:
    malloc, free, cached = [], [], []
    for _ in range(50):
        torch.cuda.empty_cache()  # nothing cached: the next empty() asks the driver
        t0 = time.perf_counter()
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        t1 = time.perf_counter()
        del x  # back to the cache...
        t2 = time.perf_counter()
        torch.cuda.empty_cache()  # ...and from the cache to the driver
        malloc.append(t1 - t0)
        free.append(time.perf_counter() - t2)
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    del x  # one segment of this size, now cached
    for _ in range(50):
        t0 = time.perf_counter()
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        del x
        cached.append(time.perf_counter() - t0)
    print(f"{size:>13,} {us(malloc):>20} {us(free):>24} {us(cached):>20}")
