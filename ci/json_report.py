"""The JSON report in a file a driver wrote: the first line that parses as a JSON object,
whatever a launcher printed around it. Shared by the scripts that put reports side by
side (data-parallel-scaling.py, zero-ladder.py)."""

import json
import sys


def report(path, who):
    """The report in `path`; exits naming `who` (the calling script) when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"{who}: cannot read {path}: {getattr(e, 'strerror', None) or e}")
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    sys.exit(f"{who}: {path} holds no JSON report")
