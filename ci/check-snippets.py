#!/usr/bin/env python3
"""Runs every PyTorch snippet the book shows (book/snippets/NN-topic/*.py), so that the
code a reader copies from a chapter is known to run, and keeps what each printed.

  python3 ci/check-snippets.py                 # run them all, print a summary
  python3 ci/check-snippets.py --out DIR       # also write DIR/NN-topic/NAME.txt
  python3 ci/check-snippets.py --require-gpu   # fail (not skip) without torch and CUDA

A snippet is a whole Python program: it imports what it needs, runs on "cuda" and prints
what the chapter discusses. It must finish in --timeout seconds (default 120). Without
PyTorch, or without a CUDA device, the snippets are listed and skipped (exit 0) unless
--require-gpu is given: the GPU pipeline runs them with it, next to the labs' bundle, and
ci/book-outputs.sh turns the files it writes into the outputs the chapters include."""

import argparse
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SNIPPETS = ROOT / "book" / "snippets"


def have_cuda_torch():
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False, "python could not be started"
    if r.returncode == 0:
        return True, ""
    if b"ModuleNotFoundError" in r.stderr:
        return False, "PyTorch is not installed"
    return False, "PyTorch sees no CUDA device"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, help="folder for each snippet's output")
    ap.add_argument("--require-gpu", action="store_true",
                    help="fail when PyTorch or a CUDA device is missing")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per snippet")
    ap.add_argument("--only", default="", help="run only snippets whose path contains this")
    args = ap.parse_args()

    files = sorted(p for p in SNIPPETS.glob("*/*.py") if args.only in str(p))
    if not files:
        print(f"no snippets under {SNIPPETS.relative_to(ROOT)}", file=sys.stderr)
        return 1
    ok, why = have_cuda_torch()
    if not ok:
        print(f"{len(files)} snippets not run: {why}")
        return 1 if args.require_gpu else 0

    failed = []
    for f in files:
        rel = f.relative_to(SNIPPETS)
        t = time.perf_counter()
        try:
            r = subprocess.run([sys.executable, f.name], cwd=f.parent, capture_output=True,
                               text=True, timeout=args.timeout)
            code, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            code, out, err = "timeout", e.stdout or "", f"timed out after {args.timeout:.0f} s"
            out = out.decode() if isinstance(out, bytes) else out
        seconds = time.perf_counter() - t
        status = "ok" if code == 0 else "FAILED"
        # Flushed a line at a time: a run cut short by a time limit still shows how far
        # it got (the pipeline sends this to a file, which Python would buffer).
        print(f"{str(rel):50} {status:7} {seconds:6.1f} s", flush=True)
        if code != 0:
            failed.append(str(rel))
            print("\n".join(("  | " + line) for line in (out + err).splitlines()[-20:]), flush=True)
            continue
        if args.out:
            dest = args.out / rel.with_suffix(".txt")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(out)
    print(f"PyTorch snippets: {len(files) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
