#!/usr/bin/env python3
"""Checks every relative link of the book's Markdown sources: the page it names exists,
and so does the heading its #fragment names (ids as mdBook makes them from headings).
Prints one line per broken link and exits 1 if there is any.

    python3 ci/check-links.py [book/src]       python3 ci/check-links.py --self-test
"""
import os
import re
import sys

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*(?:\{#([\w-]+)[^}]*\})?\s*$", re.M)


def slug(text):
    """mdBook's id for a heading: its text without markup, lowercased, spaces to
    hyphens, anything but letters, digits, '-' and '_' dropped."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(text):
    seen = {}
    ids = set()
    for m in HEADING.finditer(FENCE.sub("", text)):
        if m.group(3):
            ids.add(m.group(3))
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        ids.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    ids.update(re.findall(r'<a\s+(?:name|id)="([^"]+)"', text))
    return ids


def check(root):
    cache = {}

    def ids_of(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors(f.read())
        return cache[path]

    problems = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            body = FENCE.sub("", text)
            for lineno, line in enumerate(body.split("\n"), 1):
                for target in LINK.findall(line):
                    if re.match(r"^[a-z]+:", target):
                        continue
                    page, _, frag = target.partition("#")
                    dest = os.path.normpath(os.path.join(folder, page)) if page else path
                    if page.endswith(".html") and not os.path.exists(dest):
                        # A chapter, linked by the page mdBook makes of it; otherwise
                        # a page of its own among the book's files (a snapshot viewer).
                        dest = dest[: -len(".html")] + ".md"
                    if not os.path.exists(dest):
                        problems.append(f"{path}: link to {target}: no page {page}")
                    elif frag and dest.endswith(".md") and frag not in ids_of(dest):
                        problems.append(f"{path}: link to {target}: no heading #{frag}")
    return problems


def self_test():
    ids = anchors("# A `b` c\n## A b c\n```\n# not\n```\n### Tutorial 004's (40.00 MB)\n## X {#own}\n")
    want = {"a-b-c", "a-b-c-1", "tutorial-004s-4000-mb", "own"}
    assert ids == want, ids
    print("check-links self-test: passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    problems = check(sys.argv[1] if len(sys.argv) > 1 else "book/src")
    for p in problems:
        print(p)
    print(f"check-links: {len(problems)} broken links")
    sys.exit(1 if problems else 0)
