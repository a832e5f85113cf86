# A reference cycle that holds a CUDA tensor: del is not enough, the garbage
# collector must find the cycle.
import gc

import torch

MiB = 2**20
gc.disable()   # the collector now runs only when asked, so the output does not
               # depend on when its automatic collection would have come


class Holder:
    def __init__(self):
        self.tensor = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        self.me = self             # the object refers to itself: a cycle


h = Holder()
print(f"holder alive:       {torch.cuda.memory_allocated() / MiB:5.0f} MiB allocated")
del h
print(f"after del h:        {torch.cuda.memory_allocated() / MiB:5.0f} MiB allocated")
gc.collect()
print(f"after gc.collect(): {torch.cuda.memory_allocated() / MiB:5.0f} MiB allocated")
