# What a request really takes: a block rounded up to a multiple of 512 bytes, in a
# 2 MiB segment (small pool), a 20 MiB segment, or a segment of its own. Each request
# runs alone after empty_cache(), so reserved is the segment it caused.
import torch

print(f"{'requested':>12} {'allocated':>12} {'reserved':>12}  pool")
for size in [1, 1000, 4096, 1 << 20, (1 << 20) + 1, 3 << 20, 12 << 20, 100_000_000]:
    torch.cuda.empty_cache()
    x = torch.empty(size, dtype=torch.uint8, device="cuda")
    s = torch.cuda.memory_stats()
    pool = "small" if s["allocated_bytes.small_pool.current"] else "large"
    print(f"{s['requested_bytes.all.current']:>12,} {s['allocated_bytes.all.current']:>12,} "
          f"{s['reserved_bytes.all.current']:>12,}  {pool}")
    del x
