# The memory a graph keeps: a region of elementwise ops on a 16 MiB tensor, run eagerly,
# then captured. The capture's allocations come from the graph's private pool, which
# stays reserved for the graph until the graph is gone.
import torch

MiB = 2**20
x = torch.ones(4 * 2**20, device="cuda")      # 16 MiB


def region(t):
    for _ in range(8):
        t = t * 0.5 + 1.0                     # two new tensors per line, one freed
    return t


def pools():
    """Reserved MiB per pool, from the snapshot: (0, 0) is the default pool."""
    out = {}
    for s in torch.cuda.memory_snapshot():
        pool = tuple(s.get("segment_pool_id", (0, 0)))
        out[pool] = out.get(pool, 0) + s["total_size"] / MiB
    return ", ".join(f"{k}: {v:.0f}" for k, v in sorted(out.items()))


def show(label):
    torch.cuda.synchronize()
    print(f"{label:34} allocated {torch.cuda.memory_allocated() / MiB:6.1f} MiB"
          f"   reserved {torch.cuda.memory_reserved() / MiB:6.1f} MiB   by pool {pools() or '-'}")


region(x)                                     # warm-up
torch.cuda.empty_cache()
show("start")
out = region(x)
show("eager, output held")
del out
show("eager, output dropped")

graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out = region(x)
show("captured, output held")
graph.replay()
show("replayed")
del out
show("captured, output dropped")
torch.cuda.empty_cache()
show("empty_cache, graph alive")
del graph
torch.cuda.empty_cache()
show("graph dropped, empty_cache")
