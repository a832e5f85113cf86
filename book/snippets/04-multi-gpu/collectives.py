# The four collectives of data-parallel training, one process per GPU (here every GPU
# of the machine, started by torch.multiprocessing; torchrun does the same from the
# command line). Each rank's buffer holds rank + 1; the last rank prints what each
# collective left in its buffers.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank, n):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n)
    mine = torch.full((2 * n,), rank + 1.0, device="cuda")
    summed = mine.clone()
    dist.all_reduce(summed)  # every rank: the sum over the ranks
    first = mine.clone()
    dist.broadcast(first, src=0)  # every rank: rank 0's buffer
    every = torch.empty(2 * n * n, device="cuda")
    dist.all_gather_into_tensor(every, mine)  # every rank: all buffers, in rank order
    share = torch.empty(2, device="cuda")
    dist.reduce_scatter_tensor(share, mine)  # rank r: the sum of everyone's r-th part
    if rank == n - 1:
        print(f"world size {n}; rank {rank}'s buffer {mine.tolist()}")
        for name, t in [("all_reduce", summed), ("broadcast", first),
                        ("all_gather_into_tensor", every), ("reduce_scatter_tensor", share)]:
            print(f"{name:23} {t.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    n = torch.cuda.device_count()
    mp.spawn(main, args=(n,), nprocs=n)
