"""PyTorch's twin of `lab-10 train`: the same training run, the same flags, the same JSON
fields, measured with PyTorch's own meanings, so that ci/train-compare.py can put the two
side by side on one GPU.

  python3 ci/pytorch-train.py --model transformer --d-model 256 --batch 64 --json
  python3 ci/pytorch-train.py --model gpt2 --batch 8 --amp bf16 --checkpoint layers
  torchrun --nproc_per_node 2 ci/pytorch-train.py --model gpt2 --batch 8 --json

Runs on a CUDA GPU (written for PyTorch 2.11). Two models:

  transformer  nn.Transformer(d_model, nhead, layers, layers, ffn, dropout,
               batch_first=True); each micro-batch draws src, tgt and a target
               [batch, seq, d_model] from torch.randn on the device, and the loss is
               mse_loss(model(src, tgt), target) / accum (tutorial 004's step).
  gpt2         a GPT-2 decoder written with torch.nn that mirrors labs/core/nn/src/nn/gpt2.rs:
               the same parameter names and shapes (transformer.wte.weight, ...,
               transformer.h.N.attn.c_attn.weight, ..., transformer.ln_f.bias), biases
               on, tanh GELU, pre-norm blocks, the LM head tied to the token embedding,
               GPT-2's initialisation; 124,439,808 parameters for GPT-2 small. Token ids
               are random in [0, vocab), the targets the next ids, cross-entropy.

The techniques are PyTorch's own: torch.utils.checkpoint.checkpoint(use_reentrant=False)
around every layer (`--checkpoint layers`), the same with a selective-checkpoint policy
that saves matrix products and attention and recomputes the rest (`selective`),
torch.autograd.graph.save_on_cpu(pin_memory=True) (`--offload`; with `--offload-share S`
below 1, save_on_cpu's copies through saved_tensors_hooks that send a storage only while
the bytes sent stay within S of those that could go in that forward pass, as lab-10's
hooks decide),
torch.nn.attention.sdpa_kernel(SDPBackend.MATH) (`--attention naive`; `fused` leaves
PyTorch's own choice), torch.autocast with torch.amp.GradScaler for float16 (`--amp`),
gradient accumulation (`--accum K`).

What it reports: after the model and the optimizer exist (Adam makes its state lazily,
at the first step) the peak statistics are reset, then `--steps` optimizer steps
run; `peak_allocated` and `peak_reserved` are max_memory_allocated() and
max_memory_reserved() over the whole run, `step_ms` the median wall time of the steps
after the `--warmup` first ones (the device synchronised before and after each), `losses`
one per optimizer step (the sum of the micro-batch losses, each already divided by K).
On an out-of-memory error the JSON still comes, with "oom" and the peaks so far, and the
exit status is 1.

`--snapshot FILE` records the allocator's history from before the model is built and
dumps PyTorch's snapshot pickle at the end (or at an out-of-memory error), which
`lab-03 compare` puts beside `lab-10 train --snapshot`'s.

Launched by torchrun (WORLD_SIZE > 1) it trains data-parallel: one process per GPU, the
model in DistributedDataParallel(bucket_cap_mb=25), the same initial weights everywhere
and data seeded `seed + rank`, `--accum` with no_sync() on all but the last micro-batch;
rank 0 prints, with every rank's peaks and step time under "ranks". With `--zero1` the
optimizer is torch.distributed.optim.ZeroRedundancyOptimizer around the chosen one (each
rank steps the state of its share of the parameters and broadcasts them: ZeRO stage 1),
the twin of `lab-10 train --zero1`. With `--zero2` the
model is in FullyShardedDataParallel(sharding_strategy=SHARD_GRAD_OP) instead: gradients
and optimizer state sharded across the ranks (ZeRO stage 2; the parameters are gathered
for forward and kept until backward ends), the twin of `lab-10 train --zero2`. With
`--zero3` every layer (GPT-2's blocks, the Transformer's encoder and decoder layers) and
then the model are wrapped in FSDP2's fully_shard: parameters sharded too, each layer's
gathered for its forward and again for its backward (ZeRO stage 3), gradients
reduce-scattered every micro-batch, the twin of `lab-10 train --zero3`."""

import argparse
import contextlib
import functools
import json
import math
import os
import re
import sys
import time
import warnings


def conf_from_argv(argv):
    """--conf's value, read before torch loads: PyTorch takes the allocator's backend
    (backend:cudaMallocAsync) from PYTORCH_CUDA_ALLOC_CONF when it is imported, the other
    keys when CUDA starts."""
    for i, arg in enumerate(argv):
        if arg == "--conf" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--conf="):
            return arg.split("=", 1)[1]
    return None


if (_conf := conf_from_argv(sys.argv[1:])) is not None:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = _conf

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.profiler  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

# The profiler that counts the attention calls warns, once, that it keeps only the
# current cycle's events (all it reads); the warning names the interpreter's path.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events")

# nn.Transformer's defaults, and GPT-2 small's, with a batch of one sequence (as
# `lab-10 train` takes them).
DEFAULTS = {
    "transformer": {"d_model": 512, "nhead": 8, "layers": 6, "ffn": 2048, "vocab": None,
                    "dropout": 0.1, "seq": 100, "batch": 1},
    "gpt2": {"d_model": 768, "nhead": 12, "layers": 12, "ffn": None, "vocab": 50257,
             "dropout": 0.0, "seq": 1024, "batch": 1},
}
GPT2_MIN_POSITIONS = 1024
GPT2_SMALL_PARAMS = 124_439_808
MIB = 1 << 20


