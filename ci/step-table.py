"""One training step, driver by driver, on one GPU: reads the JSON of `lab-10 train` and
of ci/pytorch-train.py (eager, and under `--compile MODE`) for one model and batch, and
prints a markdown table, a row per run: the median step time, tokens a second, the model
FLOP utilisation (the report's `mfu`: the model's FLOPs a step over the step time and the
GPU's dense peak), the peak allocated and reserved memory, and the step time and peak
allocated against the last file's run (the reference the others are measured against, e.g. torch.compile).

  python3 ci/step-table.py labs.json labs-fused.json eager.json compiled.json

A run is named by its driver (labs, or PyTorch where the report names torch's version),
with the labs' fused classifier, PyTorch's compile mode, a CUDA graph and an allocator
other than the default (expandable segments, backend:cudaMallocAsync) where on.

A file may hold other lines around the JSON object (a launcher's notes): the first line
that parses as an object is the report."""

import sys

import json_report

MIB = 1 << 20


def allocator(r):
    """The allocator's mode where it is not the default one."""
    conf = r.get("allocator") or ""
    for mode in ("backend:cudaMallocAsync", "expandable_segments:True"):
        if mode in conf:
            return f", {mode}"
    return ""


def padding(c):
    """`, vocabulary 50,304` where GPT-2's table is padded past its vocabulary
    (--vocab-multiple): the labs give the multiple, the twin the padded size."""
    vocab = c.get("vocab")
    if not isinstance(vocab, int):
        return ""
    padded = c.get("vocab_padded")
    if padded is None:
        m = c.get("vocab_multiple") or 1
        padded = -(-vocab // m) * m
    return f", vocabulary {padded:,}" if padded != vocab else ""


def name(r):
    """labs, labs with the fused classifier, PyTorch eager, PyTorch torch.compile (mode)."""
    c = r.get("config", {})
    graph = (", CUDA graph" if c.get("graph") else "") + allocator(r) + padding(c)
    if "torch" in r:
        mode = c.get("compile", "none")
        how = "eager" if mode == "none" else f"torch.compile ({mode})"
        return f"PyTorch {how}{graph}"
    rows = c.get("fused_classifier")
    fused = "" if rows is None else f", fused classifier ({rows:,} rows a chunk)"
    return f"labs{fused}{graph}"


def tokens_per_step(r):
    c = r.get("config", {})
    return c.get("batch", 0) * c.get("seq", 0) * c.get("accum", 1) * r.get("world_size", 1)


def mfu(r):
    return "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"


def main():
    paths = sys.argv[1:]
    if not paths or paths[0].startswith("-"):
        sys.exit("usage: step-table.py FILE [FILE ...] (the last is the reference)")
    reports = [json_report.report(p, "step-table.py") for p in paths]
    for path, r in zip(paths, reports):
        if r.get("step_ms") is None:
            sys.exit(f"step-table.py: {path} has no step time (out of memory, or no step "
                     "after the warm-up)")
    shapes = {(r["config"].get("model"), r["config"].get("batch"), r["config"].get("seq"),
               r["config"].get("amp")) for r in reports}
    if len(shapes) > 1:
        sys.exit(f"step-table.py: the runs differ in model, batch, sequence or amp: {shapes}")
    ref = reports[-1]
    # A captured step's private pool (reserved at the end), where any run has one.
    graphs = any(r.get("graph") for r in reports)
    pool = " graph's pool (MiB) |" if graphs else ""
    print("| run | step (ms) | tokens/s | MFU | peak allocated (MiB) | peak reserved (MiB) |"
          f"{pool} step / reference | peak / reference |")
    print("| --- " * (8 + graphs) + "|")
    for r in reports:
        tokens = tokens_per_step(r) / (r["step_ms"] / 1e3)
        g = r.get("graph")
        cell = (f" {g['pool_reserved'] / MIB:,.0f} |" if g else " - |") if graphs else ""
        print(f"| {name(r)} | {r['step_ms']:.1f} | {tokens:,.0f} | {mfu(r)} "
              f"| {r['peak_allocated'] / MIB:,.0f} | {r['peak_reserved'] / MIB:,.0f} |{cell}"
              f" {r['step_ms'] / ref['step_ms']:.2f} "
              f"| {r['peak_allocated'] / ref['peak_allocated']:.2f} |")
    torch = [r for r in reports if "torch" in r]
    if torch:
        print(f"\nreference: {name(ref)}; {torch[0]['device']}, PyTorch {torch[0]['torch']}")


if __name__ == "__main__":
    main()
