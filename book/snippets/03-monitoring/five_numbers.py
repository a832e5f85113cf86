# Requested, allocated and reserved memory, and the peak, after each line.
import torch


def row(label):
    requested = torch.cuda.memory_stats()["requested_bytes.all.current"]
    print(f"{label:28} {requested:>12,} {torch.cuda.memory_allocated():>12,}"
          f" {torch.cuda.memory_reserved():>12,} {torch.cuda.max_memory_allocated():>12,}")


print(f"{'after':28} {'requested':>12} {'allocated':>12} {'reserved':>12} {'max alloc.':>12}")
x = torch.empty(1000, device="cuda")          # 4,000 bytes: the small pool
row("x: 1,000 floats")
y = torch.empty(750_000, device="cuda")       # 3,000,000 bytes: the large pool
row("y: 750,000 floats")
t = y * 2                                     # a temporary as large as y
del t
row("t = y * 2; del t")
torch.cuda.reset_peak_memory_stats()
row("reset_peak_memory_stats()")
del x, y
row("del x, y")
torch.cuda.empty_cache()
row("empty_cache()")
