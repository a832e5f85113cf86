# A training loop's running loss kept three ways: the loss tensor with no backward, the
# loss tensor after backward, and loss.item(). Device memory after each iteration, and
# the autograd nodes the running total keeps reachable.
import torch
from torch import nn

MiB = 2**20
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
with torch.no_grad():
    model(torch.randn(512, 1024, device="cuda"))     # cuBLAS takes its workspace here


def graph_nodes(t):
    """The nodes reachable from t.grad_fn, through next_functions."""
    seen, stack = set(), [getattr(t, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(fn for fn, _ in node.next_functions)
    return len(seen)


# ANCHOR: loop
def train(keep_item, backward, iterations=6):
    start, grew, total = torch.cuda.memory_allocated(), [], 0.0
    for i in range(iterations):
        x = torch.randn(512, 1024, device="cuda")
        loss = model(x).mean()
        total = total + (loss.item() if keep_item else loss)
        if backward:
            loss.backward()
            opt.step()
            opt.zero_grad()
        del x, loss
        grew.append((torch.cuda.memory_allocated() - start) / MiB)
    return grew, graph_nodes(total)
# ANCHOR_END: loop


print("MiB allocated above the start, after each of 6 iterations")
for name, item, backward in [("total += loss, no backward", False, False),
                             ("total += loss, backward", False, True),
                             ("total += loss.item(), backward", True, True)]:
    grew, nodes = train(item, backward)
    print(f"{name:31}" + "".join(f"{g:7.2f}" for g in grew) + f"   graph nodes: {nodes}")
