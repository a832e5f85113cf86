# memory_allocated() counts the blocks tensors hold; memory_reserved() adds the cache.
# The driver counts everything reserved as taken by this process.
import torch

MiB = 2**20
free_at_start, _ = torch.cuda.mem_get_info()  # after the context, before any tensor


def show(step):
    free, _ = torch.cuda.mem_get_info()
    print(f"{step:26} allocated {torch.cuda.memory_allocated():>6,} B  "
          f"reserved {torch.cuda.memory_reserved() / MiB:4.1f} MiB  "
          f"taken from the driver {(free_at_start - free) / MiB:4.1f} MiB")


show("start")
x = torch.empty(1000, dtype=torch.uint8, device="cuda")
show("x = 1,000 bytes")
y = torch.empty(4000, dtype=torch.uint8, device="cuda")
show("y = 4,000 bytes")
del x, y
show("del x, y")
torch.cuda.empty_cache()
show("torch.cuda.empty_cache()")
