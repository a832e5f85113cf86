#!/usr/bin/env bash
# Writes the labs' outputs that the book includes, one file per experiment, each under a
# first line naming the command as a reader would type it (and, for a GPU run, the GPU).
# Chapters include these files whole, never by line range (ci/check-includes.sh rejects
# that), so regenerating them cannot shift what a chapter shows.
#
#   ci/book-outputs.sh gpu LOGS_DIR RUN_LOG [LAB]
#                                             from a GPU bundle run (ci/run.sh): LOGS_DIR
#                                             is its log folder, RUN_LOG its output, whose
#                                             first line is nvidia-smi's GPU name, driver
#                                             and memory; with LAB (lab-10), only that
#                                             lab's files, from a run of its lines alone
#   ci/book-outputs.sh multi LOGS_DIR RUN_LOG from the multi part of a GPU bundle run
#                                             (RUN_PARTS=multi, two GPUs or more): lab-04's
#                                             outputs and the data-parallel scaling table
#   ci/book-outputs.sh sim [LAB]              runs the labs here, on the simulated GPU;
#                                             with LAB (lab-04), only that lab's files
#
# BOOK_OUTPUTS_BIN_DIR=DIR makes the sim branch use the binaries already built in DIR
# instead of building them.
#
# For each lab command it writes the whole output (for the chapters' "full output"
# sections) and, where the output has several experiments, each experiment alone. An
# experiment starts at its heading line (PARTS below, matched as line prefixes, in
# order) and ends before the next one. A heading that is missing is an error, so a
# renamed heading fails here instead of leaving an old file in the book; a part named
# with a trailing `?` may be absent (output that one device prints and the other not),
# and a part named again continues the earlier part's file.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=book/src/outputs

# The experiments of each command's text output: "file stem=heading prefix".
LAB01_PARTS=(
  "lazy-init=Lazy initialisation on"
  "create=Creating tensors"
  "to=tensor.to(device)"
  "mixed-devices=Adding a tensor on"
  "raw-alloc=Raw device allocation on"
  "pageable-copies=Copies between pageable host memory"
  "kernel-timing=Timing one kernel on"
)
LAB02_PARTS=(
  "pair-cost=1. The cost of an alloc+free pair"
  "reuse=2. Reuse: allocate, drop"
  "kept-vs-dropped=3. 100 tensors"
  "empty-cache=4. What empty_cache really returns"
  "memory-summary=|=========="
  "empty-cache=(only whole segments"
  "fragmentation=5. Fragmentation on real traces"
)
LAB03_DEMO_PARTS=(
  "demo-loop=memory_allocated and memory_reserved through"
  "demo-summary=memory_summary() after the loop"
  "demo-replay=The recorded history replayed"
  "demo-files=wrote "
  "demo-leak=A planted leak"
)
LAB05_PARTS=(
  "explain=1. An out-of-memory error, explained"
  "explain-fraction=1b. The same under a memory fraction"
  "too-large=1c. Requests larger than the device"
  "fragmentation=2. Fragmentation:"
  "pending-free=3. A block freed on another stream"
  "recovery=4. Recovering from out-of-memory"
  "finder=5. A batch-size finder"
)
LAB06_PARTS=(
  "event=An event recorded after a kernel"
  "timing=Timing 10 kernels"
  "two-streams=Independent work on"
  "wait-event=A consumer stream reading"
  "priorities=An urgent kernel behind a backlog"
  "record-stream=A block freed on stream A"
  "threads-note?=(On sim:"
)
LAB07_PARTS=(
  "full-vs-mixed=1. Full against mixed precision"
  "categories=2. Where the memory goes"
  "underflow=3a. Float16 gradients that underflow"
  "overflow=3b. A forced overflow"
  "curves=4. Loss curves"
  "gemm=5. Matrix product throughput"
  "driver=6a. Tutorial 004's step on the training driver"
  "driver-gpt2=6b. "
)
LAB08_PARTS=(
  "non-blocking=to("
  "loop=Training-like loop on"
  "pinned-pool=The training loop's pinned-memory pool"
)
LAB09_PARTS=(
  "running-loss=1. The graph a running loss keeps alive"
  "eval=2a. An evaluation pass"
  "logged=2b. "
  "drops=3. What dropping frees"
  "unused-result=4. c = a @ b"
  "leak-guard=5. The leak guard"
)
LAB10_PARTS=(
  "tutorial=1. Tutorial 004's experiment"
  "techniques=2. Techniques on the tutorial's model"
  "gpt2=3. GPT-2 small"
  "categories=4. Where the memory goes"
  "predicted=5. Predicted before running"
  "offload?=6. Offload's copies against compute"
)
LAB04_PARTS=(
  "devices=1. The devices"
  "caches=2. One caching allocator per device"
  "mismatch=3. An operation across devices"
  "bandwidth=4. Copy bandwidth from"
  "replicate=5. DataParallel-style replication"
)
LAB08_BENCH_PARTS=(
  "bench-bandwidth=Copy bandwidth between host memory"
  "bench-best=Best bandwidth over all sizes"
  "bench-loop=A training-like loop on"
)
LAB11_PARTS=(
  "bandwidth=Copy bandwidth between host memory"
  "pin-cost=Getting host memory for copies"
  "mapped=A kernel reading"
  "managed=Managed memory: a kernel reading"
  "beyond-device=Asking "
)
LAB12_PARTS=(
  "gap=2. The gap between NVML and memory_reserved"
  "poll=3. Polling NVML"
  "processes=4. Which process holds what"
)
LAB13_PARTS=(
  "launches=A chain of small kernels"
  "pools=A region of"
  "rules=What a capture on"
  "scoped=A scoped pool on"
)
# ci/pytorch-graphs.py's tables, lab-13's twin.
PYGRAPHS_PARTS=(
  "pytorch-launches=A chain of small kernels:"
  "pytorch-pools=A region of"
  "pytorch-rules=What a capture forbids"
  "pytorch-scoped=A scoped pool:"
)

