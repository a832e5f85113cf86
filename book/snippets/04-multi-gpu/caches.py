# One caching allocator per GPU: a tensor of a different size on each device, each
# device's own statistics, then torch.cuda.empty_cache() called with cuda:0 current.
import torch

MiB = 2**20
n = torch.cuda.device_count()


def show(when):
    for i in range(n):
        print(f"{when:26} cuda:{i} allocated {torch.cuda.memory_allocated(i) / MiB:7.2f}"
              f" MiB, reserved {torch.cuda.memory_reserved(i) / MiB:7.2f} MiB")


tensors = [torch.empty((i + 1) * 64 * MiB, dtype=torch.uint8, device=f"cuda:{i}")
           for i in range(n)]
show("a tensor on each:")
del tensors
show("freed:")
with torch.cuda.device(0):
    torch.cuda.empty_cache()
show("empty_cache() on cuda:0:")