# The command line: everything here runs without a GPU.

def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def share(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (a share such as 0.25)")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share: above 0 and at most 1")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def size_bytes(text):
    """A size such as 79GiB, 512MiB or 1000000 (bytes)."""
    units = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
             "KB": 10**3, "MB": 10**6, "GB": 10**9}
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2) not in units or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 79GiB")
    return int(float(m.group(1)) * units[m.group(2)])


def parser():
    p = argparse.ArgumentParser(
        description="PyTorch's twin of `lab-10 train`: one training run, its peak memory "
                    "and step time with PyTorch's meanings.")
    p.add_argument("--model", choices=["transformer", "gpt2"], default="transformer")
    p.add_argument("--d-model", type=positive_int)
    p.add_argument("--nhead", type=positive_int)
    p.add_argument("--layers", type=positive_int,
                   help="encoder and decoder layers each (transformer), blocks (gpt2)")
    p.add_argument("--ffn", type=positive_int,
                   help="dim_feedforward (transformer; gpt2's is 4 * d_model)")
    p.add_argument("--vocab", type=positive_int, help="vocabulary (gpt2)")
    p.add_argument("--vocab-multiple", type=positive_int, default=1, metavar="N",
                   help="round the token table and the head up to a multiple of N rows "
                        "(gpt2; nanoGPT's 50304 is 64); the extra rows are never a token")
    p.add_argument("--dropout", type=float)
    p.add_argument("--batch", type=positive_int, help="the micro-batch")
    p.add_argument("--seq", type=positive_int)
    p.add_argument("--steps", type=positive_int, default=5, help="optimizer steps")
    p.add_argument("--accum", type=positive_int, default=1,
                   help="micro-batches per optimizer step")
    p.add_argument("--checkpoint", choices=["none", "layers", "selective"], default="none")
    p.add_argument("--offload", action="store_true",
                   help="saved activations to pinned host memory (save_on_cpu)")
    p.add_argument("--offload-share", type=share, default=1.0,
                   help="with --offload, the share of the saved bytes sent (0 < S <= 1)")
    p.add_argument("--attention", choices=["naive", "fused"], default="fused")
    p.add_argument("--amp", choices=["none", "bf16", "f16"], default="none")
    p.add_argument("--optimizer", choices=["adam", "adamw", "sgd"], default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--warmup", type=non_negative_int, default=1,
                   help="steps left out of step_ms")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--zero1", action="store_true",
                   help="under torchrun: DDP with ZeroRedundancyOptimizer (ZeRO stage 1: "
                        "optimizer state sharded)")
    p.add_argument("--zero2", action="store_true",
                   help="under torchrun: FSDP with SHARD_GRAD_OP (ZeRO stage 2) instead of DDP")
    p.add_argument("--zero3", action="store_true",
                   help="under torchrun: FSDP2's fully_shard on every layer and the model "
                        "(ZeRO stage 3) instead of DDP")
    p.add_argument("--snapshot", metavar="FILE",
                   help="record the allocator's history from before the model is built "
                        "(torch.cuda.memory._record_memory_history, Python stacks) and "
                        "dump the snapshot pickle to FILE at the end, for `lab-03 "
                        "summary`, `plot` and `compare`; under torchrun FILE.rankN per "
                        "rank. Capturing a stack per allocation slows the steps")
    p.add_argument("--device", default="cuda", help="cuda or cuda:N")
    p.add_argument("--conf", metavar="CONF",
                   help="PYTORCH_CUDA_ALLOC_CONF for this process, set before CUDA starts "
                        "(default: the environment's, else PyTorch's defaults)")
    p.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compile", choices=COMPILE_MODES, default="none",
                   help="run forward and loss under torch.compile in this mode (none: "
                        "eager). The warm-up steps compile; the peaks are reset after "
                        "them, so that autotuning's trial buffers are not counted")
    p.add_argument("--graph", action="store_true",
                   help="after the warm-up steps, capture the step (forward, backward, "
                        "optimizer step, zero_grad) once with torch.cuda.graph and replay "
                        "it, each step's data copied into the captured inputs; Adam and "
                        "AdamW are made capturable (lab-10 train --graph's twin)")
    p.add_argument("--capacity", metavar="SIZE", type=size_bytes,
                   help="the most the allocator may reserve, e.g. 79GiB "
                        "(torch.cuda.set_per_process_memory_fraction(SIZE / total))")
    return p


# torch.compile's modes the twin offers: Inductor's default, and its autotuned kernels
# without CUDA graphs (a graph's private pool would hide the allocator's peaks).
COMPILE_MODES = ["none", "default", "max-autotune-no-cudagraphs"]


