# Copy bandwidth between host memory and the GPU, from pageable and from pinned
# memory, 1 GiB each way, timed with CUDA events (median of five copies).
import torch

n = 1 << 28  # 1 GiB of float32
pageable = torch.randn(n)
pinned = pageable.pin_memory()
dev = torch.empty(n, device="cuda")


# ANCHOR: bandwidth
def gbps(dst, src, reps=5):
    times = []
    for _ in range(reps + 1):  # the first copy is a warm-up
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = sorted(times[1:])[reps // 2]
    return n * 4 / (ms / 1e3) / 1e9


print("1 GiB copies, GB/s   pageable   pinned")
print(f"host -> device       {gbps(dev, pageable):8.1f} {gbps(dev, pinned):8.1f}")
print(f"device -> host       {gbps(pageable, dev):8.1f} {gbps(pinned, dev):8.1f}")
# ANCHOR_END: bandwidth
