"""The labs' training driver against PyTorch's, configuration by configuration, on one GPU:
for each configuration it runs `lab-10 train FLAGS --json --device cuda`, then
`python3 ci/pytorch-train.py FLAGS --json` (the same flags, each run a fresh process, one
after the other), and prints a markdown table of peak allocated and peak reserved memory
(MiB; ours, PyTorch's, and for allocated the ratio ours / PyTorch), the median step time
(ms, both, ratio) and the final loss of each.

  python3 ci/train-compare.py --lab target/release/lab-10                 # the chapter's table
  python3 ci/train-compare.py --lab bin/lab-10 --quick --out train.jsonl
  python3 ci/train-compare.py --lab bin/lab-10 --only gpt2-none --only gpt2-bf16
  python3 ci/train-compare.py --lab bin/lab-10 --dry-run-check            # predicted vs measured
  python3 ci/train-compare.py --lab bin/lab-10 --config 'small=--d-model 128 --batch 8'

The configurations are those of `lab-10` (the chapter's tables), listed by `lab-10 configs`.
`lab-10 --pytorch FILE` reads the lines `--out FILE` writes. Runs on a machine with one NVIDIA GPU, PyTorch and a release build of lab-10. A run that
fails (out of memory, an error, a timeout) is a row that says so, with the message under
the table, not a crash.
`--dry-run-check` also runs ours with `--dry-run --capacity <the GPU's total memory>` and
adds the predicted peak reserved and its error against ours measured on the GPU.
`--out FILE` writes every run's JSON, one line each, with the command that made it."""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20

# The chapter's configurations are the lab's own: `lab-10 configs` prints them (name, a
# tab, the flags both drivers take), from labs/lab-10-training-memory/src/experiments/
# configs.rs, the one list that `lab-10` (the chapter's tables) and this script compare.
QUICK = ["tutorial-none", "tutorial-accum4", "tutorial-bf16"]


def chapter_configs(lab):
    """{name: flags} of the chapter's configurations, as `lab-10 configs` lists them."""
    try:
        done = subprocess.run([lab, "configs"], capture_output=True, text=True, check=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        sys.exit(f"train-compare.py: `{lab} configs` did not list the configurations ({e})")
    configs = {}
    for line in done.stdout.splitlines():
        name, sep, flags = line.partition("\t")
        if not sep:
            sys.exit(f"train-compare.py: `{lab} configs` printed {line!r}, not NAME<tab>FLAGS")
        configs[name] = flags
    return configs


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="lab-10 train against ci/pytorch-train.py on one GPU, as a markdown table")
    p.add_argument("--lab", required=True, help="the lab-10 binary")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only these configurations (repeat, or comma-separate)")
    p.add_argument("--quick", action="store_true", help="a small subset: " + ", ".join(QUICK))
    p.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS",
                   help="an extra configuration, as flags both drivers take")
    p.add_argument("--list", action="store_true", help="list the configurations and exit")
    p.add_argument("--steps", type=int, help="optimizer steps (both drivers' default: 5)")
    p.add_argument("--warmup", type=int, help="steps left out of step_ms (default: 1)")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    p.add_argument("--python", default=sys.executable, help="the Python with torch")
    p.add_argument("--pytorch-script", default=os.path.join(HERE, "pytorch-train.py"))
    p.add_argument("--out", help="write every run's JSON here, one line each")
    p.add_argument("--dry-run-check", action="store_true",
                   help="also predict each configuration's peaks with `--dry-run`")
    p.add_argument("--capacity", help="the dry run's capacity (default: the GPU's total)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    a = p.parse_args(argv)
    if not os.path.isfile(a.lab):
        p.error(f"--lab {a.lab}: no such file (build it: cargo build --release -p lab-10)")
    configs = chapter_configs(a.lab)
    for item in a.config:
        name, sep, flags = item.partition("=")
        if not sep or not name.strip():
            p.error(f"--config {item!r}: expected NAME=FLAGS")
        configs[name.strip()] = flags
    if a.list:
        for name, flags in configs.items():
            print(f"{name:<28} {flags}")
        sys.exit(0)
    wanted = [n.strip() for item in a.only for n in item.split(",") if n.strip()]
    if a.quick:
        wanted += [n for n in QUICK if n not in wanted]
    if a.config and not wanted:
        wanted = [item.partition("=")[0].strip() for item in a.config]
    unknown = [n for n in wanted if n not in configs]
    if unknown:
        p.error(f"unknown configuration {', '.join(unknown)}; known: {', '.join(configs)}")
    a.selected = [(n, configs[n]) for n in (wanted or configs)]
    if not os.path.isfile(a.pytorch_script):
        p.error(f"--pytorch-script {a.pytorch_script}: no such file")
    return a


def common_flags(args, flags):
    out = shlex.split(flags)
    if args.steps is not None:
        out += ["--steps", str(args.steps)]
    if args.warmup is not None:
        out += ["--warmup", str(args.warmup)]
    return out + ["--json"]


def last_json(text):
    """The last line of `text` that is a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def run(argv, timeout):
    """One driver run: {"argv", "rc", "seconds", "json", "error"}; error is None when it
    ran to the end, "OOM: ..." when it ran out of memory, else what went wrong."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"argv": argv, "rc": None, "seconds": timeout, "json": None,
                "error": f"timed out after {timeout:.0f} s"}
    except OSError as e:
        return {"argv": argv, "rc": None, "seconds": 0.0, "json": None,
                "error": f"cannot run: {e}"}
    result = {"argv": argv, "rc": done.returncode, "seconds": time.perf_counter() - start,
              "json": last_json(done.stdout), "error": None}
    report = result["json"]
    if report is not None and report.get("oom"):
        result["error"] = "OOM: " + str(report["oom"]).splitlines()[0]
    elif done.returncode != 0 or report is None:
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        why = lines[-1].strip() if lines else "no output"
        result["error"] = f"exit status {done.returncode}: {why}"
    result["stderr_tail"] = done.stderr[-2000:]
    return result


