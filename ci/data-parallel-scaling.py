"""Data-parallel scaling, ours beside PyTorch's: reads the JSON of `lab-10 train` and of
ci/pytorch-train.py, each on one GPU and under a launcher (`lab-10 train --nproc N`,
`torchrun --nproc_per_node N`), and prints a markdown table of throughput (samples per
second: world size x batch x accum over the median step), the scaling efficiency
(throughput on N GPUs over N times the throughput on one) and the peak allocated memory
of each rank.

  python3 ci/data-parallel-scaling.py --ours one.json ddp.json --pytorch one.json ddp.json
  python3 ci/data-parallel-scaling.py --ours one.json ddp.json zero1.json zero2.json \
      --pytorch one.json ddp.json fsdp.json

After the one-GPU file come any number of runs on N GPUs, a row each, named by how the
ranks shared the work (DDP, ZeRO-1, ZeRO-2, ZeRO-3; PyTorch's ZeroRedundancyOptimizer
for `--zero1`, FSDP with SHARD_GRAD_OP for `--zero2`, FSDP2's fully_shard for `--zero3`).

A file may hold other lines around the JSON object (a launcher's notes): the first line
that parses as an object is the report."""

import argparse
import sys

import json_report

MIB = 1 << 20


def report(path):
    return json_report.report(path, "data-parallel-scaling.py")


def throughput(r):
    """Samples per second of the whole job, from rank 0's median step."""
    if r.get("step_ms") is None:
        return None
    c = r["config"]
    return r.get("world_size", 1) * c["batch"] * c.get("accum", 1) / (r["step_ms"] / 1e3)


def peaks(r):
    ranks = r.get("ranks") or [{"peak_allocated": r["peak_allocated"]}]
    return ", ".join(f"{x['peak_allocated'] / MIB:.0f}" for x in ranks)


def how(r, pytorch):
    """How the ranks of a run shared the work, as the table names it."""
    if pytorch:
        if r["config"].get("zero3"):
            return "FSDP2 fully_shard"
        if r["config"].get("zero2"):
            return "FSDP SHARD_GRAD_OP"
        return "DDP + ZeroRedundancyOptimizer" if r["config"].get("zero1") else "DDP"
    names = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
    return names.get(r.get("data_parallel"), "DDP")


def rows(name, one, manys, pytorch=False):
    t1 = throughput(one)
    fmt = lambda x, spec: "-" if x is None else format(x, spec)
    out = [f"| {name} | 1 | {fmt(one.get('step_ms'), '.1f')} | {fmt(t1, '.1f')} | | {peaks(one)} |"]
    for many in manys:
        tn = throughput(many)
        n = many.get("world_size", 1)
        eff = None if t1 is None or tn is None else tn / (n * t1)
        out.append(
            f"| {name} {how(many, pytorch)} | {n} | {fmt(many.get('step_ms'), '.1f')} | {fmt(tn, '.1f')} | "
            f"{fmt(None if eff is None else 100 * eff, '.1f')}% | {peaks(many)} |")
    return out


def files(p, flag, paths):
    if len(paths) < 2:
        p.error(f"{flag}: give the one-GPU run and at least one run on several GPUs")
    return [report(x) for x in paths]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", nargs="+", metavar="FILE", required=True,
                   help="the one-GPU run, then runs on several GPUs")
    p.add_argument("--pytorch", nargs="+", metavar="FILE")
    a = p.parse_args()
    ours = files(p, "--ours", a.ours)
    theirs = files(p, "--pytorch", a.pytorch) if a.pytorch else None
    print("| driver | GPUs | step (ms) | samples/s | scaling efficiency | peak allocated per rank (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for line in rows("labs", ours[0], ours[1:]):
        print(line)
    if theirs:
        for line in rows("PyTorch", theirs[0], theirs[1:], pytorch=True):
            print(line)


if __name__ == "__main__":
    main()
