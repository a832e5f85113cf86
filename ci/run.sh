#!/usr/bin/env bash
# Runs a bundle made by ci/build-bundle.sh on a GPU machine: every test binary with
# LABS_DEVICE=cuda, then ci/pytorch-reference.py (where python3 has torch), then every
# command in commands.txt. Prints a pass/fail summary and
# exits non-zero on any failure, or when no GPU is found. Logs go to $LOG_DIR
# (default: ./logs beside this script). Commands run in that folder, so that files
# they write (pictures, snapshots) come back with the logs.
set -u
here=$(cd "$(dirname "$0")" && pwd)
logs=${LOG_DIR:-$here/logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
export LABS_DEVICE=${LABS_DEVICE:-cuda}
# Which parts to run, comma-separated, so that a run can be split over two calls of a
# time-limited machine: tests, reference, commands, snippets (the default), and multi
# (on a machine with several GPUs).
parts=",${RUN_PARTS:-tests,reference,commands,snippets},"
part() { [[ "$parts" == *",$1,"* ]]; }
# The test data travels with the bundle (the checkout is not on this machine).
export LABS_DATA_DIR=$here/data
# Tests that run a lab's command line find the binaries here, not where cargo built them.
export LABS_BIN_DIR=$here/bin

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no NVIDIA GPU found (nvidia-smi cannot list one); this bundle tests the GPU path" >&2
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# The kernels are compiled at run time by NVRTC. Make sure a libnvrtc.so is findable
# even where only the versioned library (libnvrtc.so.13) is installed.
if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so '; then
  nvrtc=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu \
            /usr/local/lib /opt -name 'libnvrtc.so*' ! -name '*builtins*' 2>/dev/null | head -n 1)
  if [ -n "$nvrtc" ]; then
    mkdir -p "$here/lib"
    ln -sf "$nvrtc" "$here/lib/libnvrtc.so"
    export LD_LIBRARY_PATH="$here/lib:$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "using NVRTC at $nvrtc"
  fi
fi

# Matrix products go through cuBLAS, opened at run time by the names libcublas.so and
# libcublas.so.12: where only another version is installed (libcublas.so.13), or only
# PyTorch's wheel carries it, point libcublas.so at it.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\(\.12\)\? '; then
  wheels=$(python3 -c 'import os, nvidia; print(" ".join(os.path.join(p, "cublas") for p in nvidia.__path__))' 2>/dev/null || true)
  # shellcheck disable=SC2086
  cublas=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib /usr/lib/x86_64-linux-gnu \
             /usr/local/lib /opt $wheels -name 'libcublas.so*' 2>/dev/null | sort -r | head -n 1)
  if [ -n "$cublas" ]; then
    mkdir -p "$here/lib"
    ln -sf "$cublas" "$here/lib/libcublas.so"
    export LD_LIBRARY_PATH="$here/lib:$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "using cuBLAS at $cublas"
  fi
fi

