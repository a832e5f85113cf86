"""Data-parallel scaling, ours beside PyTorch's: reads the JSON of `lab-10 train` and of
ci/pytorch-train.py, each on one GPU and under a launcher (`lab-10 train --nproc N`,
`torchrun --nproc_per_node N`), and prints a markdown table of throughput (samples per
second: world size x batch x accum over the median step), the scaling efficiency
(throughput on N GPUs over N times the throughput on one) and the peak allocated memory
of each rank.

  python3 ci/data-parallel-scaling.py --ours one.json ddp.json --pytorch one.json ddp.json

A file may hold other lines around the JSON object (a launcher's notes): the first line
that parses as an object is the report."""

import argparse
import json
import sys

MIB = 1 << 20


def report(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue
    sys.exit(f"data-parallel-scaling.py: {path} holds no JSON report")


def throughput(r):
    """Samples per second of the whole job, from rank 0's median step."""
    if r.get("step_ms") is None:
        return None
    c = r["config"]
    return r.get("world_size", 1) * c["batch"] * c.get("accum", 1) / (r["step_ms"] / 1e3)


def peaks(r):
    ranks = r.get("ranks") or [{"peak_allocated": r["peak_allocated"]}]
    return ", ".join(f"{x['peak_allocated'] / MIB:.0f}" for x in ranks)


def rows(name, one, many):
    t1, tn = throughput(one), throughput(many)
    n = many.get("world_size", 1)
    eff = None if t1 is None or tn is None else tn / (n * t1)
    fmt = lambda x, spec: "-" if x is None else format(x, spec)
    return [
        f"| {name} | 1 | {fmt(one.get('step_ms'), '.1f')} | {fmt(t1, '.1f')} | | {peaks(one)} |",
        f"| {name} | {n} | {fmt(many.get('step_ms'), '.1f')} | {fmt(tn, '.1f')} | "
        f"{fmt(None if eff is None else 100 * eff, '.1f')}% | {peaks(many)} |",
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", nargs=2, metavar=("ONE", "MANY"), required=True)
    p.add_argument("--pytorch", nargs=2, metavar=("ONE", "MANY"))
    a = p.parse_args()
    print("| driver | GPUs | step (ms) | samples/s | scaling efficiency | peak allocated per rank (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for line in rows("labs", *map(report, a.ours)):
        print(line)
    if a.pytorch:
        for line in rows("PyTorch", *map(report, a.pytorch)):
            print(line)


if __name__ == "__main__":
    main()
