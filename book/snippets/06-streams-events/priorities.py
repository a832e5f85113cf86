# An urgent small kernel queued behind a backlog of large ones on another stream:
# when is it done, with equal priority and with a higher one?
import torch

big = torch.zeros(1 << 30, device="cuda")  # 4 GiB: each pass is millions of blocks
small = torch.zeros(1 << 10, device="cuda")
backlog = torch.cuda.Stream(priority=0)
big.add_(1), small.add_(1)
torch.cuda.synchronize()


# ANCHOR: priorities
def urgent_done_after(priority):
    urgent = torch.cuda.Stream(priority=priority)  # lower numbers are more urgent
    start, done, all_done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    start.record(backlog)
    urgent.wait_event(start)  # the urgent kernel cannot start before the backlog
    with torch.cuda.stream(backlog):
        for _ in range(40):
            big.add_(1)  # each pass fills the whole device for milliseconds
    with torch.cuda.stream(urgent):
        small.add_(1)
    done.record(urgent)
    all_done.record(backlog)
    torch.cuda.synchronize()
    return urgent.priority, start.elapsed_time(done), start.elapsed_time(all_done)


print(f"priority range (least, greatest): {torch.cuda.Stream.priority_range()}")
for p in (0, -1):
    prio, urgent_ms, backlog_ms = urgent_done_after(p)
    print(f"urgent stream priority {prio:2}: done after {urgent_ms:7.3f} ms "
          f"(the backlog took {backlog_ms:7.2f} ms)")
# ANCHOR_END: priorities
