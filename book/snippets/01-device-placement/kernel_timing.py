# One matrix multiply timed three ways: the host clock alone (wrong), the host clock
# around a synchronize, and CUDA events recorded on the stream.
import time

import torch

a = torch.randn(8192, 8192, device="cuda")
for _ in range(3):
    a @ a  # warm-up: cuBLAS loaded, its kernel chosen
torch.cuda.synchronize()

t0 = time.perf_counter()
c = a @ a
t1 = time.perf_counter()  # the launch has returned; the multiply has not run yet
torch.cuda.synchronize()
t2 = time.perf_counter()

start = torch.cuda.Event(enable_timing=True)
end = torch.cuda.Event(enable_timing=True)
start.record()
c = a @ a
end.record()
end.synchronize()

print(f"host clock, no synchronize (wrong)   {(t1 - t0) * 1e3:9.3f} ms")
print(f"host clock around a synchronize      {(t2 - t0) * 1e3:9.3f} ms")
print(f"CUDA events recorded on the stream   {start.elapsed_time(end):9.3f} ms")
