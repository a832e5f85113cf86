# Does an operation's output share its input's memory? Out-of-place outputs get new
# blocks (perhaps a freed block's, from the cache); in-place ops, out= and views share.
import torch

x = torch.randn(1024, 1024, device="cuda")  # 4 MiB


def check(expression, make):
    before = torch.cuda.memory_allocated()
    r = make()
    grew = (torch.cuda.memory_allocated() - before) / 2**20
    shares = r.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    print(f"{expression:26} {'yes' if shares else 'no':17} "
          f"{str(r.data_ptr() == x.data_ptr()):14} {grew:+6.2f} MiB")
    return r


print(f"{'expression':26} {'shares x storage':17} {'same data_ptr':14} allocated")
y = check("y = x + 1", lambda: x + 1)
freed = y.data_ptr()
del y  # y's block goes back to the cache
z = check("z = x * 2 (after del y)", lambda: x * 2)
print(f"  z got y's old block from the cache: {z.data_ptr() == freed}")
check("x.add_(1)", lambda: x.add_(1))
out = torch.empty_like(x)
r = check("torch.add(x, 1, out=out)", lambda: torch.add(x, 1, out=out))
print(f"  the result is out itself: {r.data_ptr() == out.data_ptr()}")
check("x.view(-1)", lambda: x.view(-1))
check("x.t()", lambda: x.t())
check("x[1:]", lambda: x[1:])
check("x.t().contiguous()", lambda: x.t().contiguous())