def parse_config(argv, world_size=1):
    """The effective configuration (every flag, defaults filled in for the model), or an
    argparse error (exit status 2) naming what is wrong."""
    p = parser()
    a = p.parse_args(argv)
    if a.dry_run:
        p.error("--dry-run: PyTorch has no device that allocates without computing; the "
                "prediction is the labs' own (`lab-10 train --dry-run`)")
    if a.device in ("sim", "dry"):
        p.error(f"--device {a.device} is the labs' simulated GPU; PyTorch has no such "
                "device: use cuda or cuda:N")
    if not re.fullmatch(r"cuda(:\d+)?", a.device):
        p.error(f"--device {a.device!r}: this twin measures a GPU: use cuda or cuda:N")
    if world_size > 1 and a.device != "cuda":
        p.error("under torchrun each process takes the GPU cuda:LOCAL_RANK: leave "
                "--device at cuda")
    d = DEFAULTS[a.model]
    cfg = {"model": a.model}
    for key in ("d_model", "nhead", "layers", "ffn", "vocab", "dropout", "batch", "seq"):
        value = getattr(a, key)
        cfg[key] = d[key] if value is None else value
    if a.model == "gpt2":
        if a.ffn is not None and a.ffn != 4 * cfg["d_model"]:
            p.error(f"--ffn {a.ffn}: GPT-2's feed-forward width is 4 * d_model = "
                    f"{4 * cfg['d_model']}; leave --ffn out")
        cfg["ffn"] = 4 * cfg["d_model"]
        cfg["n_positions"] = max(cfg["seq"], GPT2_MIN_POSITIONS)
        m = a.vocab_multiple
        cfg["vocab_padded"] = -(-cfg["vocab"] // m) * m
    else:
        if a.vocab is not None:
            p.error("--vocab is for --model gpt2 (the transformer reads vectors, not tokens)")
        if a.vocab_multiple != 1:
            p.error("--vocab-multiple is for --model gpt2")
        cfg["n_positions"] = None
    if cfg["d_model"] % cfg["nhead"]:
        p.error(f"--d-model {cfg['d_model']} must be divisible by --nhead {cfg['nhead']}")
    if not 0.0 <= cfg["dropout"] < 1.0:
        p.error(f"--dropout {cfg['dropout']} must be in [0, 1)")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        p.error(f"--lr {a.lr} must be a positive number")
    if a.offload_share < 1.0 and not a.offload:
        p.error("--offload-share needs --offload")
    if a.compile != "none":
        if world_size > 1:
            p.error("--compile measures one GPU: run it without torchrun")
        if a.offload:
            p.error("--compile and --offload: save_on_cpu's hooks break the compiled graph")
        if a.warmup < 1:
            p.error("--compile needs --warmup 1 or more: the first step compiles")
    if a.graph:
        why = None
        if world_size > 1 or a.zero1 or a.zero2 or a.zero3:
            why = "it captures one GPU's step: run it without torchrun"
        elif a.offload:
            why = "save_on_cpu's copies to the host cannot be captured"
        elif a.amp == "f16":
            why = "the gradient scaler reads its overflow flag on the host; use --amp bf16"
        elif cfg["dropout"] > 0:
            why = ("lab-10 train --graph refuses dropout (its replays would repeat the mask); "
                   "use --dropout 0")
        elif a.warmup < 1:
            why = "the warm-up steps run eagerly before the capture: give --warmup 1 or more"
        elif a.compile != "none":
            why = "torch.compile's reduce-overhead mode is its own graph; use one or the other"
        if why:
            p.error(f"--graph: {why}")
    cfg.update(graph=a.graph, compile=a.compile, steps=a.steps, accum=a.accum, checkpoint=a.checkpoint, offload=a.offload,
               offload_share=a.offload_share,
               attention=a.attention, amp=a.amp, optimizer=a.optimizer, lr=a.lr,
               seed=a.seed, warmup=a.warmup, device=a.device, json=a.json,
               snapshot=a.snapshot, alloc_conf=a.conf, zero1=a.zero1, zero2=a.zero2,
               zero3=a.zero3, capacity=a.capacity)
    return cfg


def config_fields(cfg):
    """The configuration as reports give it: the run's settings, not where output goes."""
    return {k: v for k, v in cfg.items()
            if k not in ("json", "snapshot", "alloc_conf", "capacity")}


# Entries of the memory history kept for --snapshot, as `lab-10 train --snapshot` keeps:
# more than a run of a few GPT-2 small steps makes, so that the trace starts with it.
SNAPSHOT_ENTRIES = 1 << 23


def start_snapshot(cfg):
    """--snapshot: PyTorch's memory history from now on (stacks of Python frames only:
    C++ frames would take minutes to symbolise at the dump; and of allocations only:
    recording the stacks of frees too, context="all", makes backward through
    torch.utils.checkpoint fail in PyTorch 2.11 with "SystemError: run_backward
    returned NULL without setting an exception")."""
    if cfg["snapshot"] is not None:
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc",
                                                 stacks="python",
                                                 max_entries=SNAPSHOT_ENTRIES)


def dump_snapshot(cfg, rank, world_size):
    """--snapshot: the pickle of segments, blocks and the trace, then recording stops."""
    path = cfg["snapshot"]
    if path is None:
        return
    if world_size > 1:
        path = f"{path}.rank{rank}"
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"wrote {path}", file=sys.stderr, flush=True)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return None
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def gpt2_parameter_count(cfg):
    """`V E + P E + layers (12 E^2 + 13 E) + 2 E`: the head is tied, so not counted."""
    e = cfg["d_model"]
    return (cfg["vocab_padded"] * e + cfg["n_positions"] * e
            + cfg["layers"] * (12 * e * e + 13 * e) + 2 * e)


