# An evaluation pass with and without torch.no_grad(): its peak above the memory
# allocated before it; then a list of logged losses, with and without detach().
import torch
from torch import nn

MiB = 2**20
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1)).cuda()
with torch.no_grad():
    model(torch.randn(512, 1024, device="cuda"))     # cuBLAS takes its workspace here


# ANCHOR: eval
def eval_pass(no_grad, batches=6):
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    total = 0.0
    with torch.set_grad_enabled(not no_grad):
        for i in range(batches):
            x = torch.randn(512, 1024, device="cuda")
            total += model(x).mean().item()
    return (torch.cuda.max_memory_allocated() - before) / MiB
# ANCHOR_END: eval


def logged(detach, batches=6):
    before, losses = torch.cuda.memory_allocated(), []
    for i in range(batches):
        loss = model(torch.randn(512, 1024, device="cuda")).mean()
        losses.append(loss.detach() if detach else loss)
    return (torch.cuda.memory_allocated() - before) / MiB


print(f"evaluation peak above the start, without no_grad: {eval_pass(False):8.2f} MiB")
print(f"evaluation peak above the start, with no_grad:    {eval_pass(True):8.2f} MiB")
print(f"6 logged losses, losses.append(loss):             {logged(False):8.2f} MiB")
print(f"6 logged losses, losses.append(loss.detach()):    {logged(True):8.2f} MiB")
