# A small MLP trained with Adam: allocated, reserved and peak memory after every phase.
import torch
from torch import nn

MiB = 2**20
torch.manual_seed(0)
layers = [nn.Linear(2048, 2048, bias=False) for _ in range(4)]      # 16 MiB each
model = nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(),
                      layers[2], nn.ReLU(), layers[3]).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(1024, 2048, device="cuda")                         # 8 MiB


def read(step, phase):
    print(f"{step:>4}  {phase:20} {torch.cuda.memory_allocated() / MiB:10.2f}"
          f" {torch.cuda.memory_reserved() / MiB:10.2f}"
          f" {torch.cuda.max_memory_allocated() / MiB:10.2f}")


print(f"{'step':>4}  {'after':20} {'allocated':>10} {'reserved':>10} {'max alloc.':>10}  (MiB)")
read(0, "model and input")
for step in range(1, 4):
    loss = model(x).square().mean()
    read(step, "forward")
    loss.backward()
    read(step, "backward")
    opt.step()
    opt.zero_grad()                      # set_to_none: the gradients are freed
    read(step, "optimizer step")
del model, layers, opt, loss, x
read("", "everything dropped")
torch.cuda.empty_cache()
read("", "empty_cache()")