def summary(report):
    """The readable form of the report."""
    c = report["config"]
    lines = [f"{c['model']} on {report['device']} (PyTorch {report['torch']}), "
             f"{report['params']:,} parameters, world size {report['world_size']}"]
    lines.append(f"  batch {c['batch']} x seq {c['seq']}, accum {c['accum']}, "
                 f"checkpoint {c['checkpoint']}, offload {c['offload']}, "
                 f"attention {c['attention']} ({', '.join(report['sdpa_backends'])}), "
                 f"amp {c['amp']}, {c['optimizer']} lr {c['lr']}, "
                 f"compile {c['compile']}")
    if "oom" in report:
        lines.append(f"  OUT OF MEMORY: {report['oom'].splitlines()[0]}")
    lines.append(f"  peak allocated {report['peak_allocated'] / MIB:10.1f} MiB")
    lines.append(f"  peak reserved  {report['peak_reserved'] / MIB:10.1f} MiB")
    for name, size in (report.get("by_category") or {}).items():
        lines.append(f"    {name:<16}{size / MIB:10.1f} MiB")
    if report.get("step_ms") is not None:
        lines.append(f"  step           {report['step_ms']:10.2f} ms (median after "
                     f"{c['warmup']} warm-up)")
    if report.get("losses"):
        lines.append("  losses         " + " ".join(f"{x:.4f}" for x in report["losses"]))
    if c["amp"] == "f16":
        lines.append(f"  skipped steps  {report['skipped_steps']}")
    return "\n".join(lines)


# The models.

