# Tutorial 004's gradient-accumulation experiment as the tutorial writes it:
# nn.Transformer(d_model=256), which is not batch_first, with Adam; one step on a
# (64, 100, 256) batch, then one step of 4 accumulated (16, 100, 256) micro-batches,
# in one process and in that order. Peaks in MiB: the tutorial's "MB" divides by 1024**2.
import torch

MiB = 2**20
torch.manual_seed(0)
model = torch.nn.Transformer(d_model=256).cuda()
optimizer = torch.optim.Adam(model.parameters())


def large_batch():
    torch.cuda.reset_peak_memory_stats()
    inputs = torch.randn(64, 100, 256).cuda()
    targets = torch.randn(64, 100, 256).cuda()
    outputs = model(inputs, targets)
    loss = torch.nn.MSELoss()(outputs, targets)
    loss.backward()
    optimizer.step()
    return torch.cuda.max_memory_allocated()


def gradient_accumulation():
    torch.cuda.reset_peak_memory_stats()
    accum_steps = 4
    optimizer.zero_grad()
    for i in range(accum_steps):
        inputs = torch.randn(16, 100, 256).cuda()
        targets = torch.randn(16, 100, 256).cuda()
        outputs = model(inputs, targets)
        loss = torch.nn.MSELoss()(outputs, targets) / accum_steps
        loss.backward()
    optimizer.step()
    return torch.cuda.max_memory_allocated()


one, accumulated = large_batch(), gradient_accumulation()
print(f"batch (64, 100, 256):             {one / MiB:9.2f} MiB")
print(f"4 accumulated of (16, 100, 256):  {accumulated / MiB:9.2f} MiB")
print(f"ratio:                            {one / accumulated:9.2f}")
