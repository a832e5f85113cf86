# The caching allocator at work: a freed tensor's block is kept, and the next tensor
# that fits gets it back without a call to the driver.
import time

import torch


def cuda_mallocs():
    return torch.cuda.memory_stats()["num_device_alloc"]  # driver allocations so far


x = torch.empty(1000, 1000, device="cuda")
first = x.data_ptr()
calls = "cudaMalloc calls:"
print(f"x = torch.empty(1000, 1000)    address {first:#x}  {calls} {cuda_mallocs()}")
del x
y = torch.empty(1000, 1000, device="cuda")
print(f"del x; y = the same shape      address {y.data_ptr():#x}  {calls} {cuda_mallocs()}")
print(f"y got x's block: {y.data_ptr() == first}")
del y

start = time.perf_counter()
for _ in range(1000):
    z = torch.empty(1000, 1000, device="cuda")
    del z
pair = (time.perf_counter() - start) / 1000
print(f"1000 more torch.empty + del: {pair * 1e6:.1f} us a pair, {calls} {cuda_mallocs()}")
