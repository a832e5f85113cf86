# Tutorial 004's experiment: 100 tensors of 1000 x 1000 float32 kept in a list, against
# each one dropped, with empty_cache(), before the next is made.
import torch


def run(keep):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    kept = []
    for _ in range(100):
        x = torch.randn(1000, 1000, device="cuda")
        if keep:
            kept.append(x)
        else:
            del x
            torch.cuda.empty_cache()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


print(f"{'tensors':8} {'peak allocated, MB':>19} {'in MiB':>10} {'peak reserved':>14}")
for keep in (True, False):
    allocated, reserved = run(keep)
    print(f"{'kept' if keep else 'dropped':8} {allocated / 1e6:16.2f} MB "
          f"{allocated / 2**20:6.2f} MiB {reserved / 2**20:10.2f} MiB")
