# Records the allocator's history through three training steps, dumps a snapshot
# and reads it back: what a snapshot holds.
import collections
import os
import pickle
import tempfile

import torch
from torch import nn

torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048)).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(1024, 2048, device="cuda")
for step in range(3):
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
path = os.path.join(tempfile.mkdtemp(), "my_job.pickle")
torch.cuda.memory._dump_snapshot(path)
torch.cuda.memory._record_memory_history(enabled=None)       # stop recording

with open(path, "rb") as f:
    snapshot = pickle.load(f)
segments = snapshot["segments"]
blocks = [b for s in segments for b in s["blocks"]]
print(f"segments: {len(segments)}, blocks: {len(blocks)}, "
      f"reserved: {sum(s['total_size'] for s in segments) / 2**20:.2f} MiB")
trace = snapshot["device_traces"][0]
print(f"trace events: {len(trace)}")
for action, n in sorted(collections.Counter(e["action"] for e in trace).items()):
    print(f"  {action:16} {n:4}")
print("allocations of 1 MiB or more, by size and innermost Python frame:")
where = collections.Counter()
for e in trace:
    if e["action"] == "alloc" and e["size"] >= 2**20:
        f = e["frames"][0] if e["frames"] else None
        place = f"{os.path.basename(f['filename'])} {f['name']}" if f else "(no Python frame)"
        where[(e["size"] / 2**20, place)] += 1
for (mib, place), n in sorted(where.items()):
    print(f"  {n:3} x {mib:6.2f} MiB  {place}")
