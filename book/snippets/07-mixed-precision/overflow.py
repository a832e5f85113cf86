# A forced overflow: float16 training with a GradScaler, the third step's loss
# multiplied by 1e10. The scaler finds the infinity, skips that step and halves the scale.
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(32, 128, device="cuda")
y = (x @ torch.randn(128, 16, device="cuda")).argmax(1)
model = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 16)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
print(f"{'step':>4} {'loss x':>7} {'scale':>7} {'params changed':>15} {'scale after':>12}")
for i in range(1, 6):
    factor = 1e10 if i == 3 else 1.0
    before = model[0].weight.detach().clone()
    scale = scaler.get_scale()
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y) * factor
    scaler.scale(loss).backward()
    scaler.step(opt)  # skipped when the unscaled gradients hold an inf or a NaN
    scaler.update()
    changed = not torch.equal(before, model[0].weight)
    print(f"{i:4} {factor:7.0e} {scale:7.0f} {str(changed):>15} {scaler.get_scale():12.0f}")
