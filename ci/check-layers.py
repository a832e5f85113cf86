"""Fails when the modules of one crate of the runtime import each other in a circle.

Cargo keeps the crates in layers (labs-base, labs-alloc, labs-device, labs-tensor,
labs-nn, labs-dist, the façade labs-core): a crate names only the crates below it. Inside
a crate the modules are layered too (in labs-device: the contract `backend`, the op layer
`kernels`, the backends `cuda` and `sim`, the registry `device`), which no compiler
checks: this reads every `crate::NAME` path in each top-level module's files, builds the
graph of modules, and reports every strongly connected set of more than one module: a
cycle.

Unit tests may reach anywhere, so the item behind each `#[cfg(test)]` is left out (a
`mod tests { ... }` block, a `use`, a function) and so is a file that a
`#[cfg(test)] mod NAME;` loads; everything else in the file, before or after, is read.

Usage: python3 ci/check-layers.py [SRC_FOLDER ...]   (default: every crate of the runtime)
       python3 ci/check-layers.py --self-test
"""

import os
import re
import sys
import tempfile

CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


def skip_literal(source, i):
    """The index just past the comment, string or char literal at `i`, or `i` itself
    when none starts there."""
    if source.startswith("//", i):
        end = source.find("\n", i)
        return len(source) if end < 0 else end + 1
    if source.startswith("/*", i):
        depth, j = 1, i + 2
        while j < len(source) and depth:
            if source.startswith("/*", j):
                depth, j = depth + 1, j + 2
            elif source.startswith("*/", j):
                depth, j = depth - 1, j + 2
            else:
                j += 1
        return j
    raw = re.match(r'b?r(#*)"', source[i : i + 260])
    if raw and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
        close = '"' + raw.group(1)
        end = source.find(close, i + raw.end())
        return len(source) if end < 0 else end + len(close)
    if source[i] == '"':
        j = i + 1
        while j < len(source) and source[j] != '"':
            j += 2 if source[j] == "\\" else 1
        return j + 1
    char = re.match(r"'(\\.[^']*|[^'\\])'", source[i : i + 16])
    if char:
        return i + char.end()
    return i


def item_end(source, i):
    """The index just past the item starting at `i`: through its matching closing brace
    when a `{` comes before any `;`, else through the `;`."""
    depth = 0
    while i < len(source):
        j = skip_literal(source, i)
        if j != i:
            i = j
            continue
        c = source[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return i


def without_tests(source):
    """`source` less every item behind a `#[cfg(test)]`, and the names of the files
    that `#[cfg(test)] mod NAME;` (with or without a `#[path]`) loads."""
    kept, test_files, i = [], [], 0
    while True:
        m = CFG_TEST.search(source, i)
        if not m:
            kept.append(source[i:])
            return "".join(kept), test_files
        kept.append(source[i : m.start()])
        j = m.end()
        # Further attributes of the same item, then the item itself.
        path = None
        while True:
            rest = source[j:]
            attr = re.match(r"\s*#\[([^\]]*)\]", rest)
            if not attr:
                break
            named = re.match(r'path\s*=\s*"([^"]+)"', attr.group(1).strip())
            if named:
                path = named.group(1)
            j += attr.end()
        end = item_end(source, j)
        outline = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", source[j:end])
        if outline:
            test_files.append(path or outline.group(1) + ".rs")
        i = end

def module_graph(root):
    graph, sources, test_files = {}, {}, set()
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            code, tests = without_tests(open(path, encoding="utf-8").read())
            sources[path] = code
            for t in tests:
                # `mod NAME;` in `x.rs` or `x/mod.rs` loads `x/NAME.rs` or the sibling
                # file a `#[path]` names; both candidates are test code.
                stem = path.removesuffix(".rs")
                test_files.add(os.path.normpath(os.path.join(folder, t)))
                test_files.add(os.path.normpath(os.path.join(stem, t)))
    for path, code in sources.items():
        top = os.path.relpath(path, root).split(os.sep)[0].removesuffix(".rs")
        graph.setdefault(top, set())
        if os.path.normpath(path) in test_files:
            continue
        names = set(re.findall(r"crate::(\w+)", code))
        graph[top].update(n for n in names if n != top)
    return {m: {d for d in deps if d in graph} for m, deps in graph.items()}


def cycles(graph):
    """Tarjan's strongly connected components with more than one member."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


SELF_TEST = {
    # `low` names `high` only in tests: no cycle.
    "low.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::high::g;\n}\n",
    "high.rs": "use crate::low::f;\npub fn g() { f() }\n",
    # `mid` names `high` in code after a test-only item, behind braces in strings and
    # comments that must not end the item early: a cycle.
    "mid.rs": (
        "#[cfg(test)]\nuse super::x;\n"
        "#[cfg(test)]\n#[allow(dead_code)]\nfn t() { let _ = \"}\"; let _ = '}'; /* } */ }\n"
        "#[cfg(test)]\n#[path = \"mid_tests.rs\"]\nmod tests;\n"
        "pub fn h() { crate::high::g() }\n"
    ),
    "mid_tests.rs": "use crate::top::z;\n",
    "top.rs": "pub fn z() { crate::mid::h() }\n",
}


def self_test():
    """Checks the checker on a planted tree: an import hidden after a test item is
    found, imports inside test items and test files are not."""
    with tempfile.TemporaryDirectory() as root:
        for name, text in SELF_TEST.items():
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        # high.rs also imports mid, which imports high: the one cycle expected.
        with open(os.path.join(root, "high.rs"), "a", encoding="utf-8") as f:
            f.write("pub fn k() { crate::mid::h() }\n")
        graph = module_graph(root)
        found = cycles(graph)
    expected = [["high", "mid"]]
    if found != expected or "high" in graph["low"] or "top" in graph["mid_tests"]:
        print(f"check-layers self-test failed: cycles {found}, graph {graph}")
        return 1
    print("check-layers self-test: the planted import is found, test code is not read")
    return 0


# The runtime's crates, bottom to top, the façade, and the training driver on it.
RUNTIME = [
    "labs/core/base/src",
    "labs/core/alloc/src",
    "labs/core/device/src",
    "labs/core/tensor/src",
    "labs/core/nn/src",
    "labs/core/dist/src",
    "labs/core/src",
    "labs/core/train/src",
]


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    roots = sys.argv[1:] or RUNTIME
    failed = False
    for root in roots:
        if not os.path.isdir(root):
            print(f"check-layers: {root} is not a folder")
            return 1
        graph = module_graph(root)
        found = cycles(graph)
        for component in found:
            print(f"module cycle in {root}: {' <-> '.join(component)}")
            for m in component:
                print(f"  {m} imports {', '.join(sorted(graph[m] & set(component)))}")
        if not found:
            print(f"{len(graph)} modules of {root}, no cycle")
        failed = failed or bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
