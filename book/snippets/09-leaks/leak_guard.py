# A loop that keeps its losses in a list, checked the way lab 9's leak guard works: the
# blocks allocated after a baseline and still alive, each with the op (innermost Python
# frame) and the line of this program that made it, from the memory history's stacks.
import collections
import os

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1)).cuda()
with torch.no_grad():
    model(torch.randn(64, 256, device="cuda"))     # cuBLAS takes its workspace here
torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")


def live_blocks():
    snap = torch.cuda.memory._snapshot()
    return {b["address"]: b for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated"}


# ANCHOR: planted
baseline = set(live_blocks())
losses = []
for step in range(3):
    x = torch.randn(64, 256, device="cuda")
    loss = model(x).square().mean()
    losses.append(loss)                            # the leak
del x, loss
leaked = [b for addr, b in live_blocks().items() if addr not in baseline]
# ANCHOR_END: planted
me = os.path.basename(__file__)
print(f"{len(leaked)} blocks, {sum(b['size'] for b in leaked) / 1024:.1f} KiB, "
      "outlived their iteration")
where = collections.Counter()
for b in leaked:
    frames = b.get("frames") or []
    op = f"{os.path.basename(frames[0]['filename'])} {frames[0]['name']}" if frames else "?"
    at = next((f"{me}:{f['line']}" for f in frames
               if os.path.basename(f["filename"]) == me), "?")
    where[(b["size"] / 1024, op, at)] += 1
for (kib, op, at), n in sorted(where.items()):
    print(f"  {n} x {kib:6.1f} KiB   op {op:22} at {at}")
torch.cuda.memory._record_memory_history(enabled=None)
