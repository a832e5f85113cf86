#!/usr/bin/env bash
# Builds every test binary and every lab binary of the workspace into one self-contained
# folder that runs on a GPU machine without a Rust toolchain: copy the folder there and
# run its run.sh. Usage: ci/build-bundle.sh [OUT_DIR]   (default: .gpu-bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu-bundle}

rm -rf "$out"
mkdir -p "$out/bin" "$out/tests"

echo "building lab binaries..." >&2
cargo build --release --workspace --bins --quiet
echo "building test binaries..." >&2
executables=$(cargo test --release --workspace --no-run --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | sort -u)

for exe in $executables; do
  name=$(basename "$exe")
  case "$exe" in
    */deps/*) cp "$exe" "$out/tests/$name" ;;  # test harnesses
    *) ;;                                     # the lab binaries, copied below
  esac
done
for manifest in labs/lab-*/Cargo.toml; do
  pkg=$(sed -n 's/^name = "\(lab-[0-9]*\)"/\1/p' "$manifest" | head -n 1)
  cp "${CARGO_TARGET_DIR:-target}/release/$pkg" "$out/bin/$pkg"
done
# The matrix-product bench (labs/core/benches/gemm.rs), so that its figures land in the
# same GPU run as ci/pytorch-reference.py's: bin/bench-gemm.
echo "building the gemm bench..." >&2
bench=$(cargo bench -p labs-core --bench gemm --no-run --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | tail -n 1)
cp "$bench" "$out/bin/bench-gemm"
# The elementwise bandwidth bench (labs/core/benches/elementwise.rs): bin/bench-elementwise,
# beside ci/pytorch-reference.py's "elementwise" key.
echo "building the elementwise bench..." >&2
bench=$(cargo bench -p labs-core --bench elementwise --no-run --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | tail -n 1)
cp "$bench" "$out/bin/bench-elementwise"
# The training-step bench (labs/core/benches/train_step.rs): bin/bench-train-step, beside
# ci/pytorch-reference.py's "train_step" key (passed to it as --pytorch FILE).
echo "building the training-step bench..." >&2
bench=$(cargo bench -p labs-core --bench train_step --no-run --message-format=json 2>/dev/null |
  grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/' | tail -n 1)
cp "$bench" "$out/bin/bench-train-step"
# Debug info goes; symbol names stay, so that backtraces (the memory history's, the
# leak guard's) name their functions on the GPU machine too.
# lab-09 keeps its line tables: its leak guard names the source line of each leak, and
# its tests check that line (the release profile keeps line tables for this reason);
# lab-05 too: its out-of-memory report names the line of each large live allocation.
for f in "$out"/bin/* "$out"/tests/*; do
  case "$(basename "$f")" in
    lab-09 | lab09-* | lab-05 | lab05-*) ;;
    *) strip --strip-debug "$f" 2>/dev/null || true ;;
  esac
done

# The test data the suites and labs read (traces, snapshots): the repository's data/,
# which run.sh points LABS_DATA_DIR at.
cp -r data "$out/data"
cp ci/gpu-commands.txt "$out/commands.txt"
# The PyTorch snippets the chapters show, and their runner (run.sh runs them last).
mkdir -p "$out/ci" "$out/book"
cp ci/check-snippets.py "$out/ci/"
# PyTorch's figures, measured by run.sh before the labs so that every bench prints them.
cp ci/pytorch-reference.py "$out/ci/"
# The training and collectives twins, run by hand from the bundle's folder:
# python3 ci/train-compare.py --lab bin/lab-10; torchrun ... ci/pytorch-collectives.py.
cp ci/pytorch-train.py ci/pytorch-replay.py ci/train-compare.py ci/pytorch-collectives.py \
   ci/data-parallel-scaling.py ci/zero-ladder.py ci/fit-table.py ci/step-table.py ci/json_report.py \
   ci/pytorch-fixtures.py ci/pytorch-graphs.py ci/replay-table.py "$out/ci/"
cp -r book/snippets "$out/book/snippets"
cp ci/run.sh "$out/run.sh"
chmod +x "$out/run.sh"
du -sh "$out" >&2
