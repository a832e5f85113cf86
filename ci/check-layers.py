"""Fails when the modules of labs/core import each other in a circle.

The crate is layered (element types and device ids at the bottom, the backend contract,
the backends, the allocator, the device registry, tensors, then autograd, `dist` (the
collectives, above `device` and `tensor`), `nn` and `optim` on top): a module may name
modules below it, never above. This reads every `crate::NAME` path in each top-level
module's files (tests left out), builds the graph of modules, and reports every strongly
connected set of more than one module: a cycle.

Usage: python3 ci/check-layers.py [labs/core/src]
"""

import os
import re
import sys


def module_graph(root):
    graph = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            top = os.path.relpath(path, root).split(os.sep)[0].removesuffix(".rs")
            source = open(path, encoding="utf-8").read()
            # Unit tests may reach anywhere; only the code itself must be layered.
            source = source.split("#[cfg(test)]")[0]
            names = set(re.findall(r"crate::(\w+)", source))
            graph.setdefault(top, set()).update(n for n in names if n != top)
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


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "labs/core/src"
    graph = module_graph(root)
    found = cycles(graph)
    for component in found:
        print(f"module cycle in {root}: {' <-> '.join(component)}")
        for m in component:
            print(f"  {m} imports {', '.join(sorted(graph[m] & set(component)))}")
    if not found:
        print(f"{len(graph)} modules of {root}, no cycle")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