# header LINE: the first line of an output file for one line of commands ("lab-02 replay
# {data}/traces/x --device sim"), as a reader in the repository would type it.
header() {
  local bin=${1%% *} args=
  [ "$1" != "$bin" ] && args=${1#* }
  args=${args//\{data\}/data}
  args=${args//\{pytorch\}/pytorch-reference.json}
  args=${args//\{ci\}/ci}
  if [ "$bin" = python3 ]; then
    echo "\$ python3 $args$note"
  elif [ -n "$args" ]; then
    echo "\$ cargo run --release -p $bin -- $args$note"
  else
    echo "\$ cargo run --release -p $bin$note"
  fi
}

# wanted PATH: whether PATH (lab-04/all-sim, lab-04) belongs to the lab the run is
# limited to (`sim LAB`), or to any lab when none is named.
only=
wanted() { [ -z "$only" ] || [ "${1%%/*}" = "$only" ]; }

# script FILE LINE: the output of a script's command line (python3 ci/...), under its
# own header.
script() {
  local file=$out/$1.txt line=$2
  wanted "$1" || return 0
  mkdir -p "$(dirname "$file")"
  { echo "\$ ${line//\{ci\}/ci}$note"; cat "$(output_of "$line")"; } >"$file"
  echo "wrote $file"
}

# whole FILE LINE...: the outputs of one or more command lines, each under its header.
whole() {
  local file=$out/$1.txt first=1
  wanted "$1" || return 0
  shift
  mkdir -p "$(dirname "$file")"
  {
    for line in "$@"; do
      [ $first = 1 ] || echo
      first=0
      header "$line"
      cat "$(output_of "$line")"
    done
  } >"$file"
  echo "wrote $file"
}

# parts DIR LINE PART...: each experiment of LINE's output in DIR/STEM-$device.txt.
parts() {
  local dir=$out/$1 line=$2 log specs=
  wanted "$1" || return 0
  shift 2
  log=$(output_of "$line")
  for part in "$@"; do
    local stem=${part%%=*}
    rm -f "$dir/${stem%\?}-$device.txt"
    specs+="${stem}"$'\t'"${part#*=}"$'\n'
  done
  mkdir -p "$dir"
  SPECS=$specs HEADER=$(header "$line") DIR=$dir DEVICE=$device LOG=$log awk '
    BEGIN {
      n = split(ENVIRON["SPECS"], rows, "\n") - 1
      for (i = 1; i <= n; i++) {
        tab = index(rows[i], "\t")
        stem[i] = substr(rows[i], 1, tab - 1)
        prefix[i] = substr(rows[i], tab + 1)
        optional[i] = stem[i] ~ /\?$/
        sub(/\?$/, "", stem[i])
      }
    }
    {
      # The next heading, skipping optional ones this output does not have.
      for (j = k + 1; j <= n; j++) {
        if (index($0, prefix[j]) == 1) { k = j; found[j] = 1; break }
        if (!optional[j]) break
      }
      if (k > 0) text[k, ++len[k]] = $0
    }
    END {
      for (i = 1; i <= n; i++) {
        if (found[i]) continue
        if (optional[i]) continue
        printf "%s: no line starts with \"%s\" (part %s, after %s)\n", ENVIRON["LOG"], prefix[i], stem[i], (i > 1 ? stem[i - 1] : "the start") > "/dev/stderr"
        failed = 1
      }
      if (failed) exit 1
      # One file per stem: a stem named again continues its file (its text around
      # another part, such as a table printed in the middle of an experiment).
      for (i = 1; i <= n; i++) {
        if (!found[i] || done[stem[i]]) continue
        done[stem[i]] = 1
        file = ENVIRON["DIR"] "/" stem[i] "-" ENVIRON["DEVICE"] ".txt"
        print ENVIRON["HEADER"] > file
        for (j = i; j <= n; j++) {
          if (!found[j] || stem[j] != stem[i]) continue
          while (len[j] > 0 && text[j, len[j]] ~ /^[ \t]*$/) len[j]--
          for (l = 1; l <= len[j]; l++) print text[j, l] > file
        }
        close(file)
        print "wrote " file
      }
    }' "$log"
}

case "${1:-}" in
gpu)
  [ $# -eq 3 ] || [ $# -eq 4 ] || { echo "usage: $0 gpu LOGS_DIR RUN_LOG [LAB]" >&2; exit 2; }
  logs=$2 run_log=$3 device=gpu only=${4:-}
  IFS=, read -r gpu driver _ < <(head -n 1 "$run_log")
  note="   # $gpu, driver ${driver# }"
  # The log run.sh keeps for one line of commands.txt.
  output_of() {
    local log
    log="$logs/$(echo "$1" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-200).log"
    [ -f "$log" ] || { echo "no log for '$1' in $logs" >&2; exit 1; }
    echo "$log"
  }

  whole lab-01/all-gpu "lab-01 --device cuda"
  parts lab-01 "lab-01 --device cuda" "${LAB01_PARTS[@]}"
  whole lab-02/all-gpu "lab-02 --device cuda"
  parts lab-02 "lab-02 --device cuda" "${LAB02_PARTS[@]}"
  whole lab-02/bench-gpu "lab-02 bench --device cuda --json"
  whole lab-02/replay-gpu \
    "lab-02 replay {data}/traces/resnet50_fp32.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/traces/gpt2_fp32.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/traces/gpt2_varlen.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/traces/seed_transformer_b64.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/traces/seed_transformer_accum4x16.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/traces/gpt2_fp32.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs" \
    "lab-02 replay {data}/traces/gpt2_varlen.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs" \
    "lab-02 replay {data}/traces/resnet50_fp32.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs" \
    "lab-02 replay {data}/traces/seed_transformer_b64.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs" \
    "lab-02 replay {data}/traces/seed_transformer_accum4x16.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs"
  whole lab-02/mappings-gpu \
    "lab-02 mappings resnet50_fp32 --device cuda --pytorch {ci}/pytorch-replay.py" \
    "lab-02 mappings gpt2_fp32 --device cuda --pytorch {ci}/pytorch-replay.py" \
    "lab-02 mappings gpt2_varlen --device cuda --pytorch {ci}/pytorch-replay.py" \
    "lab-02 mappings seed_transformer_b64 --device cuda --pytorch {ci}/pytorch-replay.py" \
    "lab-02 mappings seed_transformer_accum4x16 --device cuda --pytorch {ci}/pytorch-replay.py"
  whole lab-02/replay-checkpointed-gpu \
    "lab-02 replay {data}/synthetic/checkpointed_gpt2_fixed.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/synthetic/checkpointed_gpt2_fixed.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs" \
    "lab-02 replay {data}/synthetic/checkpointed_gpt2_fixed.trace.csv.gz --device cuda --json --conf preset:labs,max_mapping_mb:64" \
    "python3 {ci}/pytorch-replay.py {data}/synthetic/checkpointed_gpt2_fixed.trace.csv.gz --conf backend:cudaMallocAsync" \
    "lab-02 replay {data}/synthetic/checkpointed_gpt2_varlen.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py" \
    "lab-02 replay {data}/synthetic/checkpointed_gpt2_varlen.trace.csv.gz --device cuda --json --pytorch {ci}/pytorch-replay.py --conf preset:labs" \
    "lab-02 replay {data}/synthetic/checkpointed_gpt2_varlen.trace.csv.gz --device cuda --json --conf preset:labs,max_mapping_mb:64" \
    "python3 {ci}/pytorch-replay.py {data}/synthetic/checkpointed_gpt2_varlen.trace.csv.gz --conf backend:cudaMallocAsync"
  whole lab-02/replay-pytorch-gpu \
    "lab-02 replay {data}/traces/gpt2_fp32.trace.csv.gz --device cuda --pytorch {ci}/pytorch-replay.py" \
    "python3 {ci}/pytorch-replay.py {data}/traces/resnet50_fp32.trace.csv.gz --conf backend:cudaMallocAsync" \
    "python3 {ci}/pytorch-replay.py {data}/traces/gpt2_fp32.trace.csv.gz --conf backend:cudaMallocAsync" \
    "python3 {ci}/pytorch-replay.py {data}/traces/gpt2_varlen.trace.csv.gz --conf backend:cudaMallocAsync" \
    "python3 {ci}/pytorch-replay.py {data}/traces/seed_transformer_b64.trace.csv.gz --conf backend:cudaMallocAsync" \
    "python3 {ci}/pytorch-replay.py {data}/traces/seed_transformer_accum4x16.trace.csv.gz --conf backend:cudaMallocAsync"
  whole lab-03/demo-gpu "lab-03 demo --device cuda -o lab-03-demo"
  parts lab-03 "lab-03 demo --device cuda -o lab-03-demo" "${LAB03_DEMO_PARTS[@]}"
  whole lab-05/all-gpu "lab-05 --device cuda"
  parts lab-05 "lab-05 --device cuda" "${LAB05_PARTS[@]}"
  whole lab-05/share-gpu "lab-05 share --device cuda"
  whole lab-05/fit-gpu "lab-05 fit --capacity 24GiB --model mlp --device cuda"
  whole lab-05/fit-transformer-gpu "lab-05 fit --capacity 24GiB --model transformer --device cuda"
  whole lab-05/fit-gpt2-gpu \
    "lab-05 fit --capacity 24GiB --model gpt2 --device cuda" \
    "lab-05 fit --capacity 24GiB --model gpt2 --checkpoint layers --amp bf16 --device cuda"
  whole lab-06/all-gpu "lab-06 --device cuda"
  parts lab-06 "lab-06 --device cuda" "${LAB06_PARTS[@]}"
  whole lab-07/all-gpu "lab-07 --device cuda --pytorch {ci}/pytorch-train.py"
  parts lab-07 "lab-07 --device cuda --pytorch {ci}/pytorch-train.py" "${LAB07_PARTS[@]}"
  whole lab-08/all-gpu "lab-08 --device cuda"
  parts lab-08 "lab-08 --device cuda" "${LAB08_PARTS[@]}"
  whole lab-08/bench-gpu "lab-08 bench --device cuda --json --pytorch {pytorch}"

  # PyTorch's figures from the same run (run.sh wrote them before the labs ran).
  if [ -n "$only" ]; then
    :
  elif [ -f "$logs/pytorch-reference.json" ]; then
    { echo "\$ python3 ci/pytorch-reference.py > pytorch-reference.json$note"; cat "$logs/pytorch-reference.json"; } \
      >"$out/pytorch-reference-gpu.txt"
    echo "wrote $out/pytorch-reference-gpu.txt"
  else
    echo "no pytorch-reference.json in $logs: $out/pytorch-reference-gpu.txt left as it was" >&2
  fi
  whole lab-09/all-gpu "lab-09 --device cuda"
  parts lab-09 "lab-09 --device cuda" "${LAB09_PARTS[@]}"
  whole lab-10/all-gpu "lab-10 --device cuda --pytorch {ci}/pytorch-train.py --pictures lab-10-pictures"
  parts lab-10 "lab-10 --device cuda --pytorch {ci}/pytorch-train.py --pictures lab-10-pictures" "${LAB10_PARTS[@]}"
  whole lab-10/formula-gpu "lab-10 formula --device cuda"
  whole lab-10/profile-tutorial-gpu "lab-10 train --device cuda --model transformer --d-model 256 --batch 64 --seq 100 --steps 8 --profile"
  whole lab-10/profile-gpt2-bf16-gpu "lab-10 train --device cuda --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16 --steps 4 --profile"
  whole lab-10/profile-gpt2-fused-gpu "lab-10 train --device cuda --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16 --steps 4 --profile --fused-classifier"
  script lab-10/step-gpu "python3 {ci}/step-table.py step-labs.json step-labs-fused.json step-eager.json step-autotune.json step-compile.json"
  script lab-10/step-b64-gpu "python3 {ci}/step-table.py big-labs.json big-labs-fused.json big-eager.json big-compile.json"
  script lab-10/graph-tutorial-gpu "python3 {ci}/step-table.py graph-tutorial-labs.json graph-tutorial-labs-graph.json graph-tutorial-eager.json graph-tutorial-pytorch-graph.json"
  script lab-10/graph-gpt2-gpu "python3 {ci}/step-table.py step-labs.json graph-gpt2-labs-graph.json step-eager.json graph-gpt2-pytorch-graph.json"
  script lab-13/async-step-gpu "python3 {ci}/step-table.py graph-tutorial-labs.json async-tutorial-labs.json graph-tutorial-eager.json async-tutorial-pytorch.json"
  script lab-13/async-replay-gpu "python3 {ci}/replay-table.py async-replay-resnet50_fp32.json async-replay-gpt2_fp32.json async-replay-gpt2_varlen.json async-replay-seed_transformer_b64.json async-replay-seed_transformer_accum4x16.json"
  whole lab-10/compare-gpt2-bf16-gpu "lab-03 compare gpt2-bf16-cuda.json gpt2-bf16-pytorch.pickle"
  whole lab-10/compare-tutorial-gpu "lab-03 compare tutorial-cuda.json tutorial-pytorch.pickle"
  whole lab-10/compare-dry-gpu "lab-03 compare gpt2-bf16-dry.json gpt2-bf16-cuda.json"
  whole lab-10/tutorial-summary-gpu "lab-03 summary tutorial-cuda.json"
  whole lab-10/steady-gpu \
    "lab-10 train --device cuda --json --steps 8" \
    "lab-10 train --device cuda --json --steps 8 --conf preset:labs" \
    "lab-10 train --device cuda --json --steps 8 --conf expandable_segments:True" \
    "python3 {ci}/pytorch-train.py --json --steps 8" \
    "python3 {ci}/pytorch-train.py --json --steps 8 --conf expandable_segments:True" \
    "lab-10 train --device cuda --json --steps 8 --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16" \
    "lab-10 train --device cuda --json --steps 8 --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16 --conf preset:labs" \
    "lab-10 train --device cuda --json --steps 8 --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16 --conf expandable_segments:True" \
    "python3 {ci}/pytorch-train.py --json --steps 8 --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16" \
    "python3 {ci}/pytorch-train.py --json --steps 8 --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16 --conf expandable_segments:True" \
    "lab-10 train --dry-run --gemm-workspace 32MiB --json --steps 8 --conf preset:labs" \
    "lab-10 train --dry-run --gemm-workspace 32MiB --json --steps 8 --model gpt2 --optimizer adamw --batch 8 --seq 1024 --amp bf16 --conf preset:labs"

  whole lab-11/all-gpu "lab-11 --device cuda"
  parts lab-11 "lab-11 --device cuda" "${LAB11_PARTS[@]}"

  whole lab-12/smi-gpu "lab-12 smi --device cuda"
  parts lab-12 "lab-12 --device cuda" "${LAB12_PARTS[@]}"

  whole lab-13/all-gpu "lab-13 --device cuda"
  parts lab-13 "lab-13 --device cuda" "${LAB13_PARTS[@]}"
  whole lab-13/pytorch-gpu "python3 {ci}/pytorch-graphs.py"
  parts lab-13 "python3 {ci}/pytorch-graphs.py" "${PYGRAPHS_PARTS[@]}"

  # What each PyTorch snippet printed (ci/check-snippets.py, run by run.sh).
  if [ -z "$only" ] && [ -d "$logs/snippets" ]; then
    while IFS= read -r txt; do
      rel=${txt#"$logs/snippets/"}
      dest=$out/snippets/$rel
      mkdir -p "$(dirname "$dest")"
      { echo "\$ python3 book/snippets/${rel%.txt}.py$note"; cat "$txt"; } >"$dest"
      echo "wrote $dest"
    done < <(find "$logs/snippets" -name '*.txt' | sort)
  fi

  if [ -d "$logs/lab-03-demo" ]; then
    mkdir -p book/src/figures/lab-03/demo-gpu
    cp "$logs"/lab-03-demo/*.svg book/src/figures/lab-03/demo-gpu/
    echo "copied the demo's pictures to book/src/figures/lab-03/demo-gpu"
  fi
  if [ -f "$logs/tutorial-cuda-view.html" ]; then
    mkdir -p book/src/figures/lab-10
    cp "$logs/tutorial-cuda-view.html" book/src/figures/lab-10/tutorial-view.html
    echo "copied the tutorial run's snapshot viewer to book/src/figures/lab-10/tutorial-view.html"
  fi
  if [ -d "$logs/lab-10-pictures" ]; then
    mkdir -p book/src/figures/lab-10
    cp "$logs"/lab-10-pictures/*.svg book/src/figures/lab-10/
    echo "copied lab-10's pictures to book/src/figures/lab-10"
  fi
  ;;
multi)
  [ $# -eq 3 ] || { echo "usage: $0 multi LOGS_DIR RUN_LOG" >&2; exit 2; }
  logs=$2 run_log=$3 device=gpu
  # nvidia-smi's first lines, one per GPU: "2 x NAME" when they are alike.
  IFS=, read -r gpu driver _ < <(head -n 1 "$run_log")
  count=$(awk 'NR == 1 { first = $0 } $0 != first { exit } { n++ } END { print n }' "$run_log")
  note="   # $count x $gpu, driver ${driver# }"
  # The log run.sh keeps for one "multi: " line of commands.txt (without the prefix).
  output_of() {
    local log
    log="$logs/$(echo "$1" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-200).log"
    [ -f "$log" ] || { echo "no log for '$1' in $logs" >&2; exit 1; }
    echo "$log"
  }

  whole lab-04/all-gpu "lab-04 --device cuda"
  parts lab-04 "lab-04 --device cuda" "${LAB04_PARTS[@]}"
  whole lab-04/collectives-gpu "lab-04 --device cuda collectives --pytorch pytorch-collectives.json"
  whole lab-04/ddp-gpu "lab-04 --device cuda ddp"
  whole lab-04/outside-gpu "lab-04 --device cuda outside"
  script lab-04/scaling-gpu "python3 {ci}/data-parallel-scaling.py --ours lab-10-gpt2-b8-1gpu.json lab-10-gpt2-b8-ddp.json lab-10-gpt2-b8-zero1.json lab-10-gpt2-b8-zero2.json lab-10-gpt2-b8-zero3.json --pytorch pytorch-gpt2-b8-1gpu.json pytorch-gpt2-b8-ddp.json pytorch-gpt2-b8-zero1.json pytorch-gpt2-b8-zero2.json pytorch-gpt2-b8-zero3.json"
  script lab-04/ladder-gpu "python3 {ci}/zero-ladder.py --ours lab-10-xl-ddp.json lab-10-xl-zero1.json lab-10-xl-zero2.json lab-10-xl-zero3.json --dry lab-10-xl-ddp-dry.json lab-10-xl-zero1-dry.json lab-10-xl-zero2-dry.json lab-10-xl-zero3-dry.json --pytorch pytorch-xl-ddp.json pytorch-xl-zero1.json pytorch-xl-zero2.json pytorch-xl-zero3.json"
  script lab-04/medium-gpu "python3 {ci}/fit-table.py lab-10-medium-ddp.json lab-10-medium-zero3.json lab-10-medium-zero3-dry.json pytorch-medium-ddp.json pytorch-medium-zero3.json"
  # Each rung's memory over a step on rank 0, drawn by lab-10 --timeline.
  mkdir -p book/src/figures/lab-04
  for rung in ddp zero1 zero2 zero3; do
    cp "$logs/ladder-$rung.svg" book/src/figures/lab-04/
  done
  echo "copied the ladder's pictures to book/src/figures/lab-04"
  ;;
sim)
  [ $# -le 2 ] || { echo "usage: $0 sim [LAB]" >&2; exit 2; }
  device=sim note= only=${2:-}
  # The labs' defaults: no device, allocator or capacity override from the caller.
  unset LABS_DEVICE LABS_ALLOC_CONF LABS_SIM_CAPACITY LABS_SIM_DEVICES LABS_SIM_PEER LABS_DATA_DIR LABS_SHARED_DIR
  if [ -n "${BOOK_OUTPUTS_BIN_DIR:-}" ]; then
    bin_dir=$BOOK_OUTPUTS_BIN_DIR
  else
    echo "building the labs..." >&2
    if [ -n "$only" ]; then
      cargo build --release --quiet -p "$only"
    else
      cargo build --release --quiet -p lab-01 -p lab-02 -p lab-03 -p lab-04 -p lab-05 -p lab-06 -p lab-07 -p lab-08 -p lab-09 -p lab-10 -p lab-11 -p lab-12 -p lab-13
    fi
    bin_dir=${CARGO_TARGET_DIR:-$root/target}/release
  fi
  # Commands run in an empty folder that sees the repository's data/ as ./data, so that
  # files they write (an exported trace) stay out of the checkout while paths read as
  # they do from the repository's root.
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  ln -s "$root/data" "$scratch/data"
  # Each command line runs once; its output is kept for every file that shows it.
  output_of() {
    local log
    log="$scratch/$(echo "$1" | tr -c 'A-Za-z0-9._-' '_').log"
    if [ ! -f "$log" ]; then
      local bin=${1%% *} args=
      [ "$1" != "$bin" ] && args=${1#* }
      echo "running $1" >&2
      # shellcheck disable=SC2086
      (cd "$scratch" && "$bin_dir/$bin" $args) >"$log" 2>&1 ||
        { cat "$log" >&2; echo "failed: $1" >&2; exit 1; }
    fi
    echo "$log"
  }

  whole lab-01/all-sim "lab-01 --device sim"
  parts lab-01 "lab-01 --device sim" "${LAB01_PARTS[@]}"
  whole lab-02/all-sim "lab-02 --device sim"
  parts lab-02 "lab-02 --device sim" "${LAB02_PARTS[@]}"
  whole lab-02/replay-sim \
    "lab-02 replay data/traces/gpt2_varlen.trace.csv.gz --device sim" \
    "lab-02 replay data/traces/gpt2_varlen.trace.csv.gz --device sim --conf preset:labs" \
    "lab-02 replay data/traces/resnet50_fp32.trace.csv.gz --device sim --conf garbage_collection_threshold:0.6,max_split_size_mb:128"
  whole lab-03/summary-mlp "lab-03 summary data/snapshots/mlp_adam.pickle"
  # The interactive page of the same snapshot, which chapter 3 embeds.
  if wanted lab-03; then
    mkdir -p book/src/figures/lab-03/mlp-adam
    "$bin_dir/lab-03" view data/snapshots/mlp_adam.pickle -o book/src/figures/lab-03/mlp-adam/view.html
    echo "wrote book/src/figures/lab-03/mlp-adam/view.html"
  fi
  whole lab-03/whatif-sim \
    "lab-03 export-trace data/snapshots/mlp_adam.pickle -o mlp_adam.trace.csv.gz" \
    "lab-02 replay mlp_adam.trace.csv.gz --device sim" \
    "lab-02 replay mlp_adam.trace.csv.gz --device sim --conf preset:labs"
  whole lab-04/all-sim "lab-04 --device sim"
  parts lab-04 "lab-04 --device sim" "${LAB04_PARTS[@]}"
  whole lab-04/collectives-sim "lab-04 --device sim collectives"
  whole lab-04/ddp-sim "lab-04 --device sim ddp"
  whole lab-05/all-sim "lab-05 --device sim"
  parts lab-05 "lab-05 --device sim" "${LAB05_PARTS[@]}"
  whole lab-05/share-sim "lab-05 share --device sim"
  whole lab-05/fit-sim "lab-05 fit --capacity 24GiB --model mlp --device sim"
  whole lab-05/fit-transformer-sim "lab-05 fit --capacity 24GiB --model transformer --device sim"
  whole lab-05/fit-gpt2-sim \
    "lab-05 fit --capacity 24GiB --model gpt2 --device sim" \
    "lab-05 fit --capacity 24GiB --model gpt2 --checkpoint layers --amp bf16 --device sim"
  whole lab-06/all-sim "lab-06 --device sim"
  parts lab-06 "lab-06 --device sim" "${LAB06_PARTS[@]}"
  whole lab-07/all-sim "lab-07 --device sim"
  parts lab-07 "lab-07 --device sim" "${LAB07_PARTS[@]}"
  whole lab-08/all-sim "lab-08 --device sim"
  parts lab-08 "lab-08 --device sim" "${LAB08_PARTS[@]}"
  whole lab-08/bench-sim "lab-08 bench --device sim"
  parts lab-08 "lab-08 bench --device sim" "${LAB08_BENCH_PARTS[@]}"
  whole lab-09/all-sim "lab-09 --device sim"
  parts lab-09 "lab-09 --device sim" "${LAB09_PARTS[@]}"
  whole lab-10/all-sim "lab-10 --device sim"
  parts lab-10 "lab-10 --device sim" "${LAB10_PARTS[@]}"
  whole lab-10/formula-sim "lab-10 formula --device sim"
  whole lab-10/shares-dry "lab-10 shares --gemm-workspace 32MiB"
  whole lab-10/classifier-dry "lab-10 classifier --gemm-workspace 32MiB"
  whole lab-11/all-sim "lab-11 --device sim"
  parts lab-11 "lab-11 --device sim" "${LAB11_PARTS[@]}"
  parts lab-12 "lab-12 --device sim" "${LAB12_PARTS[@]}"
  whole lab-13/all-sim "lab-13 --device sim"
  parts lab-13 "lab-13 --device sim" "${LAB13_PARTS[@]}"
  ;;
*)
  echo "usage: $0 gpu LOGS_DIR RUN_LOG | $0 multi LOGS_DIR RUN_LOG | $0 sim [LAB]" >&2
  exit 2
  ;;
esac
