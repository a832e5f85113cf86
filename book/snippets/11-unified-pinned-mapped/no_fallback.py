# Tutorial 003's experiment on Linux: ask for half again as much device memory as the
# card has. Under Windows' WDDM with the sysmem fallback this can succeed; here?
import torch

# ANCHOR: no_fallback
total = torch.cuda.get_device_properties(0).total_memory
ask = total * 3 // 2
print(f"the card has {total / 2**30:.2f} GiB; asking for {ask / 2**30:.2f} GiB")
try:
    x = torch.empty(ask, dtype=torch.uint8, device="cuda")
    print("allocated: the driver found memory beyond the card's")
except torch.cuda.OutOfMemoryError as e:
    print(f"torch.cuda.OutOfMemoryError: {'. '.join(str(e).split('. ')[:2])}.")
# ANCHOR_END: no_fallback
