# The order in which backward finishes the gradients of a model's parameters: the last
# layer's first. DistributedDataParallel fills its buckets in this order (reverse
# registration order), so that the first bucket's all-reduce can start while backward
# still works on the layers below.
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                      nn.Linear(4096, 1024)).cuda()
names = {p: name for name, p in model.named_parameters()}
print("registration order:", ", ".join(names.values()))

# ANCHOR: hooks
arrived = []
for p in model.parameters():
    p.register_post_accumulate_grad_hook(lambda p: arrived.append(names[p]))
x = torch.randn(64, 1024, device="cuda")
model(x).square().mean().backward()
# ANCHOR_END: hooks
print("gradients ready:   ", ", ".join(arrived))
for name in arrived:
    p = model.get_parameter(name)
    print(f"  {name:9} {p.numel() * p.element_size() / 2**10:6.0f} KiB")
