# A few of memory_stats()'s keys, before and after empty_cache.
import torch

KEYS = [
    "allocated_bytes.all.current", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "requested_bytes.all.current",
    "reserved_bytes.small_pool.current", "reserved_bytes.large_pool.current",
    "active_bytes.all.current", "inactive_split_bytes.all.current",
    "allocation.all.current", "segment.all.current",
    "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
]

x = torch.empty(1000, device="cuda")                          # small pool
y = torch.empty(8 * 2**20, dtype=torch.uint8, device="cuda")  # 8 MiB, large pool
del x
before = torch.cuda.memory_stats()
torch.cuda.empty_cache()
after = torch.cuda.memory_stats()

print(f"{'key':36} {'before':>12} {'after empty_cache':>18}")
for key in KEYS:
    print(f"{key:36} {before[key]:>12,} {after[key]:>18,}")
print(f"({len(after)} keys in all)")
