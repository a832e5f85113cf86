# Tutorial 000's prefetching loader with its two gaps closed (pinned batches,
# record_stream), against the naive loop: ms per step, best of three passes.
import time

import torch


# ANCHOR: prefetcher
class Prefetcher:  # batch N+1 crosses the bus on a side stream while N is computed on
    def __init__(self, batches):
        self.batches, self.stream = iter(batches), torch.cuda.Stream()
        self.next = self.load()

    def load(self):
        host = next(self.batches, None)  # a batch in pinned memory, or None
        with torch.cuda.stream(self.stream):
            return None if host is None else host.to("cuda", non_blocking=True)

    def __iter__(self):
        while self.next is not None:
            torch.cuda.current_stream().wait_stream(self.stream)  # its copy is done
            batch = self.next
            batch.record_stream(torch.cuda.current_stream())  # and it is used here
            self.next = self.load()
            yield batch
# ANCHOR_END: prefetcher


def ms_per_step(loop, n=8):
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loop()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) * 1e3 / n)
    return best


w = torch.randn(4096, 2048, device="cuda")
batches = [torch.randn(4096, 4096).pin_memory() for _ in range(8)]  # 64 MiB each
on_device = [b.to("cuda") for b in batches]
# ANCHOR: loops
loops = {
    "copy alone": lambda: [b.to("cuda", non_blocking=True) for b in batches],
    "compute alone": lambda: [x @ w for x in on_device],
    "naive": lambda: [b.to("cuda", non_blocking=True) @ w for b in batches],
    "prefetched": lambda: [x @ w for x in Prefetcher(batches)],
}
for name, loop in loops.items():
    print(f"{name:14} {ms_per_step(loop):6.3f} ms per step")
# ANCHOR_END: loops
