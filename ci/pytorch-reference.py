"""PyTorch's own figures for what the labs measure, taken on the same machine in the same
session as the GPU bundle, so that the comparison is side by side:

  python3 ci/pytorch-reference.py            # prints one JSON object

host<->device bandwidth (pinned and pageable, 1 GiB, median of 5) and the caching
allocator's alloc+free pair from Python (torch.cuda.caching_allocator_alloc/delete,
which includes the interpreter's overhead; PyTorch's C++ path is faster)."""

import json
import time

import torch


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def bandwidth(host, dev, reps=5):
    up, down = [], []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(host, non_blocking=False)
        torch.cuda.synchronize()
        up.append(time.perf_counter() - t)
        t = time.perf_counter()
        host.copy_(dev, non_blocking=False)
        torch.cuda.synchronize()
        down.append(time.perf_counter() - t)
    n = host.numel() * host.element_size()
    return n / median(up[1:]) / 1e9, n / median(down[1:]) / 1e9


def alloc_pair_ns(size, reps=20000):
    stream = torch.cuda.current_stream()
    for _ in range(1000):
        torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(size, stream=stream))
    samples = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(reps):
            torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(size, stream=stream))
        samples.append((time.perf_counter_ns() - t) / reps)
    return median(samples)


def main():
    size = 1 << 30
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(size, dtype=torch.uint8).pin_memory()
    pageable = torch.empty(size, dtype=torch.uint8)
    pageable.fill_(1)
    pinned.fill_(1)
    p_up, p_down = bandwidth(pinned, dev)
    g_up, g_down = bandwidth(pageable, dev)
    print(json.dumps({
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(),
        "pinned_htod_gbps": p_up,
        "pinned_dtoh_gbps": p_down,
        "pageable_htod_gbps": g_up,
        "pageable_dtoh_gbps": g_down,
        "python_alloc_free_pair_ns": {str(s): alloc_pair_ns(s) for s in (512, 1 << 20, 20 << 20)},
    }))


if __name__ == "__main__":
    main()
