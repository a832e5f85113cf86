# pin_memory() goes through PyTorch's caching host allocator: a block is locked once,
# kept when the tensor is dropped, and handed out again. Its sizes are powers of two.
import time

import torch

torch.cuda.init()  # host_memory_stats() reports nothing before PyTorch's CUDA state exists
torch.empty(1, pin_memory=True)  # creates the CUDA context outside the timings
MiB = 2**20


# ANCHOR: pin
def pin(mib):
    """Pins a batch of `mib` MiB, as DataLoader(pin_memory=True) does, then drops it."""
    batch = torch.empty(mib * MiB, dtype=torch.uint8)  # pageable, as a worker makes it
    calls = torch.cuda.host_memory_stats()["num_host_alloc"]
    t = time.perf_counter()
    pinned = batch.pin_memory()  # a pinned copy of the batch
    ms = (time.perf_counter() - t) * 1e3
    new = torch.cuda.host_memory_stats()["num_host_alloc"] - calls
    print(f"pin_memory() of {mib:5,} MiB: {ms:7.1f} ms, new blocks locked: {new}, "
          f"is_pinned() {pinned.is_pinned()}")
    # `pinned` goes here: its block returns to the cache, not to CUDA


pin(1600)  # tutorial 003's batch: 32 samples of 50 MiB
pin(1600)  # the next batch of the same size
pin(2000)  # a larger batch
pin(2100)  # larger still
# ANCHOR_END: pin
