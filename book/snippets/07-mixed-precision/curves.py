# Loss curves in three precisions: the same MLP (1024 wide, 2 hidden layers), initial
# weights and 8 batches of 256, Adam lr 1e-3, 300 steps each; the loss every 50 steps
# and the mean of the last 30 steps relative to float32's.
import torch
from torch import nn

data = []
torch.manual_seed(0)
teacher = torch.randn(1024, 16, device="cuda")
for _ in range(8):
    x = torch.randn(256, 1024, device="cuda")
    data.append((x, (x @ teacher).argmax(1)))
curves = {}
for name, dtype in [("float32", None), ("bfloat16", torch.bfloat16), ("float16", torch.float16)]:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 16)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    losses = []
    for i in range(300):
        x, y = data[i % 8]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    curves[name] = losses
print("step " + "".join(f"{n:>10}" for n in curves))
for i in list(range(0, 300, 50)) + [299]:
    print(f"{i + 1:4} " + "".join(f"{c[i]:10.4f}" for c in curves.values()))
tail = {n: sum(c[-30:]) / 30 for n, c in curves.items()}
print("gap to float32 over the last 30 steps: " + ", ".join(
    f"{n} {abs(t - tail['float32']) / tail['float32']:.2%}" for n, t in tail.items()))
