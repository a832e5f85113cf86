# A block used on a side stream (record_stream) and freed while that stream is still
# busy; then a request that only the block's place can serve, under a 256 MiB memory
# fraction. Prints what the request got and the allocator's counters around it.
import time

import torch

MiB = 2**20
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(256 * MiB / total)
side = torch.cuda.Stream()
a = torch.randn(2048, 2048, device="cuda")
x = torch.empty(160 * MiB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
# ANCHOR: pending
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(1000):
        b = a @ a  # the side stream is busy...
    x.zero_()      # ...then writes x
x.record_stream(side)
del x  # pending until the side stream reaches this point
before = torch.cuda.memory_stats()
start = time.perf_counter()
try:
    y = torch.empty(160 * MiB, dtype=torch.uint8, device="cuda")
    result = "served"
except torch.cuda.OutOfMemoryError as e:
    result = f"out of memory: {e}"
took = (time.perf_counter() - start) * 1e3
after = torch.cuda.memory_stats()
# ANCHOR_END: pending
print(f"the request: {result} ({took:.1f} ms)")
for key in ["num_alloc_retries", "num_ooms", "num_device_free", "num_device_alloc"]:
    print(f"{key}: +{after.get(key, 0) - before.get(key, 0)}")
torch.cuda.synchronize()
