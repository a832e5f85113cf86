"""PyTorch's twin of `lab-02 replay`: runs an allocation trace through PyTorch's own
caching allocator, in one of its modes, on this machine's GPU, and prints one JSON
object with the figures the lab prints for ours:

  python3 ci/pytorch-replay.py data/traces/gpt2_fp32.trace.csv.gz \
      --conf expandable_segments:True

The trace's `alloc` and `free_requested` events are fed, in file order, to
c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete from a loop compiled
at run time with torch.utils.cpp_extension (the path `lab-02 bench` compares its pair
with), so that the time per operation is the allocator's and the driver's, not the
interpreter's; each of the trace's streams gets a stream of its own, as in the lab.
Where no compiler is found the loop runs in Python through
torch.cuda.caching_allocator_alloc/delete and the report says so (`"loop": "python"`).

`--conf` is PYTORCH_CUDA_ALLOC_CONF for this process: it is set before CUDA starts,
which is why each mode needs a process of its own. `--warmup N` replays the trace N
times untimed first, each time followed by empty_cache(), so that the timed replay
runs in a process whose driver has already done the same work (`lab-02 mappings`
warms its own process the same way). Peak figures are PyTorch's
memory_stats() after the replay (all pools)."""

import argparse
import csv
import gzip
import json
import os
import sys
import time

CPP_REPLAY = r"""
#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>
#include <c10/cuda/CUDACachingAllocator.h>

// Replays (kind, addr, size, stream) events: kind 0 allocates `size` bytes on `stream`
// under the name `addr`, kind 1 frees the block of that name. Returns the nanoseconds
// the loop took and how many frees named no live block (skipped). Blocks still live at
// the end are freed after the clock stops.
std::vector<int64_t> replay(const std::vector<int64_t>& kind, const std::vector<int64_t>& addr,
                            const std::vector<int64_t>& size, const std::vector<int64_t>& stream) {
  namespace cca = c10::cuda::CUDACachingAllocator;
  std::unordered_map<int64_t, void*> live;
  live.reserve(kind.size());
  int64_t unknown = 0;
  auto t = std::chrono::steady_clock::now();
  for (size_t i = 0; i < kind.size(); ++i) {
    if (kind[i] == 0) {
      live[addr[i]] = cca::raw_alloc_with_stream(size[i], reinterpret_cast<cudaStream_t>(stream[i]));
    } else {
      auto it = live.find(addr[i]);
      if (it == live.end()) { ++unknown; continue; }
      cca::raw_delete(it->second);
      live.erase(it);
    }
  }
  auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t).count();
  for (auto& kv : live) cca::raw_delete(kv.second);
  return {static_cast<int64_t>(ns), unknown};
}
"""


def read_trace(path):
    """The (kind, addr, size, stream) events of a trace, alloc = 0 and free = 1, and the
    peak of the bytes live (the sum of the sizes of allocated, not yet freed blocks)."""
    opener = gzip.open if path.endswith(".gz") else open
    events = []
    live, current, peak = {}, 0, 0
    with opener(path, "rt", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["action", "addr", "size", "stream"]:
            sys.exit(f"{path}: not a trace (header {header}, want action,addr,size,stream)")
        for n, row in enumerate(reader, start=2):
            if len(row) != 4:
                sys.exit(f"{path}:{n}: want 4 fields, got {len(row)}")
            action, addr, size, stream = row[0], int(row[1]), int(row[2]), int(row[3])
            if action == "alloc":
                events.append((0, addr, size, stream))
                live[addr] = size
                current += size
                peak = max(peak, current)
            elif action == "free_requested":
                events.append((1, addr, size, stream))
                current -= live.pop(addr, 0)
    return events, peak


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--conf", default="expandable_segments:True",
                   help="PYTORCH_CUDA_ALLOC_CONF for the replay")
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed replays first, each followed by empty_cache(), so that the "
                        "timed one does not pay for a cold driver (default 0)")
    args = p.parse_args()
    if args.warmup < 0:
        sys.exit("pytorch-replay: --warmup must be 0 or more")
    events, peak_requested = read_trace(args.trace)
    # Before torch starts CUDA: the allocator reads its configuration once.
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.conf
    import torch

    if not torch.cuda.is_available():
        sys.exit("pytorch-replay: torch sees no CUDA device")
    torch.cuda.init()
    # One stream of ours per stream of the trace; the trace's 0 is the default stream.
    streams, keep = {}, []
    for _, _, _, s in events:
        if s not in streams:
            if s == 0:
                streams[s] = 0
            else:
                keep.append(torch.cuda.Stream())
                streams[s] = keep[-1].cuda_stream
    kind = [e[0] for e in events]
    addr = [e[1] for e in events]
    size = [e[2] for e in events]
    stream = [streams[e[3]] for e in events]
    loop = "c++"
    try:
        from torch.utils.cpp_extension import load_inline
        ext = load_inline("replay_twin", cpp_sources=CPP_REPLAY, functions=["replay"],
                          with_cuda=True, extra_cflags=["-O2"], verbose=False)
    except Exception as e:  # no compiler, no headers: the Python loop, and say so
        loop = "python"
        compile_error = str(e).splitlines()[0][:200]
    def python_replay():
        live, unknown = {}, 0
        by_handle = {0: torch.cuda.default_stream()}
        by_handle.update({s.cuda_stream: s for s in keep})
        t = time.perf_counter_ns()
        for k, a, n, s in zip(kind, addr, size, stream):
            if k == 0:
                live[a] = torch.cuda.caching_allocator_alloc(n, stream=by_handle[s])
            elif a in live:
                torch.cuda.caching_allocator_delete(live.pop(a))
            else:
                unknown += 1
        ns = time.perf_counter_ns() - t
        for ptr in live.values():
            torch.cuda.caching_allocator_delete(ptr)
        return ns, unknown

    def run_once():
        if loop == "c++":
            return ext.replay(kind, addr, size, stream)
        return python_replay()

    for _ in range(args.warmup):
        run_once()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    allocs_before = torch.cuda.memory_stats().get("num_device_alloc", 0)
    ns, unknown = run_once()
    stats = torch.cuda.memory_stats()
    report = {
        "trace": os.path.basename(args.trace).split(".")[0],
        "conf": args.conf,
        "loop": loop,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "ops": len(events),
        "ns_per_op": ns / max(1, len(events)),
        "peak_requested": peak_requested,
        "peak_allocated": stats.get("allocated_bytes.all.peak", 0),
        "peak_reserved": stats.get("reserved_bytes.all.peak", 0),
        "device_allocs": stats.get("num_device_alloc", 0) - allocs_before,
        "warmup": args.warmup,
        "unknown_frees": unknown,
    }
    if loop == "python":
        report["compile_error"] = compile_error
    print(json.dumps(report))


if __name__ == "__main__":
    main()
