# The memory a process holds on each GPU outside PyTorch's caching allocator: the CUDA
# context (made at the device's first use) and NCCL's communicator (made by
# init_process_group with a device_id, and at the first collective), one process per
# GPU. Each step's figure is cudaMemGetInfo's used memory (total less free), the count
# nvidia-smi shows for the whole device; memory_reserved() is the allocator's share.
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 1 << 20


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def main(rank, n):
    # ANCHOR: steps
    torch.cuda.set_device(rank)
    context = used()  # the first call makes the context
    dist.init_process_group("nccl", rank=rank, world_size=n,
                            device_id=torch.device("cuda", rank))
    communicator = used()
    t = torch.zeros(1 << 18, device="cuda")  # 1 MiB
    dist.all_reduce(t)
    torch.cuda.synchronize()
    first = used()
    reserved = torch.cuda.memory_reserved()
    # ANCHOR_END: steps
    row = (f"| cuda:{rank} | {context / MIB:.2f} | {(communicator - context) / MIB:.2f} | "
           f"{(first - communicator) / MIB:.2f} | {reserved / MIB:.2f} | "
           f"{(first - reserved) / MIB:.2f} |")
    rows = [None] * n
    dist.all_gather_object(rows, row)
    if rank == 0:
        print("| device | context MiB | + communicator MiB | + first all-reduce MiB "
              "| allocator reserved MiB | outside the allocator MiB |")
        print("| --- | --- | --- | --- | --- | --- |")
        print("\n".join(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    n = torch.cuda.device_count()
    mp.spawn(main, args=(n,), nprocs=n)
