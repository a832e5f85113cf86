#!/usr/bin/env python3
"""Every chapter ends the same way, so that a reader (or a workshop) finds the lab's
commands, the graded exercises, the summary and the pointers to the lab's code at the
same place: its last top-level sections are, in this order, "Running the lab",
"Exercises", "Summary" and "Under the hood". Prints a line per chapter that differs and
exits 1 if one does.

    python3 ci/check-layout.py [book/src/chapters]
"""
import pathlib
import re
import sys

TAIL = ["Running the lab", "Exercises", "Summary", "Under the hood"]


def sections(text):
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.M | re.S)
    # A heading's explicit id ({#summary}) is no part of its title.
    return re.findall(r"^## (.+?)\s*(?:\{#[\w-]+\})?\s*$", text, flags=re.M)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "book/src/chapters")
    bad = 0
    chapters = sorted(root.glob("[0-9][0-9]-*.md"))
    for path in chapters:
        found = sections(path.read_text(encoding="utf-8"))
        if found[-len(TAIL):] != TAIL:
            bad += 1
            print(f"{path}: its last sections are {found[-len(TAIL):]}, not {TAIL}")
    print(f"check-layout: {len(chapters)} chapters, {bad} out of order")
    return 1 if bad or not chapters else 0


if __name__ == "__main__":
    sys.exit(main())
