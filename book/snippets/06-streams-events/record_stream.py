# A tensor made on the current stream is read on a side stream, then dropped; a tensor
# of the same size is made and filled with 7.0 at once. Does the side stream still
# read the right data, without and with record_stream?
import torch

n = 300_007
host = torch.empty(1 << 28, pin_memory=True)  # 1 GiB, for the side stream's other work
buffer = torch.empty(1 << 28, device="cuda")
side = torch.cuda.Stream()
int((torch.full((n,), 1.0, device="cuda") * 2 == 2).sum())  # warm-up: a kernel's first
torch.cuda.synchronize()  # launch loads it, and loading waits for the work running


# ANCHOR: record_stream
def hazard(record):
    torch.cuda.synchronize()
    x = torch.ones(n, device="cuda")  # from the current stream's pool
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        buffer.copy_(host, non_blocking=True)  # the side stream is busy first
        out = x * 2  # then reads x
    if record:
        x.record_stream(side)  # the cure: x is in use on `side` too
    old = x.data_ptr()
    del x  # back to the current stream's pool, while `side` has not read it yet
    y = torch.full((n,), 7.0, device="cuda")  # same size, current stream
    reused = y.data_ptr() == old
    torch.cuda.synchronize()
    return reused, int((out == 2).sum())


for record in (False, True):
    reused, intact = hazard(record)
    print(f"record_stream {record!s:5}: block reused at once {reused!s:5}, "
          f"side stream's results intact {intact:7} of {n}")
# ANCHOR_END: record_stream
