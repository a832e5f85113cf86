# An out-of-memory error met the way a training script meets it: parameters and
# activations fill most of the GPU, then one more request does not fit. The except block
# prints the error's text, dumps the memory history and prints memory_summary().
import os
import tempfile

import torch

total = torch.cuda.get_device_properties(0).total_memory
page = 2 * 2**20


def block(n):
    """n bytes of device memory, rounded down to whole 2 MiB pages."""
    return torch.empty(n // page * page, dtype=torch.uint8, device="cuda")


torch.cuda.memory._record_memory_history(max_entries=100000)
# ANCHOR: provoke
params = block(total // 8)
activations = [block(total // 6) for _ in range(4)]
try:
    extra = block(total // 4)
except torch.cuda.OutOfMemoryError as e:
    print(type(e).__name__ + ":", e)
    path = os.path.join(tempfile.mkdtemp(), "oom_snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    print(f"snapshot written: {os.path.getsize(path)} bytes")
    print(torch.cuda.memory_summary(abbreviated=True))
# ANCHOR_END: provoke
torch.cuda.memory._record_memory_history(enabled=None)
del params, activations
