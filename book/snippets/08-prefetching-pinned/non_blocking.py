# A 64 MiB copy to the GPU with non_blocking=True, queued behind about 50 ms of matrix
# products: when does the call return, and when is the copy done?
import time

import torch

a = torch.randn(8192, 8192, device="cuda")
pageable = torch.randn(16 << 20)  # 64 MiB of float32
pinned = pageable.pin_memory()
a @ a, pinned.to("cuda"), pageable.to("cuda")  # warm-up: kernels, device blocks
torch.cuda.synchronize()


# ANCHOR: non_blocking
def copy_behind_work(src):
    torch.cuda.synchronize()
    for _ in range(3):
        a @ a  # device work queued ahead of the copy
    t = time.perf_counter()
    dst = src.to("cuda", non_blocking=True)
    returned = time.perf_counter() - t
    torch.cuda.synchronize()
    done = time.perf_counter() - t
    return returned * 1e3, done * 1e3


for name, src in [("pinned", pinned), ("pageable", pageable)]:
    returned, done = copy_behind_work(src)
    print(f"{name:8} call returned after {returned:8.3f} ms, copy done after {done:8.3f} ms")
# ANCHOR_END: non_blocking
