# What empty_cache() returns under PyTorch's default and with expandable segments:
# 64 blocks of 700 KiB to 5,600 KiB, all freed but one, then empty_cache(). Each
# setting runs in a process of its own, since the allocator reads it once.
import os
import subprocess
import sys

if len(sys.argv) == 1:
    for conf in [None, "expandable_segments:True"]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        print(f"PYTORCH_CUDA_ALLOC_CONF={conf or 'unset (the default)'}", flush=True)
        subprocess.run([sys.executable, os.path.abspath(__file__), "run"], env=env, check=True)
    sys.exit(0)

import torch  # noqa: E402  (the child process)

MiB = 2**20
blocks = [torch.empty((i % 8 + 1) * 700 * 1024, dtype=torch.uint8, device="cuda")
          for i in range(64)]
survivor = blocks.pop(17)  # one block of 1,400 KiB stays alive
del blocks
before = torch.cuda.memory_reserved()
torch.cuda.empty_cache()
after = torch.cuda.memory_reserved()
print(f"  live (one block)              {torch.cuda.memory_allocated() / MiB:8.2f} MiB")
print(f"  reserved before empty_cache   {before / MiB:8.2f} MiB")
print(f"  returned by empty_cache       {(before - after) / MiB:8.2f} MiB")
print(f"  reserved after                {after / MiB:8.2f} MiB")
