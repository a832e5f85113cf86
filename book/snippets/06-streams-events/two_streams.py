# Independent work on one stream or on two: two matrix products, then a product and a
# 1 GiB copy from pinned memory. Host clock around synchronized work, best of three.
import time

import torch

a = torch.randn(8192, 8192, device="cuda")
host = torch.empty(1 << 28, pin_memory=True)  # 1 GiB of float32, pinned
dev = torch.empty(1 << 28, device="cuda")
side = torch.cuda.Stream()
a @ a
torch.cuda.synchronize()


# ANCHOR: overlap
def run(second, copy):
    """A product on the current stream, then a product or a copy on `second`."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    a @ a
    with torch.cuda.stream(second):
        if copy:
            dev.copy_(host, non_blocking=True)  # runs on a copy engine
        else:
            a @ a  # runs on the multiprocessors, like the first
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3


main = torch.cuda.current_stream()
for name, copy in [("two matrix products", False), ("a product and a 1 GiB copy", True)]:
    one = min(run(main, copy) for _ in range(3))
    two = min(run(side, copy) for _ in range(3))
    print(f"{name:27} one stream {one:7.2f} ms   two streams {two:7.2f} ms")
# ANCHOR_END: overlap
