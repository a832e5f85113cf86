# Launch overhead: 100 small kernels launched one by one, then captured once as a CUDA
# graph and replayed. The host's time per run (synchronised), median of 50 runs.
import statistics
import time

import torch

x = torch.zeros(1024, device="cuda")
y = torch.ones(1024, device="cuda")


def work():
    for _ in range(100):
        x.add_(y, alpha=1e-3)        # one tiny kernel: ~1 µs of GPU work


def median_us(run, repeats=50):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


work()                               # warm-up: the kernel is loaded once
torch.cuda.synchronize()
eager = median_us(work)

graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):        # records the 100 launches; runs none of them
    work()
replayed = median_us(graph.replay)   # one launch of the whole graph

print(f"100 kernels launched one by one: {eager:8.1f} µs")
print(f"the same 100 replayed as a graph: {replayed:8.1f} µs  ({eager / replayed:.1f}x)")
# 1 warm-up + 50 eager runs + 50 replays, each adding 100 x 1e-3: the replays did the work.
print(f"x[0] = {x[0].item():.3f} (101 runs of +0.1 give 10.100)")
