# Tensor-core throughput: one 8192 x 8192 x 8192 product in float32, float32 with TF32
# allowed, float16 and bfloat16; the median of 10 runs timed with CUDA events.
import torch

n = 8192
a32, b32 = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
print(f"{'dtype':24} {'ms':>8} {'TFLOP/s':>9}")
for name, dtype, tf32 in [("float32", torch.float32, False),
                          ("float32, TF32 allowed", torch.float32, True),
                          ("float16", torch.float16, False),
                          ("bfloat16", torch.bfloat16, False)]:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a, b = a32.to(dtype), b32.to(dtype)
    a @ b  # warm-up: cuBLAS picks its kernel
    times = []
    for _ in range(10):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = sorted(times)[5]
    print(f"{name:24} {ms:8.3f} {2 * n**3 / (ms / 1e3) / 1e12:9.1f}")
torch.backends.cuda.matmul.allow_tf32 = False
