# Tutorial 000's "synchronous deletion", step by step: synchronize(), del x,
# empty_cache(). Then the same without the synchronize, while work on x is queued.
import torch

MiB = 2**20


def show(step):
    busy = not torch.cuda.current_stream().query()  # work still queued on the stream?
    print(f"{step:30} allocated {torch.cuda.memory_allocated() / MiB:4.0f} MiB  "
          f"reserved {torch.cuda.memory_reserved() / MiB:4.0f} MiB  GPU busy: {busy}")


def queue_work_reading(x):  # about a thousand kernels: tens of milliseconds of work
    for _ in range(1000):
        torch.mul(x, 1.0001, out=y)


y = torch.empty(4096, 4096, device="cuda")  # 64 MiB, kept throughout
x = torch.randn(4096, 4096, device="cuda")  # 64 MiB
queue_work_reading(x)
show("work reading x queued")
torch.cuda.synchronize()
show("torch.cuda.synchronize()")
del x
show("del x")
torch.cuda.empty_cache()
show("torch.cuda.empty_cache()")

print("again, without synchronize():")
x = torch.randn(4096, 4096, device="cuda")
queue_work_reading(x)
old = x.data_ptr()
del x
show("del x")
z = torch.empty(4096, 4096, device="cuda")
show("z = a new 64 MiB tensor")
print(f"z got x's block while work on x was still queued: {z.data_ptr() == old}")
torch.cuda.empty_cache()
show("torch.cuda.empty_cache()")
