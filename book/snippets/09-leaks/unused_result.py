# Tutorial 002's `c = a @ b`, never backpropagated: what c's node saved (seen through
# saved_tensors_hooks), and the memory it holds after `del a, b` and after `del c`.
import torch

MiB = 2**20
n = 4096


# ANCHOR: unused
def run(requires_grad):
    saved = []

    def pack(t):                                       # called for each saved tensor
        saved.append(t.untyped_storage().nbytes())
        return t

    base = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        a = torch.randn(n, n, device="cuda", requires_grad=requires_grad)
        b = torch.randn(n, n, device="cuda", requires_grad=requires_grad)
        c = a @ b
    print(f"requires_grad={requires_grad}: c.grad_fn = {c.grad_fn.name() if c.grad_fn else None}, "
          f"{len(saved)} saved tensors, {sum(saved) / MiB:.2f} MiB")
    del a, b
    print(f"  after del a, b: {(torch.cuda.memory_allocated() - base) / MiB:8.2f} MiB")
    del c
    print(f"  after del c:    {(torch.cuda.memory_allocated() - base) / MiB:8.2f} MiB")
# ANCHOR_END: unused


run(True)
run(False)
