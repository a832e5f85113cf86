# nvidia-smi sampled every 100 ms or so while a small training loop runs for two
# seconds, beside the allocator's own counters.
import itertools
import subprocess
import threading
import time

import torch
from torch import nn

MiB, samples, done = 2**20, [], threading.Event()


def poll():                         # what `nvidia-smi -l` shows, a line per sample
    while not done.is_set():
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True)
        samples.append([int(v) for v in out.stdout.split(",")])
        time.sleep(0.1)


model = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(4)]).cuda()
opt = torch.optim.Adam(model.parameters())
x = torch.randn(1024, 2048, device="cuda")
poller = threading.Thread(target=poll)
poller.start()                      # sampling starts with the training loop
readings, end = [], time.time() + 2
while time.time() < end:
    loss = model(x).square().mean()
    readings.append(torch.cuda.memory_allocated())
    loss.backward()
    readings.append(torch.cuda.memory_allocated())
    opt.step()
    opt.zero_grad()
    readings.append(torch.cuda.memory_allocated())
torch.cuda.synchronize()
done.set()
poller.join()

runs = [f"{m:,} (x{len(list(g))})" for m, g in itertools.groupby(m for m, _ in samples)]
print(f"nvidia-smi memory.used, MiB (x: samples in a row): {' -> '.join(runs)}")
print(f"nvidia-smi utilization.gpu: up to {max(u for _, u in samples)}%")
print(f"memory_allocated() after each phase of {len(readings) // 3} steps: "
      f"{min(readings) / MiB:,.0f} to {max(readings) / MiB:,.0f} MiB")
print(f"max_memory_allocated(): {torch.cuda.max_memory_allocated() / MiB:,.0f} MiB, "
      f"max_memory_reserved(): {torch.cuda.max_memory_reserved() / MiB:,.0f} MiB")
