"""PyTorch's own figures for what the labs measure, taken on the same machine in the same
session as the GPU bundle, so that the comparison is side by side:

  python3 ci/pytorch-reference.py            # prints one JSON object

host<->device bandwidth (pinned and pageable, 1 GiB, median of 5) and the caching
allocator's alloc+free pair, from Python (torch.cuda.caching_allocator_alloc/delete,
which includes the interpreter's overhead) and from C++
(c10::cuda::CUDACachingAllocator::raw_alloc/raw_delete in a loop compiled at run time
with torch.utils.cpp_extension, the path the labs' own pair compares with; skipped with
a note when no compiler is found); and matrix-product throughput, the twin of
labs/core/benches/gemm.rs (`bench-gemm --json` in the bundle): TFLOP/s of one 8192^3
`a @ b` in bfloat16 and in float32 with TF32 off, median of 10 after 3 warm-up runs,
each timed by CUDA events; elementwise bandwidth, the twin of
labs/core/benches/elementwise.rs (`bench-elementwise --json`): GB/s (bytes read plus
written) of `torch.add(a, b, out=c)` on two 1 GiB float32 tensors and of `c.copy_(a)`,
median of 10 after 3 warm-up runs, CUDA events, and the ratio add/copy; and a small
training step, the twin of labs/core/benches/
train_step.rs: forward, backward and an Adam step of an MLP and of one
TransformerEncoderLayer in float32, median milliseconds per step (CUDA events) and the
step's peak allocated memory."""

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


CPP_PAIR = r"""
#include <chrono>
#include <algorithm>
#include <vector>
#include <c10/cuda/CUDACachingAllocator.h>

// Median nanoseconds of one raw_alloc + raw_delete pair of `size` bytes, in batches.
double pair_ns(int64_t size, int64_t batches, int64_t batch) {
  using clock = std::chrono::steady_clock;
  namespace cca = c10::cuda::CUDACachingAllocator;
  for (int i = 0; i < 10000; ++i) cca::raw_delete(cca::raw_alloc(size));
  std::vector<double> samples;
  for (int64_t b = 0; b < batches; ++b) {
    auto t = clock::now();
    for (int64_t i = 0; i < batch; ++i) cca::raw_delete(cca::raw_alloc(size));
    samples.push_back(std::chrono::duration<double, std::nano>(clock::now() - t).count() / batch);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}
"""


def cpp_pairs():
    try:
        from torch.utils.cpp_extension import load_inline
        ext = load_inline("pair_bench", cpp_sources=CPP_PAIR, functions=["pair_ns"],
                          with_cuda=True, extra_cflags=["-O2"], verbose=False)
    except Exception as e:  # no compiler, no headers: say so rather than fail the run
        return {"error": str(e).splitlines()[0][:200]}
    return {str(s): ext.pair_ns(s, 101, 2000) for s in (512, 1 << 20, 20 << 20)}


def gemm(n=8192, warmup=3, runs=10):
    """Median milliseconds and TFLOP/s of `a @ b` for n x n x n products, as the bench
    times ours: one product between two CUDA events, the output's allocation included."""
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {"n": n, "warmup": warmup, "runs": runs, "timing": "CUDA events"}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        times = []
        for i in range(warmup + runs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            c = a @ b
            end.record()
            end.synchronize()
            del c
            if i >= warmup:
                times.append(start.elapsed_time(end))
        ms = median(times)
        out[name] = {"median_ms": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12}
        del a, b
    torch.cuda.empty_cache()
    return out


# The training steps the runtime's bench runs too (labs/core/benches/train_step.rs):
# float32, TF32 off, Adam(lr=1e-3), loss = mse_loss(model(x), target).
TRAIN_STEPS = {
    "mlp": {"batch": 512, "in": 1024, "hidden": 4096, "out": 1024},
    "encoder_layer": {"batch": 16, "seq": 128, "d_model": 512, "nhead": 8,
                      "dim_feedforward": 2048, "dropout": 0.1},
}


def train_step(warmup=10, runs=50):
    """Median milliseconds of one training step (zero_grad, forward, loss, backward,
    optimizer step) between two CUDA events, and the peak memory allocated during a
    step once the optimizer state exists (PyTorch's max_memory_allocated, less what the
    script held before building the model)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    out = {}
    for name, cfg in TRAIN_STEPS.items():
        # What this script holds already (the bandwidth buffers) is not the step's.
        base = torch.cuda.memory_allocated()
        if name == "mlp":
            model = torch.nn.Sequential(
                torch.nn.Linear(cfg["in"], cfg["hidden"]),
                torch.nn.ReLU(),
                torch.nn.Linear(cfg["hidden"], cfg["out"]),
            ).cuda()
            x = torch.randn(cfg["batch"], cfg["in"], device="cuda")
            target = torch.randn(cfg["batch"], cfg["out"], device="cuda")
        else:
            model = torch.nn.TransformerEncoderLayer(
                cfg["d_model"], cfg["nhead"], dim_feedforward=cfg["dim_feedforward"],
                dropout=cfg["dropout"], batch_first=True,
            ).cuda()
            x = torch.randn(cfg["batch"], cfg["seq"], cfg["d_model"], device="cuda")
            target = torch.randn_like(x)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        times, peak = [], 0
        for i in range(warmup + runs):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
                peak = max(peak, torch.cuda.max_memory_allocated() - base)
        out[name] = dict(cfg, median_ms=median(times), peak_allocated_bytes=peak,
                         warmup=warmup, runs=runs,
                         parameters=sum(p.numel() for p in model.parameters()))
        del model, opt, x, target, loss
        torch.cuda.empty_cache()
    return out


def elementwise(size=1 << 30, warmup=3, runs=10):
    """Median milliseconds and GB/s (bytes read + written) of an out-of-place float32 add
    of two `size`-byte tensors (3 x size moved) and of a device copy (2 x size), as the
    bench times ours: one operation between two CUDA events."""
    n = size // 4
    a = torch.full((n,), 1.0, device="cuda")
    b = torch.full((n,), 2.0, device="cuda")
    c = torch.empty(n, device="cuda")

    def timed(work):
        times = []
        for i in range(warmup + runs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
        return median(times)

    add_ms = timed(lambda: torch.add(a, b, out=c))
    copy_ms = timed(lambda: c.copy_(a))
    add_gbps = 3 * size / (add_ms * 1e-3) / 1e9
    copy_gbps = 2 * size / (copy_ms * 1e-3) / 1e9
    del a, b, c
    torch.cuda.empty_cache()
    return {
        "bytes_per_tensor": size, "dtype": "float32", "warmup": warmup, "runs": runs,
        "timing": "CUDA events",
        "add": {"median_ms": add_ms, "gbps": add_gbps, "bytes_moved": 3 * size},
        "copy": {"median_ms": copy_ms, "gbps": copy_gbps, "bytes_moved": 2 * size},
        "add_over_copy": add_gbps / copy_gbps,
    }


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
        "cpp_alloc_free_pair_ns": cpp_pairs(),
        "gemm": gemm(),
        "elementwise": elementwise(),
        "train_step": train_step(),
    }))


if __name__ == "__main__":
    main()
