#!/usr/bin/env python3
"""Checks a translation of the book (book/po/LANG.po) against the English it
translates, message by message, for what must survive translation unchanged:

- every directive (`{{#include …}}`, `{{#figure …}}`, …), link target, inline code span
  and number of the English is in the translation, as often;
- a heading's translation ends with `{#id}`, the id mdBook gives the English heading,
  so that links to it (`chapter.md#id`) reach the translated heading too.

With --count it also prints how many messages are translated, untranslated and fuzzy
(against a template made from today's English: see .ci/run), and fails when any is
untranslated or fuzzy. With --fix-headings it adds the missing `{#id}` to translated
headings in place, and checks nothing else.

    python3 ci/check-po.py book/po/zh-CN.po [--count] [--fix-headings]
    python3 ci/check-po.py --self-test
"""
import os
import re
import sys
from collections import Counter
from functools import lru_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module

slug = import_module("check-links").slug

DIRECTIVE = re.compile(r"\{\{#[^}]*\}\}")
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"(`+)(.+?)\1", re.S)
# A number: digits, with thousands commas or a decimal point inside, perhaps a plural
# ("4090s"); Chinese characters around it are no part of it.
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d(?:[\d,.]*\d)?(?![A-Za-rt-z0-9_]|s\w|[.,]\d)")
HEADING_ID = re.compile(r"\s*\{#([\w-]+)\}\s*$")


def unquote(s):
    """A PO string's contents, escapes resolved."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(n, "\\" + n))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def quote(s):
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t").replace("\n", "\\n")


class Entry:
    def __init__(self):
        self.comments = []  # lines before msgid, as written
        self.msgid = ""
        self.msgstr = ""
        self.first = 0  # line number of the entry in the file
        self.msgstr_lines = (0, 0)  # [start, end) of the msgstr lines

    @property
    def fuzzy(self):
        return any(c.startswith("#,") and "fuzzy" in c for c in self.comments)

    @property
    def obsolete(self):
        return any(c.startswith("#~") for c in self.comments)

    @property
    def sources(self):
        refs = []
        for c in self.comments:
            if c.startswith("#:"):
                refs.extend(c[2:].split())
        return refs


def parse(lines):
    entries, e, field = [], Entry(), None
    for n, raw in enumerate(lines):
        line = raw.rstrip("\n")
        if not line.strip():
            if e.msgid or e.msgstr or e.comments:
                entries.append(e)
            e, field = Entry(), None
            continue
        if line.startswith("#"):
            if not e.comments:
                e.first = n
            e.comments.append(line)
            continue
        m = re.match(r'^(msgid|msgstr|msgctxt)\s+"(.*)"$', line)
        if m:
            field = m.group(1)
            if not e.comments and field == "msgid":
                e.first = n
            if field == "msgstr":
                e.msgstr_lines = (n, n + 1)
            value = unquote(m.group(2))
            if field == "msgid":
                e.msgid = value
            elif field == "msgstr":
                e.msgstr = value
            continue
        m = re.match(r'^"(.*)"$', line)
        if m and field:
            value = unquote(m.group(1))
            if field == "msgid":
                e.msgid += value
            elif field == "msgstr":
                e.msgstr += value
                e.msgstr_lines = (e.msgstr_lines[0], n + 1)
    if e.msgid or e.msgstr or e.comments:
        entries.append(e)
    return entries


@lru_cache(maxsize=None)
def source_lines(path):
    """A source file's lines, read once; None where there is no such file."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")


def is_heading(entry, src_root):
    """Whether the English message is a section heading (##, ###, …) wherever it
    appears: its id is what links name. A chapter's title (#) is linked by its page, and
    its text is also the table of contents' entry, where an id would show."""
    refs = entry.sources
    if not refs:
        return False
    for ref in refs:
        path, _, line = ref.rpartition(":")
        text = source_lines(os.path.join(src_root, path))
        if not line.isdigit() or text is None:
            return False
        n = int(line) - 1
        if not (0 <= n < len(text) and re.match(r"^#{2,6}\s", text[n])):
            return False
    return True


def heading_id(msgid):
    m = HEADING_ID.search(msgid)
    return m.group(1) if m else slug(msgid)


def without_code(text):
    return CODE.sub(" ", DIRECTIVE.sub(" ", text))


