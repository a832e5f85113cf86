# A scoped pool: torch.cuda.MemPool and use_mem_pool route one region's allocations to
# a pool of their own, whose memory no allocation outside the scope can take.
import gc

import torch

MiB = 2**20


def reserved(pool_id):
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) == tuple(pool_id)) / MiB


def show(label, pool_id):
    print(f"{label:32} pool {reserved(pool_id):6.1f} MiB   default {reserved((0, 0)):6.1f} MiB")


pool = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(pool):
    inside = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
show("64 MiB made in the pool's scope", pool.id)
outside = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
show("64 MiB made outside it", pool.id)
del inside
again = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
show("pool's tensor freed, 64 MiB again", pool.id)   # outside the scope: not the pool's
pool_id = pool.id
del pool
gc.collect()
torch.cuda.empty_cache()
show("pool dropped, empty_cache", pool_id)