def gpu_capacity(device):
    """The GPU's total memory in bytes, from nvidia-smi (MiB)."""
    index = device.partition(":")[2] or "0"
    try:
        text = subprocess.run(
            ["nvidia-smi", "-i", index, "--query-gpu=memory.total",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=60).stdout
        return int(text.strip().splitlines()[0]) * MIB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        sys.exit(f"train-compare.py: cannot read the GPU's memory from nvidia-smi ({e}); "
                 "give --capacity")


def mib(report, key):
    if report is None or report.get(key) is None:
        return None
    return report[key] / MIB


def fmt(value, spec):
    return "—" if value is None else format(value, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def side(result, key, scale):
    """A cell's number, or None when the run did not finish (its row says why)."""
    if result is None or result["error"] is not None or result["json"] is None:
        return None
    value = result["json"].get(key)
    return None if value is None else value / scale


def final_loss(result):
    if result is None or result["error"] is not None or result["json"] is None:
        return None
    losses = result["json"].get("losses") or []
    return losses[-1] if losses and losses[-1] is not None else None


def status(result):
    if result["error"] is None:
        return None
    if result["error"].startswith("OOM"):
        return "OOM"
    return "timeout" if result["error"].startswith("timed out") else "failed"


def table(rows, dry):
    head = ["configuration", "alloc ours MiB", "alloc PyTorch MiB", "alloc ratio",
            "reserved ours MiB", "reserved PyTorch MiB", "step ours ms", "step PyTorch ms",
            "step ratio", "loss ours", "loss PyTorch"]
    if dry:
        head += ["dry-run reserved MiB", "dry-run error %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for name, ours, torch_, predicted in rows:
        a_o, a_t = side(ours, "peak_allocated", MIB), side(torch_, "peak_allocated", MIB)
        r_o, r_t = side(ours, "peak_reserved", MIB), side(torch_, "peak_reserved", MIB)
        s_o, s_t = side(ours, "step_ms", 1), side(torch_, "step_ms", 1)
        cells = [name, fmt(a_o, ".1f"), fmt(a_t, ".1f"), fmt(ratio(a_o, a_t), ".2f"),
                 fmt(r_o, ".1f"), fmt(r_t, ".1f"), fmt(s_o, ".2f"), fmt(s_t, ".2f"),
                 fmt(ratio(s_o, s_t), ".2f"), fmt(final_loss(ours), ".4f"),
                 fmt(final_loss(torch_), ".4f")]
        for label, result, columns in (("ours", ours, (1, 4, 6, 9)),
                                       ("PyTorch", torch_, (2, 5, 7, 10))):
            if status(result):
                for c in columns:
                    cells[c] = status(result)
                notes.append(f"{name}, {label}: {result['error']}")
        if dry:
            p = side(predicted, "peak_reserved", MIB)
            err = None if p is None or r_o is None else (p - r_o) / r_o * 100
            cells += [fmt(p, ".1f"), fmt(err, "+.1f")]
            if predicted is not None and status(predicted):
                cells[-2] = status(predicted)
                notes.append(f"{name}, dry run: {predicted['error']}")
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    capacity = None
    if args.dry_run_check:
        capacity = args.capacity or str(gpu_capacity(args.device))
    out = open(args.out, "w") if args.out else None
    rows = []
    for name, flags in args.selected:
        base = common_flags(args, flags)
        runs = {
            "ours": [args.lab, "train"] + base + ["--device", args.device],
            "pytorch": [args.python, args.pytorch_script] + base + ["--device", args.device],
        }
        if capacity is not None:
            runs["ours-dry"] = [args.lab, "train"] + base + ["--dry-run", "--capacity", capacity]
        results = {}
        for label, argv_ in runs.items():
            print(f"{name}: {label} ...", file=sys.stderr, flush=True)
            results[label] = run(argv_, args.timeout)
            if out:
                out.write(json.dumps(dict(results[label], config=name, side=label)) + "\n")
                out.flush()
        rows.append((name, results["ours"], results["pytorch"], results.get("ours-dry")))
    if out:
        out.close()
    print(table(rows, args.dry_run_check))


if __name__ == "__main__":
    main()
