"""PyTorch's side of lab-13 (CUDA graphs and memory pools), measured the way the lab
measures it, on one GPU, printed as the lab's tables (markdown) or one JSON object:

  python3 ci/pytorch-graphs.py [--quick] [--json]

- a chain of small in-place kernels (x += 1e-3 y on 1024 floats) launched one by one,
  and captured once with torch.cuda.graph and replayed (host time, synchronised,
  median of the repeats);
- a region of elementwise ops (y = 0.5 y + 1, repeated) on a tensor: the cache's growth
  when run eagerly, against what the private pool of one graph reserves, of two graphs
  with a pool each, and of two graphs sharing one (pool=g1.pool()), each pool read from
  the memory snapshot's segments of its segment_pool_id;
- what a capture forbids: torch.cuda.synchronize(), .item(), .cpu() inside
  torch.cuda.graph, each in a process of its own, the error each gives, and
  whether a fresh capture works after it in that process;
- a scoped pool (torch.cuda.MemPool with torch.cuda.use_mem_pool): the pool's and the
  default pool's memory after the region inside the scope, the same region outside,
  the pool's output freed, and the pool dropped.

Needs a CUDA GPU; exits with a one-line message without one."""

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

import torch

ELEMENTS = 1024


def chain(x, depth):
    """lab_13::chain: depth dependent elementwise ops, a new tensor each."""
    y = x * 0.5 + 1.0
    for _ in range(1, depth):
        y = y * 0.5 + 1.0
    return y


def median_ms(repeats, run):
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def launches(kernels, repeats):
    x = torch.zeros(ELEMENTS, device="cuda")
    y = torch.ones(ELEMENTS, device="cuda")

    def work():
        for _ in range(kernels):
            x.add_(y, alpha=1e-3)

    work()
    torch.cuda.synchronize()

    def eager():
        work()
        torch.cuda.synchronize()

    eager_ms = median_ms(repeats, eager)
    # ANCHOR: graph_launches
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()

    def replay():
        graph.replay()
        torch.cuda.synchronize()
    # ANCHOR_END: graph_launches

    graph_ms = median_ms(repeats, replay)
    return {"kernels": kernels, "eager_ms": eager_ms, "graph_ms": graph_ms}


def pool_bytes(*pools):
    """(reserved, allocated) of the snapshot's segments in the given pools."""
    ids = {tuple(p) for p in pools}
    segments = [s for s in torch.cuda.memory_snapshot()
                if tuple(s.get("segment_pool_id", (0, 0))) in ids]
    return (sum(s["total_size"] for s in segments),
            sum(s["allocated_size"] for s in segments))


def pools(n, depth):
    x = torch.ones(n, device="cuda")
    chain(x, depth)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    rows = []
    before = torch.cuda.memory_reserved()
    out = chain(x, depth)
    torch.cuda.synchronize()
    rows.append({"run": "eager", "reserved": torch.cuda.memory_reserved() - before,
                 "allocated": out.nbytes})
    del out
    torch.cuda.empty_cache()

    # ANCHOR: graph_pools
    one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        y = chain(x, depth)
    reserved, allocated = pool_bytes(one.pool())
    rows.append({"run": "one graph", "reserved": reserved, "allocated": allocated})

    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        y1 = chain(x, depth)
    with torch.cuda.graph(g2):
        y2 = chain(y1, depth)
    reserved, allocated = pool_bytes(g1.pool(), g2.pool())
    rows.append({"run": "two graphs, a pool each", "reserved": reserved,
                 "allocated": allocated})

    h1, h2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(h1):
        z1 = chain(x, depth)
    with torch.cuda.graph(h2, pool=h1.pool()):
        z2 = chain(z1, depth)
    reserved, allocated = pool_bytes(h1.pool())
    rows.append({"run": "two graphs, one pool", "reserved": reserved,
                 "allocated": allocated})
    # ANCHOR_END: graph_pools
    del y, y1, y2, z1, z2, one, g1, g2, h1, h2
    gc.collect()
    return rows


RULES = [
    ("synchronize the device", lambda y: torch.cuda.synchronize()),
    ("read a value (.item())", lambda y: y.sum().item()),
    ("copy to the host (.cpu())", lambda y: y.cpu()),
]


def rule(index):
    """One forbidden call inside a capture, in a process of its own: the capture's error,
    and whether a fresh capture works afterwards in the same process."""
    x = torch.ones(4096, device="cuda")
    chain(x, 1)
    graph = torch.cuda.CUDAGraph()
    error = "(allowed)"
    try:
        with torch.cuda.graph(graph):
            y = chain(x, 1)
            RULES[index][1](y)
    except Exception as e:  # what the capture raised, whatever its type
        error = str(e).splitlines()[0] if str(e) else type(e).__name__
    recovered = False
    try:
        torch.cuda.synchronize()
        fresh = torch.cuda.CUDAGraph()
        with torch.cuda.graph(fresh):
            y = chain(x, 1)
        fresh.replay()
        recovered = y[0].item() == 1.5
    except Exception:
        recovered = False
    return {"call": RULES[index][0], "error": error, "recovered": recovered}


