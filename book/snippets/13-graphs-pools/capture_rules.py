# What a capture forbids: each call below is legal eagerly and fails inside
# torch.cuda.graph. Each runs in a fresh process, then one process makes three
# captures in a row after a failed one.
import subprocess
import sys

SETUP = """
import torch
x = torch.ones(4096, device="cuda")
x * 2                                         # warm-up

def capture(call):
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            y = x * 2
            call(y)
    except Exception as e:
        return str(e).splitlines()[0][:75]
    graph.replay()
    return f"captured, y[0] = {y[0].item()}"
"""
CALLS = ["torch.cuda.synchronize()", "y.sum().item()", "torch.cuda.empty_cache()", "y.cpu()"]


def run(code):
    r = subprocess.run([sys.executable, "-c", SETUP + code], capture_output=True, text=True)
    return r.stdout.rstrip() or f"(the process died: {r.stderr.strip().splitlines()[-1][:60]})"


for call in CALLS:
    print(f"{call:26} -> {run(f'print(capture(lambda y: {call}))')}")

print("\nOne process, after a failed capture:")
print(run("""
print("  1.", capture(lambda y: torch.cuda.synchronize()))
for i in (2, 3, 4):
    print(f"  {i}.", capture(lambda y: None))
"""))
