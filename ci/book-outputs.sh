#!/usr/bin/env bash
# Copies the outputs of a GPU bundle run into the book: each lab command's log becomes
# book/src/outputs/NAME-gpu.txt under a first line naming the command as a reader would
# type it and the GPU it ran on. Usage: ci/book-outputs.sh LOGS_DIR RUN_LOG
# (LOGS_DIR: the bundle's log folder; RUN_LOG: run.sh's output, whose first line is the
# GPU's name, driver and memory as nvidia-smi prints them). Chapters include some of
# these files by line range: check them after regenerating.
set -euo pipefail
logs=$1 run_log=$2
cd "$(dirname "$0")/.."
out=book/src/outputs
IFS=, read -r gpu driver _ < <(head -n 1 "$run_log")
driver=${driver# }
note="# $gpu, driver $driver"

# The log run.sh keeps for one line of commands.txt.
log_of() { echo "$logs/$(echo "$1" | tr -c 'A-Za-z0-9._-' '_').log"; }

# emit FILE COMMAND...: one or more commands' logs, each under its command line.
emit() {
  local file=$1; shift
  : >"$out/$file"
  for line in "$@"; do
    local log
    log=$(log_of "$line")
    [ -f "$log" ] || { echo "no log for '$line' in $logs" >&2; exit 1; }
    local bin=${line%% *} args=${line#* }
    args=${args//\{shared\}/..\/shared}
    echo "\$ cargo run --release -p $bin -- $args   $note" >>"$out/$file"
    cat "$log" >>"$out/$file"
  done
  echo "wrote $out/$file"
}

emit lab-01-gpu.txt "lab-01 --device cuda"
emit lab-02-gpu.txt "lab-02 --device cuda"
emit lab-02-bench-gpu.txt "lab-02 bench --device cuda --json"
emit lab-02-replay-gpu.txt \
  "lab-02 replay {shared}/traces/resnet50_fp32.trace.csv.gz --device cuda --json" \
  "lab-02 replay {shared}/traces/gpt2_fp32.trace.csv.gz --device cuda --json" \
  "lab-02 replay {shared}/traces/gpt2_varlen.trace.csv.gz --device cuda --json" \
  "lab-02 replay {shared}/traces/seed_transformer_b64.trace.csv.gz --device cuda --json" \
  "lab-02 replay {shared}/traces/seed_transformer_accum4x16.trace.csv.gz --device cuda --json" \
  "lab-02 replay {shared}/traces/gpt2_fp32.trace.csv.gz --device cuda --json --conf expandable_segments:False" \
  "lab-02 replay {shared}/traces/gpt2_varlen.trace.csv.gz --device cuda --json --conf expandable_segments:False"
emit lab-03-demo-gpu.txt "lab-03 demo --device cuda -o lab-03-demo"
emit lab-03-smi-gpu.txt "lab-03 smi --device cuda"
emit lab-06-gpu.txt "lab-06 --device cuda"
emit lab-08-gpu.txt "lab-08 --device cuda"
emit lab-08-bench-gpu.txt "lab-08 bench --device cuda --json"
mkdir -p book/src/figures/lab-03/demo-gpu
cp "$logs"/lab-03-demo/*.svg book/src/figures/lab-03/demo-gpu/
echo "copied the demo's pictures to book/src/figures/lab-03/demo-gpu"