class SteppedTransformer(nn.Transformer):
    """nn.Transformer whose stacks can run layer by layer through `wrap` (a checkpoint):
    the encoder layers, the encoder's final norm, the decoder layers, the decoder's final
    norm, as TransformerEncoder and TransformerDecoder run them. Without `wrap` it is
    nn.Transformer.forward itself."""

    def __init__(self, cfg, wrap):
        super().__init__(d_model=cfg["d_model"], nhead=cfg["nhead"],
                         num_encoder_layers=cfg["layers"], num_decoder_layers=cfg["layers"],
                         dim_feedforward=cfg["ffn"], dropout=cfg["dropout"],
                         batch_first=True)
        self.wrap = wrap

    def forward(self, src, tgt):
        if self.wrap is None:
            return super().forward(src, tgt)
        x = src
        for layer in self.encoder.layers:
            x = self.wrap(layer, x)
        memory = self.encoder.norm(x)
        y = tgt
        for layer in self.decoder.layers:
            y = self.wrap(layer, y, memory)
        return self.decoder.norm(y)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        e = cfg["d_model"]
        self.c_attn = nn.Linear(e, 3 * e)
        self.c_proj = nn.Linear(e, e)
        self.resid_dropout = nn.Dropout(cfg["dropout"])
        self.n_head = cfg["nhead"]
        self.dropout = cfg["dropout"]

    def forward(self, x):
        b, t, e = x.shape
        q, k, v = self.c_attn(x).split(e, dim=2)
        q, k, v = (z.view(b, t, self.n_head, e // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(b, t, e)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        e = cfg["d_model"]
        self.c_fc = nn.Linear(e, 4 * e)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * e, e)
        self.dropout = nn.Dropout(cfg["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg["d_model"])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg["d_model"])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 as labs/core/nn/src/nn/gpt2.rs (and nanoGPT) lays it out; the logits are
    `ln_f(x) wte^T`, the head being the token embedding itself (no lm_head parameter)."""

    def __init__(self, cfg, wrap):
        super().__init__()
        e = cfg["d_model"]
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(cfg["vocab_padded"], e),
            "wpe": nn.Embedding(cfg["n_positions"], e),
            "drop": nn.Dropout(cfg["dropout"]),
            "h": nn.ModuleList(Block(cfg) for _ in range(cfg["layers"])),
            "ln_f": nn.LayerNorm(e),
        })
        self.wrap = wrap
        # GPT-2's initialisation: N(0, 0.02) weights and embeddings, the residual
        # projections N(0, 0.02 / sqrt(2 layers)), zero biases, LayerNorms one and zero.
        proj_std = 0.02 / math.sqrt(2 * cfg["layers"])
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=proj_std)
            elif name.endswith(".weight") and p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        tr = self.transformer
        pos = torch.arange(t, device=idx.device)
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))
        for block in tr.h:
            x = block(x) if self.wrap is None else self.wrap(block, x)
        return F.linear(tr.ln_f(x), tr.wte.weight)


def aten_overloads(*names):
    """The default overloads of the named aten ops this PyTorch has."""
    found = set()
    for name in names:
        try:
            found.add(getattr(torch.ops.aten, name).default)
        except (AttributeError, RuntimeError):
            pass
    return found


def selective_policy():
    """The selective-checkpoint policy: keep what is expensive to recompute (matrix
    products and attention), recompute the rest (norms, activations, dropout, adds)."""
    saved = aten_overloads(
        "mm", "addmm", "bmm", "baddbmm",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention")

    def save_matmul_and_attention(ctx, op, *args, **kwargs):
        if op in saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return save_matmul_and_attention


def layer_wrapper(mode):
    """How every layer runs: directly (None) or through a non-reentrant checkpoint."""
    if mode == "none":
        return None
    if mode == "layers":
        return lambda layer, *args: checkpoint(layer, *args, use_reentrant=False)
    context_fn = functools.partial(create_selective_checkpoint_contexts, selective_policy())
    return lambda layer, *args: checkpoint(layer, *args, use_reentrant=False,
                                           context_fn=context_fn)


def build_model(cfg, device):
    wrap = layer_wrapper(cfg["checkpoint"])
    if cfg["model"] == "transformer":
        model = SteppedTransformer(cfg, wrap)
    else:
        model = GPT2(cfg, wrap)
    model = model.to(device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    if cfg["model"] == "gpt2" and params != gpt2_parameter_count(cfg):
        raise AssertionError(f"GPT-2 has {params} parameters, the shapes say "
                             f"{gpt2_parameter_count(cfg)}")
    return model, params


def build_optimizer(cfg, model, sharded=False):
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    if cfg["graph"] and cfg["optimizer"] != "sgd":
        # ANCHOR: capturable
        # The step counts on the device, so that each replay sees its own.
        return kinds[cfg["optimizer"]](model.parameters(), lr=cfg["lr"], capturable=True)
        # ANCHOR_END: capturable
    if sharded:
        # ANCHOR: zero_redundancy
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(model.parameters(),
                                       optimizer_class=kinds[cfg["optimizer"]], lr=cfg["lr"])
        # ANCHOR_END: zero_redundancy
    return kinds[cfg["optimizer"]](model.parameters(), lr=cfg["lr"])


def forward_loss(model, loss_fn, inputs, target):
    """One micro-batch's forward and loss: what --compile compiles, as one graph."""
    return loss_fn(model(*inputs), target)


def batch_maker(cfg, device, generator):
    """Fresh random data for one micro-batch: (model inputs, target, loss function)."""
    b, s = cfg["batch"], cfg["seq"]
    if cfg["model"] == "transformer":
        def make():
            shape = (b, s, cfg["d_model"])
            src, tgt, target = (torch.randn(shape, device=device, generator=generator)
                                for _ in range(3))
            return (src, tgt), target, F.mse_loss
    else:
        # ANCHOR: next_token_loss
        def next_token_loss(logits, targets):
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        # ANCHOR_END: next_token_loss

        def make():
            ids = torch.randint(0, cfg["vocab"], (b, s + 1), device=device,
                                generator=generator)
            return (ids[:, :-1],), ids[:, 1:], next_token_loss
    return make


def sdpa_backends():
    """The attention backends scaled_dot_product_attention may choose from here."""
    enabled = {
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "math": torch.backends.cuda.math_sdp_enabled(),
    }
    return [name for name, on in enabled.items() if on]


def sdpa_calls(profile):
    """The attention kernels one profiled forward called, by aten name and count."""
    return {e.key: e.count for e in profile.key_averages()
            if e.key.startswith("aten::_scaled_dot_product")
            or e.key.startswith("aten::_flash_attention")
            or e.key.startswith("aten::_efficient_attention")}


def nbytes(tensors):
    """The bytes on this rank: a sharded tensor's (FSDP2's DTensor) local shard."""
    local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
    return sum(t.numel() * t.element_size() for t in local)


def model_layers(model):
    """The layers fully_shard wraps one by one, in forward order: lab-10's units."""
    if isinstance(model, GPT2):
        return list(model.transformer.h)
    return list(model.encoder.layers) + list(model.decoder.layers)


def optimizer_state_bytes(optimizer):
    # ZeroRedundancyOptimizer's own state is rank 0's view after a consolidation; this
    # rank's shard is its local optimizer's.
    optimizer = getattr(optimizer, "optim", optimizer)
    """The optimizer's state tensors on the GPU (Adam's `step` counters stay on the
    host unless fused or capturable)."""
    return nbytes(v for state in optimizer.state.values() for v in state.values()
                  if torch.is_tensor(v) and v.is_cuda)


class ShareOffload(torch.autograd.graph.saved_tensors_hooks):
    """save_on_cpu(pin_memory=True) for a share of each forward pass's saved bytes: a
    tensor of at least 1 MiB whose memory is not a parameter's goes to pinned host
    memory only while the bytes sent stay within `share` of those that could have
    gone, counted over storages as lab-10 counts them (labs/core/tensor/src/autograd/
    offload.rs, `ShareLedger`): each storage once, every view of it following the
    first view's decision, afresh at each forward pass. The rest stay on the device.
    The copies are save_on_cpu's: copy_ into pinned memory on the current stream, back
    with to(non_blocking=True)."""

    def __init__(self, share, model):
        self.share = share
        self.sent_total, self.could_total = 0, 0  # over forward passes, for the report
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.new_forward()
        super().__init__(self.pack, self.unpack)

    def new_forward(self):
        # StorageWeakRef names a storage without keeping its memory, and no later
        # storage gets its name while the reference is held.
        self.decided, self.sent, self.could = {}, 0, 0

    def __enter__(self):
        self.new_forward()
        return super().__enter__()

    def sends(self, tensor):
        storage = tensor.untyped_storage()
        key = StorageWeakRef(storage)
        if key not in self.decided:
            nbytes = storage.nbytes()
            send = self.sent + nbytes <= self.share * (self.could + nbytes)
            self.could += nbytes
            self.sent += nbytes if send else 0
            self.could_total += nbytes
            self.sent_total += nbytes if send else 0
            self.decided[key] = send
        return self.decided[key]

    def pack(self, tensor):
        nbytes = tensor.numel() * tensor.element_size()
        if (not tensor.is_cuda or nbytes < MIB
                or tensor.untyped_storage().data_ptr() in self.parameters
                or not self.sends(tensor)):
            return (None, tensor)
        packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                             pin_memory=True)
        packed.copy_(tensor)
        return (tensor.device, packed)

    def unpack(self, packed):
        device, tensor = packed
        return tensor if device is None else tensor.to(device, non_blocking=True)


# Dense peaks of the GPUs the labs know, FLOP/s: (name contains, bf16/f16, float32
# without TF32), as labs/core/train/src/flops.rs has them.
PEAK_FLOPS = [("H100 PCIe", 756.5e12, 51.2e12), ("H100", 989.4e12, 66.9e12),
              ("H200", 989.4e12, 66.9e12), ("A100", 312.0e12, 19.5e12)]


def model_flops_per_step(cfg, params):
    """The model's FLOPs in one optimizer step of a rank, as lab-10's report counts them:
    6 per parameter of a matrix product per token (GPT-2's position table left out) and
    12 d_model seq per token for each attention (GPT-2: one per block; the Transformer:
    three per layer)."""
    tokens = cfg["batch"] * cfg["seq"] * cfg["accum"]
    if cfg["model"] == "gpt2":
        attentions, looked_up = cfg["layers"], cfg["n_positions"] * cfg["d_model"]
    else:
        attentions, looked_up = 3 * cfg["layers"], 0
    return (6 * max(params - looked_up, 0)
            + 12 * attentions * cfg["d_model"] * cfg["seq"]) * tokens


def peak_flops(device_name, amp):
    for name, half, single in PEAK_FLOPS:
        if name in device_name:
            return single if amp == "none" else half
    return None


class Run:
    """One training run's state and what it measured so far."""

    def __init__(self, cfg, device, rank, world_size):
        self.cfg, self.device, self.rank, self.world_size = cfg, device, rank, world_size
        torch.manual_seed(cfg["seed"])  # the same initial weights on every rank
        self.model, self.params = build_model(cfg, device)
        self.ddp = None
        # FSDP2 wraps the model in place: no wrapper to call, no no_sync.
        self.fully_sharded = world_size > 1 and cfg["zero3"]
        if self.fully_sharded:
            # ANCHOR: fully_shard
            from torch.distributed.fsdp import fully_shard
            for layer in model_layers(self.model):
                fully_shard(layer)
            fully_shard(self.model)
            # ANCHOR_END: fully_shard
        elif world_size > 1 and cfg["zero2"]:
            # ANCHOR: fsdp_wrap
            from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
            self.ddp = FullyShardedDataParallel(
                self.model, device_id=device,
                sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
            # ANCHOR_END: fsdp_wrap
        elif world_size > 1:
            # ANCHOR: ddp_wrap
            self.ddp = DistributedDataParallel(self.model, device_ids=[device.index],
                                               bucket_cap_mb=25)
            # ANCHOR_END: ddp_wrap
        # Over the wrapper's parameters: FSDP's are its flat shards.
        self.optimizer = build_optimizer(cfg, self.model if self.ddp is None else self.ddp,
                                         sharded=world_size > 1 and cfg["zero1"])
        self.scaler = torch.amp.GradScaler("cuda") if cfg["amp"] == "f16" else None
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg["seed"] + rank)
        torch.cuda.manual_seed(cfg["seed"] + rank)  # dropout differs between ranks
        self.make_batch = batch_maker(cfg, device, generator)
        self.forward_loss = forward_loss
        if cfg["compile"] != "none":
            # ANCHOR: compile
            self.forward_loss = torch.compile(forward_loss, mode=cfg["compile"])
            # ANCHOR_END: compile
        self.times, self.losses, self.skipped = [], [], 0
        # --graph: the captured step, its inputs and its loss, once captured.
        self.graph = None
        # cudaMalloc and cudaFree calls of the caching allocator in each step.
        self.driver_calls = []
        self.gradient_bytes = 0
        self.backends, self.calls = [], None
        if cfg["offload"] and cfg["offload_share"] < 1.0:
            self.share_offload = ShareOffload(cfg["offload_share"], self.model)

    def graph_report(self):
        """--graph: what the captured step's private pool reserves and holds at the end
        (the snapshot's segments whose segment_pool_id is the graph's pool)."""
        if self.graph is None:
            return None
        pool = tuple(self.graph[0].pool())
        segments = [s for s in torch.cuda.memory_snapshot()
                    if tuple(s.get("segment_pool_id", (0, 0))) == pool]
        return {
            "nodes": None,
            "pool_reserved": sum(s["total_size"] for s in segments),
            "pool_allocated": sum(s["allocated_size"] for s in segments),
        }

    def offload_report(self):
        if not self.cfg["offload"]:
            return None
        report = {"pin_memory": True, "share": self.cfg["offload_share"]}
        if self.cfg["offload_share"] < 1.0:
            report["share_sent_bytes"] = self.share_offload.sent_total
            report["share_could_bytes"] = self.share_offload.could_total
        return report

    @contextlib.contextmanager
    def forward_context(self):
        """Around forward and loss: autocast, and saved tensors to the host."""
        with contextlib.ExitStack() as stack:
            if self.cfg["amp"] != "none":
                dtype = torch.bfloat16 if self.cfg["amp"] == "bf16" else torch.float16
                stack.enter_context(torch.autocast("cuda", dtype=dtype))
            if self.cfg["offload"] and self.cfg["offload_share"] < 1.0:
                stack.enter_context(self.share_offload)
            elif self.cfg["offload"]:
                stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=True))
            yield

    def micro_batch(self, k, profile):
        """Forward, loss / K and backward of one micro-batch; DDP's all-reduce only on
        the last of the step's (no_sync on the others)."""
        # ANCHOR: no_sync
        model = self.model if self.ddp is None else self.ddp
        last = k == self.cfg["accum"] - 1
        sync = contextlib.nullcontext() if self.ddp is None or last else self.ddp.no_sync()
        with sync:
            inputs, target, loss_fn = self.make_batch()
            probe = contextlib.nullcontext()
            if profile:
                probe = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with probe as prof, self.forward_context():
                loss = self.forward_loss(model, loss_fn, inputs, target) / self.cfg["accum"]
            if profile:
                self.calls = sdpa_calls(prof)
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        # ANCHOR_END: no_sync
        return loss.detach().float()

    # ANCHOR: graph_step
    def graph_step(self):
        """One step under --graph: fresh data copied into the captured inputs, then a
        replay; the first time, the step is captured on that data first (a capture
        records the work without running it). Returns the step's summed loss."""
        batches = [self.make_batch() for _ in range(self.cfg["accum"])]
        if self.graph is None:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                total = torch.zeros((), device=self.device)
                for inputs, target, loss_fn in batches:
                    with self.forward_context():
                        loss = loss_fn(self.model(*inputs), target) / self.cfg["accum"]
                    loss.backward()
                    total += loss.detach().float()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            self.graph = (graph, batches, total)
        else:
            graph, inputs, total = self.graph
            for (static, _, _), (fresh, _, _) in zip(inputs, batches):
                for a, b in zip(static, fresh):
                    a.copy_(b)
            for (_, static, _), (_, fresh, _) in zip(inputs, batches):
                static.copy_(fresh)
        self.graph[0].replay()
        return self.graph[2]
    # ANCHOR_END: graph_step

    def step(self, index):
        cfg = self.cfg
        torch.cuda.synchronize(self.device)
        segments_before = segment_calls(self.device)
        start = time.perf_counter()
        if cfg["graph"] and index >= cfg["warmup"]:
            total = self.graph_step()
            torch.cuda.synchronize(self.device)
            self.times.append((time.perf_counter() - start) * 1e3)
            self.driver_calls.append(segment_calls(self.device) - segments_before)
            self.losses.append(total.item())
            return
        total = torch.zeros((), device=self.device)
        for k in range(cfg["accum"]):
            # The attention kernels actually chosen, seen once, in a warm-up step.
            # (Not under torch.compile: the profiler would trace the compilation.)
            profile = index == 0 and k == 0 and cfg["warmup"] > 0 and cfg["compile"] == "none"
            total += self.micro_batch(k, profile)
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.skipped += self.scaler.get_scale() < before
        else:
            self.optimizer.step()
        if index == cfg["steps"] - 1:
            self.gradient_bytes = nbytes(p.grad for p in self.model.parameters()
                                         if p.grad is not None)
        self.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(self.device)
        self.times.append((time.perf_counter() - start) * 1e3)
        self.driver_calls.append(segment_calls(self.device) - segments_before)
        self.losses.append(total.item())

    def train(self):
        naive = self.cfg["attention"] == "naive"
        with sdpa_kernel(SDPBackend.MATH) if naive else contextlib.nullcontext():
            self.backends = sdpa_backends()
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            for index in range(self.cfg["steps"]):
                self.step(index)
                if index + 1 == self.cfg["warmup"] and self.cfg["compile"] != "none":
                    torch.cuda.reset_peak_memory_stats(self.device)

    def report(self):
        cfg = self.cfg
        peak_allocated = torch.cuda.max_memory_allocated(self.device)
        workspaces = cublas_workspace_bytes(self.device)
        params = nbytes(self.model.parameters())
        state = optimizer_state_bytes(self.optimizer)
        notes = [
            "PyTorch's allocator has no categories: parameter, gradient and "
            "optimizer_state are the bytes of those tensors at the end of the run (the "
            "gradients just before the last zero_grad), other is peak_allocated less "
            "the three",
            "sdpa_calls: the attention ops of the first micro-batch's forward (a warm-up "
            "step; null without one)",
            "driver_calls_per_step: the allocator's cudaMalloc and cudaFree calls in each "
            "step (num_device_alloc and num_device_free; PyTorch counts no mapping of an "
            "expandable segment); steady_driver_calls_per_step: the most of any step "
            "after the third",
            "gemm_workspace_bytes: what cuBLAS's workspaces held in the allocator at the "
            "end (one per cuBLAS handle and stream: the main thread's and the autograd "
            "engine's), part of peak_allocated",
        ]
        if self.ddp is not None or self.fully_sharded:
            notes.append("data parallel: peaks, step_ms and losses are rank 0's (every "
                         "rank's peaks in ranks); other includes DDP's gradient buckets")
        if cfg["graph"]:
            notes.append("torch.cuda.graph: the step after the warm-up ones is captured "
                         "once and replayed; the gradients live in the graph's pool and are "
                         "freed inside it, so gradient is 0 and they count in other; "
                         "graph.nodes is not known to PyTorch's API (null)")
        if cfg["compile"] != "none":
            notes.append("torch.compile: forward and loss are one compiled function; "
                         "the warm-up steps compile it (step_ms_all has their time), "
                         "and the peaks are those of the steps after them")
        if self.fully_sharded:
            notes.append("fully_shard: parameter, gradient and optimizer_state are this "
                         "rank's shards (DTensor.to_local()); other includes the layers "
                         "gathered at the peak")
        step_ms = median(self.times[cfg["warmup"]:])
        flops = model_flops_per_step(cfg, self.params)
        peak = peak_flops(torch.cuda.get_device_name(self.device), cfg["amp"])
        return {
            "model": cfg["model"],
            "config": config_fields(cfg),
            "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "device": torch.cuda.get_device_name(self.device),
            "torch": torch.__version__,
            "world_size": self.world_size,
            "params": self.params,
            "peak_allocated": peak_allocated,
            "peak_reserved": torch.cuda.max_memory_reserved(self.device),
            "step_ms": step_ms,
            "model_flops_per_step": flops,
            "peak_flops": peak,
            "mfu": None if peak is None or step_ms is None else flops / (step_ms / 1e3) / peak,
            "step_ms_all": self.times,
            "driver_calls_per_step": self.driver_calls,
            "steady_driver_calls_per_step": max(self.driver_calls[3:], default=None),
            "gemm_workspace_bytes": workspaces,
            "losses": self.losses,
            "by_category": {
                "parameter": params,
                "gradient": self.gradient_bytes,
                "optimizer_state": state,
                "other": max(0, peak_allocated - params - self.gradient_bytes - state),
            },
            "skipped_steps": None if self.scaler is None else self.skipped,
            "num_ooms": torch.cuda.memory_stats(self.device).get("num_ooms", 0),
            "sdpa_backends": self.backends,
            "sdpa_calls": self.calls,
            "offload": self.offload_report(),
            "graph": self.graph_report(),
            "notes": notes,
        }


