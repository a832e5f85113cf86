# Where the memory goes under AMP: the bytes of the parameters, their gradients and
# Adam's state (all float32 whatever the autocast dtype), and the peak of a step above
# them: activations and temporaries, the part autocast makes 16-bit.
import torch
from torch import nn

MiB = 2**20
x = torch.randn(256, 4096, device="cuda")
y = (x @ torch.randn(4096, 16, device="cuda")).argmax(1)
print(f"{'precision':20} {'params':>8} {'grads':>8} {'adam':>8} {'peak - those':>13}")
for name, dtype in [("float32", None), ("autocast bfloat16", torch.bfloat16)]:
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(4096, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for i in range(2):
        if i == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=False)  # keep the gradients, to count them
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts) / MiB
    params = size(model.parameters())
    grads = size(p.grad for p in model.parameters())
    adam = size(t for s in opt.state.values() for t in s.values() if t.dim() > 0)
    above = torch.cuda.max_memory_allocated() / MiB - params - grads - adam
    print(f"{name:20} {params:8.2f} {grads:8.2f} {adam:8.2f} {above:13.2f}")
    print(f"{'':20} dtypes: params {next(model.parameters()).dtype}, "
          f"grads {next(model.parameters()).grad.dtype}")
    del model, opt, layers
