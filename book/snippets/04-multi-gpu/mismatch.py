# An operation on tensors of two devices is an error, not a silent copy. The second
# device is cuda:1 where there is one, else the host.
import torch

other = "cuda:1" if torch.cuda.device_count() > 1 else "cpu"
a, b = torch.ones(4, device="cuda:0"), torch.ones(4, device=other)
try:
    a + b
except RuntimeError as e:
    print(f"cuda:0 + {other}: RuntimeError: {e}")
c = a + b.to("cuda:0")  # the fix: move one of them, explicitly
print(f"a + b.to('cuda:0') is on {c.device}")
