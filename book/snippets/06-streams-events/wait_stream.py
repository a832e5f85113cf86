# A producer stream writes a tensor after some other work; the current stream reads
# it, once at once and once after wait_stream. How many results are right?
import torch

n = 1 << 16
data = torch.zeros(n, device="cuda")
host = torch.empty(1 << 28, pin_memory=True)  # 1 GiB, for the producer's other work
buffer = torch.empty(1 << 28, device="cuda")
producer = torch.cuda.Stream()
int((data.fill_(1.0) * 2 == 2).sum())  # warm-up: a kernel's first launch loads it,
torch.cuda.synchronize()  # and loading waits for the work already running


# ANCHOR: wait_stream
def consume(wait):
    torch.cuda.synchronize()
    data.zero_()
    producer.wait_stream(torch.cuda.current_stream())  # the zeros come first
    with torch.cuda.stream(producer):
        buffer.copy_(host, non_blocking=True)  # the producer is busy for a while
        data.fill_(1.0)  # then writes what the consumer needs
    if wait:
        torch.cuda.current_stream().wait_stream(producer)  # no host blocking
    out = data * 2  # on the current stream
    return int((out == 2).sum())


print(f"no wait:     {consume(False):6} of {n} results correct")
print(f"wait_stream: {consume(True):6} of {n} results correct")
# ANCHOR_END: wait_stream
