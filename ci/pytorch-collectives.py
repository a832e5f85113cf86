"""NCCL collectives through torch.distributed, measured as nccl-tests measures them: the
PyTorch side of the book's data-parallel comparisons.

  torchrun --nproc_per_node 2 ci/pytorch-collectives.py                 # all_reduce, f32
  torchrun --nproc_per_node 2 ci/pytorch-collectives.py --op all_gather --dtype bf16 --json
  torchrun --nproc_per_node 8 ci/pytorch-collectives.py --minbytes 1M --maxbytes 256M

Runs on one host with several GPUs (one process per GPU, each on cuda:LOCAL_RANK;
`--nproc_per_node 1` runs a world of one, which measures NCCL's local copy). For each size
from `--minbytes` to `--maxbytes` (doubling; default 8 B to 1 GiB; nccl-tests' names, and
not `--max`, which torchrun's own parser would take for its `--max-restarts`), the
chosen operation
(all_reduce in place, broadcast from rank 0, all_gather_into_tensor,
reduce_scatter_tensor) is first checked once (every rank's buffer filled with rank + 1:
all_reduce and reduce_scatter must give n (n + 1) / 2 everywhere, broadcast rank 0's 1,
all_gather 1, 2, ..., n in rank order; small integers, exact in every dtype), then run
`--warmup` times, then `--iters` times between two CUDA events on the current stream.

As in nccl-tests, the size is the whole buffer (all_gather's output, reduce_scatter's
input), the time the mean per operation (here the slowest rank's), algbw = size / time,
and busbw = algbw x the operation's bus factor, which makes the figures comparable with
the links' bandwidth: all_reduce 2 (n - 1) / n, all_gather and reduce_scatter
(n - 1) / n, broadcast 1. GB/s are 10^9 bytes per second. Rank 0 prints a table, or one
JSON object with `--json`; the exit status is 1 when a check failed."""

import argparse
import json
import os
import re
import sys

import torch
import torch.cuda.nccl
import torch.distributed as dist

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"]
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """`8`, `64K`, `1M`, `1G` (binary, as nccl-tests), also `1GiB`/`1GB`-style suffixes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (8, 64K, 1M, 1G)")
    value = int(m.group(1)) * UNITS[m.group(2).upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be at least one byte")
    return value


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="nccl-tests-style timing of one collective through torch.distributed; "
                    "run under torchrun --nproc_per_node N")
    p.add_argument("--op", choices=OPS, default="all_reduce")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    p.add_argument("--minbytes", "--min", type=parse_size, default=8,
                   help="smallest size (default 8)")
    p.add_argument("--maxbytes", type=parse_size, default=1 << 30,
                   help="largest size (default 1G)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per size")
    p.add_argument("--iters", type=positive_int, default=20, help="timed runs per size")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if a.minbytes > a.maxbytes:
        p.error(f"--minbytes {a.minbytes} is larger than --maxbytes {a.maxbytes}")
    if a.warmup < 0:
        p.error("--warmup must not be negative")
    return a


def sizes(lo, hi):
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= 2
    return out


def bus_factor(op, n):
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth."""
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n, "broadcast": 1.0}[op]


