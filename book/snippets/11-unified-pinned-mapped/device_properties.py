# What CUDA tells PyTorch about the device's memory: one figure, the card's own.
import torch

# ANCHOR: properties
print(f"torch.cuda.is_available(): {torch.cuda.is_available()}")
p = torch.cuda.get_device_properties(0)
free, total = torch.cuda.mem_get_info(0)
print(f"name:               {p.name}")
print(f"compute capability: {p.major}.{p.minor}, {p.multi_processor_count} multiprocessors")
print(f"total_memory:       {p.total_memory / 2**30:.2f} GiB")
print(f"mem_get_info():     {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB")
print(f"is_integrated:      {bool(p.is_integrated)}")
# ANCHOR_END: properties
