# Nothing touches the GPU until the first real use, which pays for the CUDA context;
# the first matrix multiply also pays for loading cuBLAS. Memory is not lazy.
import time

import torch


def timed(label, f, sync=True):
    start = time.perf_counter()
    result = f()
    if sync:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3
    print(f"{label:45} {ms:10.3f} ms   CUDA initialised: {torch.cuda.is_initialized()}")
    return result


timed('torch.device("cuda:0")', lambda: torch.device("cuda:0"), sync=False)
timed("torch.cuda.device_count()", torch.cuda.device_count, sync=False)
x = timed('first torch.randn(1000, 1000, device="cuda")',
          lambda: torch.randn(1000, 1000, device="cuda"))
print(f"  memory_allocated() right after it: {torch.cuda.memory_allocated():,} bytes")
timed('second torch.randn(1000, 1000, device="cuda")',
      lambda: torch.randn(1000, 1000, device="cuda"))
timed("first x @ x", lambda: x @ x)
timed("second x @ x", lambda: x @ x)

free, total = torch.cuda.mem_get_info()
print(f"the driver counts {(total - free) / 2**20:.0f} MiB in use on the device; "
      f"PyTorch has reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB of it")
