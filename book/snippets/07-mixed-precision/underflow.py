# Why float16 needs a gradient scaler: weight-gradient elements that are non-zero in
# float32 but exactly zero under autocast float16, for a loss multiplied by 2^-k,
# without a scaler and with GradScaler (its default scale, 65536).
import copy
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 128, device="cuda")
y = (x @ torch.randn(128, 16, device="cuda")).argmax(1)
model = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                      nn.Linear(128, 16)).cuda()


def grads(factor, dtype=None, scaler=None):
    m = copy.deepcopy(model)
    with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
        loss = nn.functional.cross_entropy(m(x), y) * factor
    (scaler.scale(loss) if scaler else loss).backward()
    if scaler:
        scaler.unscale_(torch.optim.SGD(m.parameters(), lr=0.0))
    return torch.cat([p.grad.flatten() for p in m.parameters()])


print(f"{'loss x':8} {'non-zero f32':>12} {'zero f16':>9} {'zero f16+scaler':>16}")
for k in [0, 8, 16, 24]:
    ref = grads(2.0**-k)
    plain = grads(2.0**-k, torch.float16)
    scaled = grads(2.0**-k, torch.float16, torch.amp.GradScaler("cuda"))
    live = ref != 0
    print(f"2^-{k:<5} {int(live.sum()):12} {int((plain[live] == 0).sum()):9} "
          f"{int((scaled[live] == 0).sum()):16}")