def problems_of(entry, heading):
    if not entry.msgstr or not entry.msgid or entry.obsolete:
        return []
    a, b = entry.msgid, entry.msgstr
    if heading:
        # The id a translated heading carries is checked below, not as text.
        b = HEADING_ID.sub("", b)
    out = []
    checks = [
        ("directive", DIRECTIVE, None),
        ("link target", LINK_TARGET, None),
        ("code span", CODE, None),
        ("number", NUMBER, without_code),
    ]
    if a.startswith("```"):
        # A code block (a diagram): its labels are translated, its fences and its
        # lines stay where they are; the directives and numbers in it too.
        la, lb = a.rstrip("\n").split("\n"), b.rstrip("\n").split("\n")
        if len(la) != len(lb) or la[0] != lb[0] or la[-1] != lb[-1]:
            out.append("code block: the fences and the number of lines must stay")
        checks = [("directive", DIRECTIVE, None), ("number", NUMBER, None)]
    for what, pattern, strip in checks:
        ta = strip(a) if strip else a
        tb = strip(b) if strip else b
        if pattern is CODE:
            ca = Counter(m.group(2) for m in pattern.finditer(ta))
            cb = Counter(m.group(2) for m in pattern.finditer(tb))
        elif pattern is LINK_TARGET:
            ca, cb = Counter(pattern.findall(ta)), Counter(pattern.findall(tb))
        else:
            ca = Counter(m.group(0) for m in pattern.finditer(ta))
            cb = Counter(m.group(0) for m in pattern.finditer(tb))
        if pattern is NUMBER:
            # Numbers inside link targets are checked with the targets.
            ca -= Counter(NUMBER.findall(" ".join(LINK_TARGET.findall(ta))))
            cb -= Counter(NUMBER.findall(" ".join(LINK_TARGET.findall(tb))))
        missing, extra = ca - cb, cb - ca
        if missing or extra:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(repr(k) for k in missing))
            if extra:
                parts.append("added " + ", ".join(repr(k) for k in extra))
            out.append(f"{what}: " + "; ".join(parts))
    if not heading and HEADING_ID.search(entry.msgstr) and not HEADING_ID.search(a):
        out.append("an id {#…} on a message that is not a section heading everywhere")
    if heading:
        want = heading_id(a)
        m = HEADING_ID.search(entry.msgstr)
        if not m:
            out.append(f"heading without {{#{want}}}")
        elif m.group(1) != want:
            out.append(f"heading id {{#{m.group(1)}}}, the English one is {{#{want}}}")
    return out


def fix_headings(path, src_root):
    """Gives each translated section heading its English id, and takes an id off a
    translation that is not a section heading everywhere it is used."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    fixed = 0
    for e in reversed(parse(lines)):
        if not e.msgstr or not e.msgid or e.obsolete or "\n" in e.msgid:
            continue
        heading = is_heading(e, src_root)
        has_id = HEADING_ID.search(e.msgstr) and not HEADING_ID.search(e.msgid)
        if heading and not has_id:
            new = f"{e.msgstr.rstrip()} {{#{heading_id(e.msgid)}}}"
        elif has_id and not heading:
            new = HEADING_ID.sub("", e.msgstr)
        else:
            continue
        start, end = e.msgstr_lines
        lines[start:end] = [f'msgstr "{quote(new)}"\n']
        fixed += 1
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    print(f"{path}: {fixed} headings given their English ids, or other messages freed of one")


def count(entries):
    live = [e for e in entries if e.msgid and not e.obsolete]
    fuzzy = sum(1 for e in live if e.fuzzy)
    untranslated = sum(1 for e in live if not e.msgstr)
    return len(live), untranslated, fuzzy


def main(args):
    if args == ["--self-test"]:
        return self_test()
    paths = [a for a in args if not a.startswith("--")]
    if len(paths) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = paths[0]
    # The template's references are relative to the book's folder (src/chapters/….md).
    src_root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "book")
    if "--fix-headings" in args:
        fix_headings(path, src_root)
        return 0
    with open(path, encoding="utf-8") as f:
        entries = parse(f.readlines())
    bad = 0
    for e in entries:
        if e.fuzzy:
            continue
        for p in problems_of(e, "\n" not in e.msgid and is_heading(e, src_root)):
            where = e.sources[0] if e.sources else f"line {e.first + 1}"
            print(f"{path}:{e.first + 1}: ({where}) {p}: {e.msgid[:70]!r}")
            bad += 1
    status = 1 if bad else 0
    if "--count" in args:
        total, untranslated, fuzzy = count(entries)
        print(
            f"{path}: {total - untranslated - fuzzy} of {total} messages translated, "
            f"{untranslated} untranslated, {fuzzy} fuzzy"
        )
        if untranslated or fuzzy:
            status = 1
    return status


def self_test():
    e = Entry()
    e.msgid = "The peak is {{#figure a.txt: peak}} after `step()`; see [1](x.md#y), 12,000 rows."
    e.msgstr = "峰值为 {{#figure a.txt: peak}}，在 `step()` 之后；见 [1](x.md#y)，12,000 行。"
    assert problems_of(e, False) == [], problems_of(e, False)
    e.msgstr = "峰值为 {{#figure a.txt: pk}}，在 `step` 之后；见 [1](x.md)，12000 行。"
    found = " | ".join(problems_of(e, False))
    for word in ["directive", "link target", "code span", "number"]:
        assert word in found, found
    h = Entry()
    h.msgid = "`to()`: the same tensor, or a copy"
    h.msgstr = "`to()`：同一个张量，还是一份拷贝"
    assert problems_of(h, True) == ["heading without {#to-the-same-tensor-or-a-copy}"]
    h.msgstr += " {#to-the-same-tensor-or-a-copy}"
    assert problems_of(h, True) == []
    lines = ['msgid ""\n', 'msgstr ""\n', "\n", "#, fuzzy\n", 'msgid "a"\n', 'msgstr ""\n',
             '"b\\n"\n', "\n", 'msgid "c"\n', 'msgstr ""\n']
    entries = parse(lines)
    assert [(x.msgid, x.msgstr, x.fuzzy) for x in entries] == [
        ("a", "b\n", True), ("c", "", False)]
    assert count(entries) == (2, 1, 1)
    print("check-po self-test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
