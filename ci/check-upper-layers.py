"""Fails when the training libraries (nn, optim, dist) reach below the tensor API.

nn, optim and dist work on tensors: they hold no raw device address and launch no
kernel, call no backend and name neither the op layer nor a backend (cuda, sim). This
reads every file of labs-nn (labs/core/nn/src/{nn,optim}) and labs-dist
(labs/core/dist/src/dist), leaves out the items behind `#[cfg(test)]` (unit tests may
reach anywhere; the same reading as ci/check-layers.py), and prints `file:line: text`
for each line that names one of

  backend(), DevicePtr, device_ptr, .ptr(), kernels::, cuda::, sim::

Cargo cannot keep them so: both crates stand on labs-tensor, which stands on
labs-device, where the contract, the op layer and both backends live.

Usage: python3 ci/check-upper-layers.py [RUNTIME_FOLDER]   (default labs/core)
       python3 ci/check-upper-layers.py --self-test
"""

import importlib.util
import os
import re
import sys
import tempfile

_spec = importlib.util.spec_from_file_location(
    "check_layers", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-layers.py")
)
check_layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layers)

PATTERNS = [
    r"\bbackend\(\)",
    r"\bDevicePtr\b",
    r"\bdevice_ptr\b",
    r"\.ptr\(\)",
    r"\bkernels::",
    r"\bcuda::",
    r"\bsim::",
]
# The folders checked, under the runtime's folder.
FOLDERS = ["nn/src/nn", "nn/src/optim", "dist/src/dist"]


def blank_tests(source):
    """`source` with every item behind a `#[cfg(test)]` turned into blank lines, so that
    the lines left keep their numbers (ci/check-layers.py's `without_tests`, which
    drops them); and the files that `#[cfg(test)] mod NAME;` loads."""
    kept, test_files, i = [], [], 0
    while True:
        m = check_layers.CFG_TEST.search(source, i)
        if not m:
            kept.append(source[i:])
            return "".join(kept), test_files
        kept.append(source[i : m.start()])
        j = m.end()
        path = None
        while True:
            attr = re.match(r"\s*#\[([^\]]*)\]", source[j:])
            if not attr:
                break
            named = re.match(r'path\s*=\s*"([^"]+)"', attr.group(1).strip())
            if named:
                path = named.group(1)
            j += attr.end()
        end = check_layers.item_end(source, j)
        outline = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", source[j:end])
        if outline:
            test_files.append(path or outline.group(1) + ".rs")
        kept.append("\n" * source.count("\n", m.start(), end))
        i = end


def findings(root):
    found = []
    rule = re.compile("|".join(PATTERNS))
    for module in FOLDERS:
        folder = os.path.join(root, module)
        if not os.path.isdir(folder):
            found.append(f"{folder}: no such folder (the layout changed: update FOLDERS)")
            continue
        skipped = set()
        paths = []
        for here, _, files in os.walk(folder):
            paths += [os.path.join(here, n) for n in files if n.endswith(".rs")]
        texts = {}
        for path in sorted(paths):
            code, tests = blank_tests(open(path, encoding="utf-8").read())
            texts[path] = code
            stem = path.removesuffix(".rs")
            for t in tests:
                skipped.add(os.path.normpath(os.path.join(os.path.dirname(path), t)))
                skipped.add(os.path.normpath(os.path.join(stem, t)))
        for path, code in texts.items():
            if os.path.normpath(path) in skipped:
                continue
            for n, line in enumerate(code.split("\n"), 1):
                if rule.search(line):
                    found.append(f"{path}:{n}: {line.strip()}")
    return found


SELF_TEST = {
    "nn/src/nn/a.rs": (
        "use crate::tensor::Tensor;\n"
        "fn sdpa_backend() {}\n"
        "#[cfg(test)]\nmod tests {\n    use crate::kernels::Kernel;\n}\n"
        "pub fn f(t: &Tensor) -> u64 { t.ptr() }\n"
    ),
    "nn/src/optim/b.rs": "#[cfg(test)]\nmod tests;\npub fn g() { crate::sim::x() }\n",
    "nn/src/optim/b/tests.rs": "use crate::cuda::y;\n",
    "dist/src/dist/c.rs": "use crate::device::Device;\nfn h(d: &Device) { d.backend(); }\n",
}


def self_test():
    with tempfile.TemporaryDirectory() as root:
        for name, text in SELF_TEST.items():
            path = os.path.join(root, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        found = [os.path.relpath(f, root) for f in findings(root)]
    expected = [
        "nn/src/nn/a.rs:7: pub fn f(t: &Tensor) -> u64 { t.ptr() }",
        "nn/src/optim/b.rs:3: pub fn g() { crate::sim::x() }",
        "dist/src/dist/c.rs:2: fn h(d: &Device) { d.backend(); }",
    ]
    if sorted(found) != sorted(expected):
        print(f"check-upper-layers self-test failed: found {found}")
        return 1
    print("check-upper-layers self-test: the planted lines are found, test code is not read")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else "labs/core"
    found = findings(root)
    for line in found:
        print(line)
    if found:
        print(
            "nn, optim and dist reach below the tensor API (the lines above): use the "
            "tensor's public ops (copy_, zero_, fill_, tensor::fused, ...)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
