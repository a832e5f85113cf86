# Attention's memory: one forward and backward of scaled_dot_product_attention, causal,
# with dropout 0.1, at GPT-2 small's size (batch 8, 12 heads, 1024 positions, head
# size 64), under PyTorch's own choice of kernel and under sdpa_kernel(SDPBackend.MATH):
# what the forward leaves allocated (output and saved tensors), the peak, the time.
import contextlib, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MiB = 2**20
backends = {"default": contextlib.nullcontext, "MATH": lambda: sdpa_kernel(SDPBackend.MATH)}
for dtype in (torch.float32, torch.bfloat16):
    q, k, v = (torch.randn(8, 12, 1024, 64, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    for name, backend in backends.items():
        for run in range(2):  # the first run warms up
            q.grad = k.grad = v.grad = None
            torch.cuda.synchronize(), torch.cuda.reset_peak_memory_stats()
            before, t = torch.cuda.memory_allocated(), time.perf_counter()
            with backend():
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            kept = torch.cuda.memory_allocated() - before
            out.sum().backward()
            del out
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
        peak = torch.cuda.max_memory_allocated() - before
        print(f"{str(dtype):15} {name:8} forward keeps {kept / MiB:7.1f} MiB  "
              f"peak {peak / MiB:7.1f} MiB  {ms:6.2f} ms")