def element_count(op, size, elem, n):
    """Elements of the whole buffer for `size` bytes: all_gather and reduce_scatter
    need a multiple of the world size (at least one element per rank)."""
    count = max(1, size // elem)
    if op in ("all_gather", "reduce_scatter"):
        count = max(n, count - count % n)
    return count


def table(report):
    lines = [f"# {report['op']} of {report['dtype']} on {report['world_size']} x "
             f"{report['device']} (PyTorch {report['torch']}, NCCL {report['nccl']}), "
             f"{report['warmup']} warm-up, {report['iters']} timed, bus factor "
             f"{report['bus_factor']:.3f}",
             f"#{'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} "
             f"{'busbw':>8} {'check':>6}",
             f"#{'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} "
             f"{'(GB/s)':>8} {'':>6}"]
    for r in report["results"]:
        lines.append(f" {r['bytes']:>12} {r['count']:>12} {report['dtype']:>6} "
                     f"{r['time_us']:>10.2f} {r['algbw_gbps']:>8.2f} {r['busbw_gbps']:>8.2f} "
                     f"{'ok' if r['correct'] else 'WRONG':>6}")
    return "\n".join(lines)


# Everything below needs the GPUs.

def buffers(op, count, n, dtype, device):
    """(input, output) of one operation over `count` elements in all."""
    if op in ("all_reduce", "broadcast"):
        t = torch.empty(count, dtype=dtype, device=device)
        return t, t
    whole = torch.empty(count, dtype=dtype, device=device)
    part = torch.empty(count // n, dtype=dtype, device=device)
    return (part, whole) if op == "all_gather" else (whole, part)


def run_op(op, inp, out):
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "broadcast":
        dist.broadcast(inp, src=0)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, inp)
    else:
        dist.reduce_scatter_tensor(out, inp)


def check(op, inp, out, rank, n, device):
    """Runs the operation once on known values; true on every rank when all got what
    the operation must give."""
    inp.fill_(rank + 1)
    run_op(op, inp, out)
    if op in ("all_reduce", "reduce_scatter"):
        good = bool((out == n * (n + 1) // 2).all())
    elif op == "broadcast":
        good = bool((out == 1).all())
    else:
        expected = torch.arange(1, n + 1, device=device, dtype=out.dtype).unsqueeze(1)
        good = bool((out.view(n, -1) == expected).all())
    flag = torch.tensor([int(good)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


# ANCHOR: measure
def measure(op, inp, out, warmup, iters, device):
    """Mean microseconds per operation, the slowest rank's."""
    inp.zero_()  # repeated sums of zeros stay finite in every dtype
    for _ in range(warmup):
        run_op(op, inp, out)
    torch.cuda.synchronize(device)
    dist.barrier(device_ids=[device.index])
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run_op(op, inp, out)
    end.record()
    end.synchronize()
    us = torch.tensor([start.elapsed_time(end) * 1e3 / iters], device=device,
                      dtype=torch.float64)
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()
# ANCHOR_END: measure


def nccl_version():
    v = torch.cuda.nccl.version()  # (major, minor, patch); an int in older releases
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if "WORLD_SIZE" not in os.environ or "LOCAL_RANK" not in os.environ:
        sys.exit("pytorch-collectives.py: run it under torchrun, one process per GPU: "
                 "torchrun --nproc_per_node N ci/pytorch-collectives.py [flags]")
    if not torch.cuda.is_available():
        sys.exit("pytorch-collectives.py: PyTorch sees no CUDA GPU")
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    factor = bus_factor(args.op, n)
    results = []
    for size in sizes(args.minbytes, args.maxbytes):
        count = element_count(args.op, size, elem, n)
        if results and results[-1]["count"] == count:
            continue  # a size too small to split over the ranks, rounded up as the last
        inp, out = buffers(args.op, count, n, dtype, device)
        correct = check(args.op, inp, out, rank, n, device)
        us = measure(args.op, inp, out, args.warmup, args.iters, device)
        nbytes = count * elem
        algbw = nbytes / (us * 1e-6) / 1e9
        results.append({"bytes": nbytes, "count": count, "time_us": us,
                        "algbw_gbps": algbw, "busbw_gbps": algbw * factor,
                        "correct": correct})
        del inp, out
    report = {
        "op": args.op, "dtype": args.dtype, "world_size": n,
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
        "nccl": nccl_version(),
        "warmup": args.warmup, "iters": args.iters, "timing": "CUDA events, slowest rank",
        "bus_factor": factor, "results": results,
    }
    if n == 1:
        report["note"] = "a world of one process: no data crosses a link"
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(report) if args.json else table(report), flush=True)
    if not all(r["correct"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
