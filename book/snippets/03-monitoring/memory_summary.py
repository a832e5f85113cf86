# memory_summary() after three steps of a small MLP trained with Adam.
import torch
from torch import nn

torch.manual_seed(0)
layers = [nn.Linear(2048, 2048, bias=False) for _ in range(4)]      # 16 MiB each
model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(),
                      layers[2], nn.ReLU(), layers[3]).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(1024, 2048, device="cuda")                         # 8 MiB
for step in range(3):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()

print(torch.cuda.memory_summary(abbreviated=True))
