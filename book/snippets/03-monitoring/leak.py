# The classic leak: losses kept in a list, with their graphs. What each way of
# keeping them costs in device memory, per step.
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1)).cuda()
x = torch.randn(256, 1024, device="cuda")        # the hidden activation is 4 MiB
with torch.no_grad():
    model(x)                                     # cuBLAS takes its workspace here


def evaluate(keep, steps=5):
    """Forward passes without torch.no_grad(), keeping keep(loss) from each."""
    kept = []
    start = torch.cuda.memory_allocated()
    for step in range(steps):
        loss = model(x).square().mean()
        kept.append(keep(loss))
    del loss
    return (torch.cuda.memory_allocated() - start) / steps


for name, keep in [("loss", lambda loss: loss),
                   ("loss.detach()", lambda loss: loss.detach()),
                   ("loss.item()", lambda loss: loss.item())]:
    print(f"kept.append({name + ')':15} {evaluate(keep):>12,.0f} bytes more per step")
loss = model(x).square().mean()
print(f"loss.detach() shares loss's memory: {loss.detach().data_ptr() == loss.data_ptr()}")
with torch.no_grad():
    print(f"under torch.no_grad(), kept.append(loss): "
          f"{evaluate(lambda loss: loss):,.0f} bytes more per step")
