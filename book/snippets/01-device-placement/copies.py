# Copies between host and device, from pageable and from pinned host memory, timed on
# the GPU's own clock with CUDA events (median of 5 after a warm-up copy).
import statistics

import torch


def gb_per_s(dst, src):
    dst.copy_(src)  # warm-up
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(5):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    return src.numel() / statistics.median(ms) / 1e6  # bytes per ms to GB/s


print(f"{'size':>8} {'pageable->GPU':>14} {'pinned->GPU':>12} {'GPU->pageable':>14} "
      f"{'GPU->pinned':>12}   (GB/s)")
for mib in [1, 64, 1024]:
    n = mib << 20
    on_gpu = torch.empty(n, dtype=torch.uint8, device="cuda")
    pageable = torch.ones(n, dtype=torch.uint8)  # ordinary host memory
    pinned = torch.ones(n, dtype=torch.uint8).pin_memory()  # page-locked host memory
    print(f"{mib:>4} MiB {gb_per_s(on_gpu, pageable):14.1f} {gb_per_s(on_gpu, pinned):12.1f} "
          f"{gb_per_s(pageable, on_gpu):14.1f} {gb_per_s(pinned, on_gpu):12.1f}")
