# DataLoader(pin_memory=True): batches arrive in pinned host memory, from the caching
# host allocator, ready for non-blocking copies. They are still on the host.
import torch
from torch.utils.data import DataLoader, TensorDataset


# ANCHOR: loader
def epoch(pin_memory):
    data = TensorDataset(torch.randn(512, 3, 64, 64))  # 512 samples of 48 KiB
    loader = DataLoader(data, batch_size=32, num_workers=2, prefetch_factor=2,
                        pin_memory=pin_memory)  # batches of 1.5 MiB
    pinned, device = set(), set()
    for (batch,) in loader:
        pinned.add(batch.is_pinned())
        device.add(str(batch.device))
        x = batch.to("cuda", non_blocking=True)  # asynchronous only from pinned memory
    torch.cuda.synchronize()
    return pinned, device
# ANCHOR_END: loader


if __name__ == "__main__":
    for pin in (False, True):
        pinned, device = epoch(pin)
        print(f"pin_memory={pin!s:5}: batch.is_pinned() {sorted(pinned)}, "
              f"batch.device {sorted(device)}")
    calls = torch.cuda.host_memory_stats()["num_host_alloc"]
    print(f"pinned blocks locked for the 16 batches: {calls}")