def rules():
    """Each call of RULES in a fresh process: a failed capture can leave PyTorch's
    allocator believing a capture is still underway (a later empty_cache or MemPool
    release then aborts the process), so one call's failure must not reach the next's."""
    out = []
    for index in range(len(RULES)):
        r = subprocess.run([sys.executable, __file__, "--rule", str(index)],
                           capture_output=True, text=True, timeout=120)
        lines = r.stdout.strip().splitlines()
        if r.returncode == 0 and lines:
            out.append(json.loads(lines[-1]))
        else:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            out.append({"call": RULES[index][0], "error": f"the process died: {last[:80]}",
                        "recovered": False})
    return out


def scoped(n, depth):
    x = torch.ones(n, device="cuda")
    # ANCHOR: mem_pool
    pool = torch.cuda.MemPool()
    points = []

    def figures(what):
        torch.cuda.synchronize()
        p_reserved, p_allocated = pool_bytes(pool.id)
        d_reserved, d_allocated = pool_bytes((0, 0))
        points.append({"point": what, "pool_reserved": p_reserved,
                       "pool_allocated": p_allocated, "default_reserved": d_reserved,
                       "default_allocated": d_allocated})

    with torch.cuda.use_mem_pool(pool):
        inside = chain(x, depth)
    figures("after the region in the pool's scope")
    outside = chain(x, depth)
    figures("after the same region outside it")
    del inside
    figures("the pool's output freed")
    pool_id = pool.id
    del pool
    gc.collect()
    # ANCHOR_END: mem_pool
    torch.cuda.synchronize()
    p_reserved, p_allocated = pool_bytes(pool_id)
    d_reserved, d_allocated = pool_bytes((0, 0))
    points.append({"point": "the pool released", "pool_reserved": p_reserved,
                   "pool_allocated": p_allocated, "default_reserved": d_reserved,
                   "default_allocated": d_allocated})
    del outside
    return points


def mib(b):
    return f"{b / (1 << 20):.2f} MiB"


def tables(r):
    lines = [f"PyTorch {r['torch']} on {r['device']}", "",
             "A chain of small kernels: launched one by one, and replayed as a graph "
             "(host time, synchronised, median)",
             "| kernels | eager | graph | eager / graph |", "| --- | --- | --- | --- |"]
    for x in r["launches"]:
        lines.append(f"| {x['kernels']} | {x['eager_ms'] * 1e3:.1f} µs | "
                     f"{x['graph_ms'] * 1e3:.1f} µs | {x['eager_ms'] / x['graph_ms']:.1f} |")
    lines += ["", f"A region of {r['depth']} elementwise ops on {mib(4 * r['n'])}: what stays "
              "reserved for it, eagerly and in graphs' pools",
              "| run | reserved | allocated (outputs) |", "| --- | --- | --- |"]
    for x in r["pools"]:
        lines.append(f"| {x['run']} | {mib(x['reserved'])} | {mib(x['allocated'])} |")
    lines += ["", "What a capture forbids, and the error it gives",
              "| call in the capture | error | captures again after it |", "| --- | --- | --- |"]
    for x in r["rules"]:
        lines.append(f"| {x['call']} | {x['error']} | {'yes' if x['recovered'] else 'no'} |")
    lines += ["", "A scoped pool: the pool's and the default pool's memory",
              "| point | pool reserved | pool allocated | default reserved | default allocated |",
              "| --- | --- | --- | --- | --- |"]
    for x in r["scoped"]:
        lines.append(f"| {x['point']} | {mib(x['pool_reserved'])} | {mib(x['pool_allocated'])} | "
                     f"{mib(x['default_reserved'])} | {mib(x['default_allocated'])} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, smaller regions")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rule", type=int, help=argparse.SUPPRESS)  # one call of RULES, alone
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pytorch-graphs.py: PyTorch sees no CUDA GPU; this twin measures one")
    if a.rule is not None:
        print(json.dumps(rule(a.rule)))
        return
    repeats = 3 if a.quick else 21
    lengths = [10, 100] if a.quick else [10, 100, 1000]
    n, depth = ((1 << 18), 4) if a.quick else ((1 << 22), 8)
    report = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "n": n,
        "depth": depth,
        "launches": [launches(k, repeats) for k in lengths],
        "pools": pools(n, depth),
        "rules": rules(),
        "scoped": scoped(n, depth),
    }
    print(json.dumps(report) if a.json else tables(report))


if __name__ == "__main__":
    main()
