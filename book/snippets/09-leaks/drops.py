# What `del` frees and what it does not: another reference, a view, a graph that saved
# a tensor; then empty_cache(). Memory after each step, in MiB.
import torch

MiB = 2**20


def show(what):
    print(f"{what:56} {torch.cuda.memory_allocated() / MiB:9.2f} "
          f"{torch.cuda.memory_reserved() / MiB:9.2f}")


rows = 64 * MiB // 4096                               # 64 MiB tensors of 1024 columns
print(f"{'step':56} {'allocated':>9} {'reserved':>9}")
show("start")
# ANCHOR: drops
a = torch.randn(rows, 1024, device="cuda")
b = a
show("a = randn(...); b = a")
del a
show("del a (b still refers to it)")
del b
show("del b")
a = torch.randn(rows, 1024, device="cuda")
row = a[0:1]
del a
show("row = a[0:1]; del a (the view keeps the block)")
row = row.clone()
show("row = row.clone() (a copy of 4 KiB; the view goes)")
del row
show("del row")
w = torch.randn(1024, 1, device="cuda", requires_grad=True)
x = torch.randn(rows, 1024, device="cuda")
y = x @ w
del x
show("y = x @ w (w requires grad); del x (y's node saved x)")
del y
show("del y (the node goes, and x with it)")
del w
torch.cuda.empty_cache()
show("empty_cache()")
# ANCHOR_END: drops
