"""The ZeRO ladder, measured: the memory per GPU of each rung of data parallelism set
against the ZeRO paper's formulas. Reads the JSON of `lab-10 train --nproc N` with DDP,
`--zero1`, `--zero2` and `--zero3` (and, in the same order, their dry runs), and of
ci/pytorch-train.py under torchrun with DDP, `--zero1`, `--zero2` and `--zero3`, all of one model
and batch, and prints a markdown table.

  python3 ci/zero-ladder.py --ours ddp.json zero1.json zero2.json zero3.json \
      --dry ddp-dry.json zero1-dry.json zero2-dry.json zero3-dry.json \
      --pytorch ddp.json zero-redundancy.json fsdp.json fsdp2.json

The formulas count the model's state only, for Ψ parameters in float32 trained with
Adam: 4Ψ bytes of parameters, 4Ψ of gradients and 8Ψ of moments, 16Ψ per GPU under DDP;
ZeRO-1 shards the moments (8Ψ + 8Ψ/N), ZeRO-2 the gradients too (4Ψ + 12Ψ/N), ZeRO-3
the parameters too (16Ψ/N). "Model state at the peak" is what rank 0 held of the three
at its peak (lab-10's categories); the peak adds what a step needs besides (activations,
temporaries, workspaces, and under ZeRO-3 the layers gathered whole at that moment).

A file may hold other lines around the JSON object (a launcher's notes): the first line
that parses as an object is the report."""

import argparse
import sys

import json_report

MIB = 1 << 20

RUNGS = [
    ("DDP", "nothing", lambda n: 16, "DDP"),
    ("ZeRO-1", "optimizer state", lambda n: 8 + 8 / n, "ZeroRedundancyOptimizer"),
    ("ZeRO-2", "+ gradients", lambda n: 4 + 12 / n, "FSDP SHARD_GRAD_OP"),
    ("ZeRO-3", "+ parameters", lambda n: 16 / n, "FSDP2 fully_shard"),
]


def report(path):
    return json_report.report(path, "zero-ladder.py")


def mib(x):
    return "-" if x is None else f"{x / MIB:,.0f}"


def model_state(r):
    c = r.get("by_category") or {}
    return sum(c.get(k, 0) for k in ("parameter", "gradient", "optimizer_state"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", nargs=4, metavar="FILE", required=True,
                   help="DDP, ZeRO-1, ZeRO-2, ZeRO-3")
    p.add_argument("--dry", nargs=4, metavar="FILE", help="their dry runs, in that order")
    p.add_argument("--pytorch", nargs=4, metavar="FILE",
                   help="DDP, DDP with ZeroRedundancyOptimizer (--zero1), FSDP SHARD_GRAD_OP "
                        "(--zero2), FSDP2 fully_shard (--zero3)")
    a = p.parse_args()
    ours = [report(x) for x in a.ours]
    dry = [report(x) for x in a.dry] if a.dry else [None] * 4
    theirs = dict(zip(["DDP", "ZeroRedundancyOptimizer", "FSDP SHARD_GRAD_OP", "FSDP2 fully_shard"],
                      [report(x) for x in a.pytorch])) if a.pytorch else {}
    psi = ours[0]["params"]
    n = ours[0].get("world_size", 1)
    for r in ours[1:]:
        if r["params"] != psi or r.get("world_size", 1) != n:
            sys.exit("zero-ladder.py: the runs are not of one model on one number of GPUs")
    print(f"Ψ = {psi:,} parameters on N = {n} GPUs; MiB per GPU (rank 0)")
    print()
    print("| rung | sharded | ZeRO formula | model state at the peak | peak allocated "
          "| dry run | PyTorch | PyTorch peak |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, what, bytes_per_param, twin), r, d in zip(RUNGS, ours, dry):
        t = theirs.get(twin) if twin else None
        print(f"| {name} | {what} | {mib(bytes_per_param(n) * psi)} | {mib(model_state(r))} "
              f"| {mib(r.get('peak_allocated'))} | {mib(d and d.get('peak_allocated'))} "
              f"| {twin or '-'} | {mib(t and t.get('peak_allocated'))} |")


if __name__ == "__main__":
    main()
