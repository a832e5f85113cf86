"""One table from `lab-02 replay --json --pytorch ci/pytorch-replay.py` runs, a row per
trace: its peak requested, the peak reserved of the labs' allocator and of PyTorch's in
the same mode (the reports' `conf`), each over the peak requested, and the labs' peak
against PyTorch's.

  python3 ci/replay-table.py resnet50.json gpt2.json ...

A file may hold other lines around the JSON object: the first line that parses as an
object is the report."""

import sys

import json_report

MIB = 1 << 20


def main():
    paths = sys.argv[1:]
    if not paths or paths[0].startswith("-"):
        sys.exit("usage: replay-table.py FILE [FILE ...]")
    reports = [json_report.report(p, "replay-table.py") for p in paths]
    for path, r in zip(paths, reports):
        if not isinstance(r.get("pytorch"), dict):
            sys.exit(f"replay-table.py: {path} has no PyTorch replay (run lab-02 replay "
                     "with --pytorch ci/pytorch-replay.py)")
    confs = {r["conf"] for r in reports}
    print(f"Peak reserved over peak requested, {' / '.join(sorted(confs))}, "
          f"on {reports[0]['pytorch']['device']} (PyTorch {reports[0]['pytorch']['torch']})")
    print("| trace | peak requested (MiB) | labs reserved (MiB) | PyTorch reserved (MiB) "
          "| labs / requested | PyTorch / requested | labs / PyTorch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in reports:
        p = r["pytorch"]
        req = r["peak_requested"]
        print(f"| {r['trace']} | {req / MIB:,.1f} | {r['peak_reserved'] / MIB:,.1f} "
              f"| {p['peak_reserved'] / MIB:,.1f} | {r['peak_reserved'] / req:.3f} "
              f"| {p['peak_reserved'] / req:.3f} | {r['peak_reserved'] / p['peak_reserved']:.4f} |")


if __name__ == "__main__":
    main()
