# Ten matrix products timed three ways: a host clock alone, a host clock after a
# synchronize, and CUDA events. Then what an event's query() says before and after.
import time

import torch

a = torch.randn(8192, 8192, device="cuda")
a @ a  # warm-up: cuBLAS picks and loads its kernels on first use
torch.cuda.synchronize()

# ANCHOR: host_clock
t = time.perf_counter()
for _ in range(10):
    c = a @ a
no_sync = time.perf_counter() - t  # the launches only: the products are still queued
torch.cuda.synchronize()

t = time.perf_counter()
for _ in range(10):
    c = a @ a
torch.cuda.synchronize()  # wait for the products before reading the clock
with_sync = time.perf_counter() - t
# ANCHOR_END: host_clock

# ANCHOR: events
start = torch.cuda.Event(enable_timing=True)
end = torch.cuda.Event(enable_timing=True)
start.record()  # markers queued on the current stream
for _ in range(10):
    c = a @ a
end.record()
queried_early = end.query()  # has the stream reached `end` yet?
end.synchronize()  # the host waits here, and only here
# ANCHOR_END: events

print(f"host clock, no synchronize:  {no_sync * 1e3:9.3f} ms")
print(f"host clock + synchronize:    {with_sync * 1e3:9.3f} ms")
print(f"events, elapsed_time:        {start.elapsed_time(end):9.3f} ms")
print(f"end.query() right after record(): {queried_early}")
print(f"end.query() after synchronize():  {end.query()}")