# The collectives (labs_core::dist) open NCCL at run time as libnccl.so.2: where the
# loader cannot find it and only PyTorch's wheel carries it, name the wheel's copy.
if [ -z "${LABS_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
  wheels=$(python3 -c 'import os, nvidia; print(" ".join(os.path.join(p, "nccl") for p in nvidia.__path__))' 2>/dev/null || true)
  # shellcheck disable=SC2086
  nccl=$(find /usr/local/cuda*/lib64 /usr/lib/x86_64-linux-gnu /usr/local/lib /opt $wheels \
           -name 'libnccl.so.2*' 2>/dev/null | sort | head -n 1)
  if [ -n "$nccl" ]; then
    export LABS_NCCL_LIBRARY=$nccl
    echo "using NCCL at $nccl"
  fi
fi

passed=0 failed=0 failures=()
# One test binary, logged, counted.
run_test() {
  local t=$1 name status p f
  name=$(basename "$t")
  # One test at a time: several tests timing the same GPU at once would measure each
  # other (a cuMemFree in one test stalls a launch in another).
  if "$t" --test-threads=1 >"$logs/$name.log" 2>&1; then status=ok; else status=FAILED; fi
  p=$(grep -o '[0-9]* passed' "$logs/$name.log" | awk '{s+=$1} END {print s+0}')
  f=$(grep -o '[0-9]* failed' "$logs/$name.log" | awk '{s+=$1} END {print s+0}')
  passed=$((passed + p)) failed=$((failed + f))
  if [ "$status" != ok ]; then
    failures+=("$name")
    [ "$f" -eq 0 ] && failed=$((failed + 1))
    tail -n 30 "$logs/$name.log"
  fi
  printf '%-40s %-7s %4d passed %4d failed\n' "$name" "$status" "$p" "$f"
}
if part tests; then
  for t in "$here"/tests/*; do
    run_test "$t"
  done
fi

# PyTorch's own figures for what the labs measure, on this machine, before the labs run:
# the benches read them through commands.txt's {pytorch} (lab-08 bench --pytorch FILE)
# and print them beside their own. Skipped, with a note, where python3 has no torch.
pytorch_json=
has_torch=no
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  has_torch=yes
fi
if part reference && [ -f "$here/ci/pytorch-reference.py" ]; then
  echo "== PyTorch reference"
  if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "python3 cannot import torch with CUDA: PyTorch's figures are not measured in this run"
  elif python3 "$here/ci/pytorch-reference.py" >"$logs/pytorch-reference.json" 2>"$logs/pytorch-reference.log"; then
    cat "$logs/pytorch-reference.json"
    pytorch_json=$logs/pytorch-reference.json
    passed=$((passed + 1))
  else
    cat "$logs/pytorch-reference.log"
    rm -f "$logs/pytorch-reference.json"
    failed=$((failed + 1))
    failures+=("PyTorch reference")
  fi
fi

# Runs the lines of commands.txt for one part: those without a prefix for `commands`,
# those that start with "multi: " for `multi`. A line's program is the bundle's bin/NAME,
# else one on the PATH (torchrun, python3); `{ci}` stands for the bundle's ci/ folder,
# `{gpus}` for the number of GPUs, and a last word `>FILE` also writes the command's
# standard output to FILE in the logs folder (a JSON a later line reads).
run_commands() {
  local want=$1 line bin args out log expect status
  while read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    if [ -n "$want" ]; then
      [[ "$line" == "$want "* ]] || continue
      line=${line#"$want "}
    else
      [[ "$line" == "multi: "* ]] && continue
    fi
    # "! COMMAND": the command must run out of memory (a demonstration); it passes when it
    # exits non-zero with "out of memory" in its output, and fails otherwise.
    expect=0
    if [[ "$line" == "! "* ]]; then
      expect=1
      line=${line#"! "}
    fi
    bin=${line%% *}
    args=${line#"$bin"}
    args=${args//\{data\}/$here/data}
    # `{gpus}`: the machine's GPU count (the multi part's ranks: every GPU).
    args=${args//\{gpus\}/${gpus:-1}}
    # `--pytorch {ci}/pytorch-train.py`: PyTorch's twin run by the lab itself, or nothing
    # where python3 has no torch with CUDA (the lab then prints its own figures alone).
    if [ "$has_torch" = yes ]; then
      args=${args//\{ci\}/$here/ci}
    else
      args=${args//--pytorch \{ci\}\/pytorch-train.py/}
      args=${args//--pytorch \{ci\}\/pytorch-replay.py/}
      args=${args//\{ci\}/$here/ci}
    fi
    # `--pytorch {pytorch}`: the reference's file, or nothing where it was not measured
    # (the bench then says so).
    if [ -n "$pytorch_json" ]; then
      args=${args//\{pytorch\}/$pytorch_json}
    else
      args=${args//--pytorch \{pytorch\}/}
    fi
    out=
    if [[ "$args" == *" >"* ]]; then
      out=${args##* >}
      args=${args% >*}
    fi
    [ -x "$here/bin/$bin" ] && bin=$here/bin/$bin
    log="$logs/$(echo "$line" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-200).log"
    echo "== $line"
    # From the logs folder, so that files a command writes by relative path come back
    # with the logs and print as relative paths.
    status=0
    # shellcheck disable=SC2086
    (cd "$logs" && if [ -n "$out" ]; then "$bin" $args >"$out"; else "$bin" $args; fi) >"$log" 2>&1 || status=$?
    cat "$log"
    [ -n "$out" ] && [ -f "$logs/$out" ] && cat "$logs/$out"
    if [ "$expect" = 1 ]; then
      if [ "$status" != 0 ] && cat "$log" ${out:+"$logs/$out"} 2>/dev/null | grep -qi 'out of memory'; then
        echo "(ran out of memory as expected: exit status $status)"
        status=0
      else
        echo "(expected to run out of memory: exit status $status)"
        status=1
      fi
    fi
    if [ "$status" = 0 ]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      failures+=("$line")
    fi
  done <"$here/commands.txt"
}

if part commands; then
  run_commands ""
fi

# Several GPUs (RUN_PARTS=multi, not a default part: it needs a machine with two GPUs
# or more): the collectives' and data-parallel tests again with every GPU in the group,
# then commands.txt's "multi: " lines (lab-04's sections, the collectives beside
# PyTorch's, DDP and ZeRO-1, lab-10 train --nproc 2 beside torchrun's DDP, and one GPU
# of each for the scaling efficiency). NVLink SHARP (NVLS) multicast stays off.
if part multi; then
  # NVLink multicast (NVLS) stays off: NCCL's, PyTorch's symmetric memory's and NVSHMEM's.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  echo "== several GPUs: $gpus"
  if [ "$gpus" -lt 2 ]; then
    echo "run.sh: the multi part needs two GPUs or more, found $gpus" >&2
    failed=$((failed + 1))
    failures+=("multi: fewer than two GPUs")
  else
    for t in "$here"/tests/dist-* "$here"/tests/dist_launch-* "$here"/tests/ddp-* \
             "$here"/tests/data_parallel-*; do
      [ -e "$t" ] && run_test "$t"
    done
    run_commands "multi:"
  fi
fi

# The PyTorch snippets the chapters show: each must run here, and what each printed goes
# to logs/snippets for ci/book-outputs.sh.
if part snippets && [ -f "$here/ci/check-snippets.py" ]; then
  echo "== PyTorch snippets"
  if python3 "$here/ci/check-snippets.py" --require-gpu --out "$logs/snippets" >"$logs/snippets.log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("PyTorch snippets")
  fi
  cat "$logs/snippets.log"
fi

echo
echo "GPU bundle on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1): $passed passed, $failed failed"
if [ ${#failures[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failures[@]}"
  exit 1
fi
