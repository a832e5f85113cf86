# to() returns the tensor itself when it is already on the target, and a copy otherwise.
import time

import torch

x = torch.randn(4096, 1024, device="cuda")  # 16 MiB
x.to("cpu").to("cuda")  # warm-up: the first calls pay one-time costs
torch.cuda.synchronize()

calls = {
    'x.to("cuda")': lambda: x.to("cuda"),
    'x.to("cuda:0")': lambda: x.to("cuda:0"),
    'x.to("cpu")': lambda: x.to("cpu"),
    'x.cpu().cuda()': lambda: x.cpu().cuda(),
}
for call, f in calls.items():
    start = time.perf_counter()
    y = f()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"{call:15} returns x itself: {str(y is x):5}  same memory: "
          f"{str(y.data_ptr() == x.data_ptr()):5}  on {str(y.device):6}  {seconds * 1e6:9.1f} us")
print(f"after all four calls, x is still on {x.device}")

# Modules differ: Module.to() moves the parameters in place and returns the module.
model = torch.nn.Linear(1024, 1024)
moved = model.to("cuda")
print(f"model.to('cuda') returns the model itself: {moved is model}; "
      f"its weight is now on {model.weight.device}")
