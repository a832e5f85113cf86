# Peak reserved against peak requested for a loop whose tensors grow a little at every
# step (a sequence length growing from 512 to 1,024), under three allocator settings,
# each in a process of its own.
import os
import subprocess
import sys

if len(sys.argv) == 1:
    print(f"{'PYTORCH_CUDA_ALLOC_CONF':27} {'peak requested':>15} {'peak reserved':>14} "
          f"{'ratio':>6} {'driver allocations':>19}", flush=True)
    for conf in [None, "roundup_power2_divisions:4", "expandable_segments:True"]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        subprocess.run([sys.executable, os.path.abspath(__file__), conf or "unset (the default)"],
                       env=env, check=True)
    sys.exit(0)

import torch  # noqa: E402  (the child process)

for length in range(512, 1025, 16):
    h = torch.empty(length, 32768, device="cuda")  # 64 MiB at 512, 128 MiB at 1,024
    y = h * 2  # the next activation, of the same size
    del h, y
s = torch.cuda.memory_stats()
requested, reserved = s["requested_bytes.all.peak"], s["reserved_bytes.all.peak"]
print(f"{sys.argv[1]:27} {requested / 2**20:11.0f} MiB {reserved / 2**20:10.0f} MiB "
      f"{reserved / requested:6.2f} {s['num_device_alloc']:19}")