def segment_calls(device):
    """The caching allocator's cudaMalloc and cudaFree calls so far."""
    stats = torch.cuda.memory_stats(device)
    return stats.get("num_device_alloc", 0) + stats.get("num_device_free", 0)


def cublas_workspace_bytes(device):
    """The bytes cuBLAS's workspaces hold in PyTorch's allocator, measured by freeing
    them: PyTorch keeps one per cuBLAS handle and stream (the main thread's, and the
    autograd engine's thread's for backward), taken from the allocator on first use and
    kept, so that they count in memory_allocated. Call last: they are gone after it."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch._C._cuda_clearCublasWorkspaces()
    return before - torch.cuda.memory_allocated(device)


def oom_report(cfg, device, error, rank, world_size):
    """What is known when the run did not fit: the peaks so far."""
    return {
        "model": cfg["model"],
        "config": config_fields(cfg),
        "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "world_size": world_size,
        "rank": rank,
        "oom": str(error),
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
        "num_ooms": torch.cuda.memory_stats(device).get("num_ooms", 0),
    }


def gather_peaks(report, device, world_size):
    """Every rank's peaks and step time, on every rank (a tensor all-gather, which needs
    no pickling: all_gather_object would want numpy)."""
    step_ms = report["step_ms"]
    mine = torch.tensor([report["peak_allocated"], report["peak_reserved"],
                         math.nan if step_ms is None else step_ms],
                        dtype=torch.float64, device=device)
    every = torch.empty(world_size * 3, dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(every, mine)
    rows = every.view(world_size, 3).tolist()
    return [{"rank": r, "peak_allocated": int(a), "peak_reserved": int(b),
             "step_ms": None if math.isnan(ms) else ms} for r, (a, b, ms) in enumerate(rows)]


def main(argv=None):
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = parse_config(sys.argv[1:] if argv is None else argv, world_size)
    if cfg["alloc_conf"] is not None:
        # Before CUDA starts: the allocator reads its configuration once.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = cfg["alloc_conf"]
    if not torch.cuda.is_available():
        sys.exit("pytorch-train.py: PyTorch sees no CUDA GPU; this twin measures one")
    rank = 0
    if world_size > 1:
        # ANCHOR: ddp_init
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        # ANCHOR_END: ddp_init
    else:
        device = torch.device(cfg["device"])
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    cfg["device"] = str(device)
    if cfg["capacity"] is not None:
        total = torch.cuda.get_device_properties(device).total_memory
        if cfg["capacity"] > total:
            sys.exit(f"pytorch-train.py: --capacity: {device} has {total} bytes in all")
        torch.cuda.set_per_process_memory_fraction(cfg["capacity"] / total, device)
    run = None
    start_snapshot(cfg)
    try:
        run = Run(cfg, device, rank, world_size)
        run.train()
    except torch.cuda.OutOfMemoryError as e:
        dump_snapshot(cfg, rank, world_size)
        # Under torchrun the rank that ran out prints, and torchrun ends the others.
        report = oom_report(cfg, device, e, rank, world_size)
        if run is not None:
            report["losses"] = run.losses
        if cfg["json"]:
            print(json.dumps(report), flush=True)
        else:
            print(f"out of memory on rank {rank}: {e}\npeak allocated "
                  f"{report['peak_allocated'] / MIB:.1f} MiB, peak reserved "
                  f"{report['peak_reserved'] / MIB:.1f} MiB", file=sys.stderr)
        sys.exit(1)
    report = run.report()
    dump_snapshot(cfg, rank, world_size)
    if world_size > 1:
        report["ranks"] = gather_peaks(report, device, world_size)
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(report) if cfg["json"] else summary(report), flush=True)


if __name__ == "__main__":
    main()
