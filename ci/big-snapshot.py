#!/usr/bin/env python3
"""Writes a PyTorch memory snapshot pickle of at least SIZE_MB million bytes, for the snapshot
viewer's large-file check (.ci/run): data/snapshots/mlp_adam.pickle's trace repeated,
each repetition's addresses and times shifted past the last one's, so that every
allocation still pairs with its free. The file is written event by event in pickle
protocol 2 without the memo (each event whole, as a long-running job's snapshot has
them), so neither this script nor its output's size depends on memory.

Usage: python3 ci/big-snapshot.py OUT [SIZE_MB]   (default 1000: 1 GB, under lab-03's 1 GiB limit)
"""

import io
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "..", "data", "snapshots", "mlp_adam.pickle")
# Apart enough that no repetition's addresses meet another's.
ADDRESS_STEP = 1 << 36


def body(obj):
    """obj pickled without the protocol header, the STOP and the memo."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    p.fast = True
    p.dump(obj)
    data = buf.getvalue()
    assert data[:2] == b"\x80\x02" and data[-1:] == b"."
    return data[2:-1]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    out = sys.argv[1]
    want = int(sys.argv[2] if len(sys.argv) == 3 else 1000) * 1000 * 1000
    with open(BASE, "rb") as f:
        base = pickle.load(f)
    trace = base["device_traces"][0]
    span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
    events = 0
    with open(out, "wb") as f:
        f.write(b"\x80\x02}(")  # PROTO 2, EMPTY_DICT, MARK
        f.write(body("segments") + body(base["segments"]))
        f.write(body("device_traces") + b"](](")  # the list of devices' traces, device 0's
        rep = 0
        while f.tell() < want:
            for e in trace:
                e = dict(e, addr=e["addr"] + rep * ADDRESS_STEP, time_us=e["time_us"] + rep * span)
                f.write(body(e))
                events += 1
            f.write(b"e(")  # APPENDS, MARK
            rep += 1
        f.write(b"ee")  # the last APPENDS; device 0's trace into the list of traces
        for key in ("allocator_settings", "external_annotations"):
            f.write(body(key) + body(base.get(key, {})))
        f.write(b"u.")  # SETITEMS, STOP
        size = f.tell()
    print(f"{out}: {size / 1e6:.0f} MB, {events} events ({rep} repetitions of {len(trace)})")


if __name__ == "__main__":
    main()
