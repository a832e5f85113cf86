"""Which runs of one model and batch fit and which ran out of memory: reads the JSON of
`lab-10 train` and of ci/pytorch-train.py (a report that ran out of memory has an "oom"
field and the peaks so far) and prints a markdown table, a row per run.

  python3 ci/fit-table.py ddp.json zero3.json pytorch-ddp.json pytorch-fsdp2.json

Each run is named by its driver (labs, or PyTorch where the report names torch's
version), how its ranks shared the work, and "dry run" for a dry device.

A file may hold other lines around the JSON object (a launcher's notes): the first line
that parses as an object is the report."""

import re
import sys

import json_report

MIB = 1 << 20


def outcome(r):
    """"trains" with the step time, or the out-of-memory error's request."""
    if r.get("oom"):
        asked = re.search(r"Tried to allocate ([0-9.]+ [KMG]iB)", r["oom"])
        return "out of memory" + (f" (asked for {asked.group(1)})" if asked else "")
    step = r.get("step_ms")
    return "trains" + ("" if step is None else f", {step:,.0f} ms a step")


def name(r):
    """labs ZeRO-3, PyTorch FSDP2 fully_shard, labs DDP, dry run, ..."""
    c = r.get("config", {})
    if "torch" in r:
        if c.get("zero3"):
            how = "FSDP2 fully_shard"
        elif c.get("zero2"):
            how = "FSDP SHARD_GRAD_OP"
        elif c.get("zero1"):
            how = "DDP + ZeroRedundancyOptimizer"
        else:
            how = "DDP" if r.get("world_size", 1) > 1 else "one GPU"
        return f"PyTorch {how}"
    names = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
    how = names.get(r.get("data_parallel"), "one GPU")
    dry = ", dry run" if str(r.get("device", "")).startswith("dry") else ""
    return f"labs {how}{dry}"


def main():
    paths = sys.argv[1:]
    if not paths or paths[0].startswith("-"):
        sys.exit("usage: fit-table.py FILE [FILE ...]")
    print("| run | GPUs | batch per GPU | outcome | peak allocated (MiB) | peak reserved (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in paths:
        r = json_report.report(path, "fit-table.py")
        c = r.get("config", {})
        print(f"| {name(r)} | {r.get('world_size', 1)} | {c.get('batch', '-')} | {outcome(r)} "
              f"| {r['peak_allocated'] / MIB:,.0f} | {r['peak_reserved'] / MIB:,.0f} |")


if __name__ == "__main__":
    main()
