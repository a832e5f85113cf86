"""PyTorch parity fixtures: what PyTorch computes for every op and module the labs'
runtime has or is getting, written where `labs/core/tests/parity.rs` reads it:

  python3 ci/pytorch-fixtures.py [OUT_DIR]       # default: data/parity

Each case is one safetensors file, `OUT_DIR/NAME.safetensors`, holding

  input.I            the op's inputs, in call order (integer and bool inputs too;
                     bool is stored as U8, 0 or 1)
  param.NAME         a module's parameters, under PyTorch's dotted names
  output, output.K   the output (and a second output, such as max's indices)
  grad_output        a fixed random g: the gradients are those of (output * g).sum()
  grad.input.I       the gradient of each floating-point input
  grad.param.NAME    the gradient of each parameter

and, for an optimizer, `param.I.0` (before), then for each step K = 1, 2, 3 the
gradient `grad.I.K` it was given and the parameter `param.I.K` after the step.
`OUT_DIR/manifest.json` names each case, its op, its arguments, the dtype it computes in,
every tensor's dtype and shape, and the tolerances (`|got - want| <= atol + rtol *
|want|`).

Everything runs on the CPU in float32 (deterministic: one thread), plus a few float16 and bfloat16 cases, with fixed seeds and small shapes;
the whole folder stays well under 2 MB (checked at the end). The safetensors format is
written here by hand (an 8-byte little-endian header length, a JSON header padded with
spaces to 8 bytes, raw little-endian data), so the script needs only PyTorch, and every
file is read back and compared before the manifest is written. Any error stops it with
a non-zero exit and a traceback: a partial folder is never left looking complete (the
manifest is written last).

Written for PyTorch 2.11; it records the version it ran with in the manifest."""

import json
import os
import struct
import sys
import zlib

# The format, with no PyTorch: testable on its own.

ST_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1}


def encode_safetensors(entries, metadata=None):
    """entries: list of (name, dtype, shape, raw bytes). Returns the file's bytes."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    names = set()
    for name, dtype, shape, raw in entries:
        if name in names:
            raise ValueError(f"tensor name {name!r} given twice")
        names.add(name)
        if dtype not in ST_DTYPES:
            raise ValueError(f"{name}: dtype {dtype} not in {sorted(ST_DTYPES)}")
        count = 1
        for d in shape:
            count *= d
        if count * ST_DTYPES[dtype] != len(raw):
            raise ValueError(f"{name}: {len(raw)} bytes for {dtype} {shape}")
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(e[3] for e in entries)


def decode_safetensors(data):
    """The tiny reader: {name: (dtype, shape, raw bytes)}, checking what readers check
    (the header's length, offsets that tile the data exactly)."""
    if len(data) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"header length {n} past the end of {len(data)} bytes")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    body = data[8 + n :]
    header.pop("__metadata__", None)
    out = {}
    spans = []
    for name, info in header.items():
        start, end = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        if end - start != count * ST_DTYPES[info["dtype"]]:
            raise ValueError(f"{name}: offsets {start}..{end} do not fit {info}")
        spans.append((start, end))
        out[name] = (info["dtype"], list(info["shape"]), body[start:end])
    spans.sort()
    position = 0
    for start, end in spans:
        if start != position:
            raise ValueError(f"data offsets leave a gap or overlap at {start}")
        position = end
    if position != len(body):
        raise ValueError(f"the tensors cover {position} of {len(body)} data bytes")
    return out


def self_test_format():
    entries = [
        ("a", "F32", [2], struct.pack("<2f", 1.5, -2.0)),
        ("b", "I64", [], struct.pack("<q", -7)),
        ("c", "U8", [0, 3], b""),
    ]
    data = encode_safetensors(entries, {"case": "x"})
    assert (8 + struct.unpack("<Q", data[:8])[0]) % 8 == 0
    back = decode_safetensors(data)
    for name, dtype, shape, raw in entries:
        assert back[name] == (dtype, shape, raw), (name, back[name])
    for broken in (data[:5], data[:-1], struct.pack("<Q", 10**6) + data[8:]):
        try:
            decode_safetensors(broken)
        except (ValueError, json.JSONDecodeError, UnicodeDecodeError):
            pass
        else:
            raise AssertionError("a broken file was read")


# Everything below needs PyTorch.

torch = None
F = None
nn = None


def st_dtype(t):
    return {
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int32: "I32",
        torch.int64: "I64",
        torch.uint8: "U8",
        torch.bool: "U8",
    }[t.dtype]


def dtype_name(dtype):
    return {
        torch.float32: "float32",
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
    }[dtype]


def raw_bytes(t):
    """A tensor's elements as little-endian bytes, row-major."""
    t = t.detach().cpu()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return bytes(t.view(torch.uint8).tolist())


# (atol, rtol) by dtype: single ops, then composite modules (several roundings deep).
TOLERANCES = {"float32": (1e-5, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (4e-2, 4e-2)}
COMPOSITE = {"float32": (1e-4, 1e-3), "float16": (2e-2, 2e-2), "bfloat16": (8e-2, 8e-2)}


class Writer:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.cases = []
        self.names = set()
        self.total = 0

    def add(self, name, op, args, tensors, dtype, composite=False, extra=None):
        if name in self.names:
            raise ValueError(f"case {name} written twice")
        self.names.add(name)
        atol, rtol = (COMPOSITE if composite else TOLERANCES)[dtype_name(dtype)]
        entries = []
        for key, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: {key} is not a tensor")
            if t.is_floating_point() and not torch.isfinite(t.float()).all():
                raise ValueError(f"{name}: {key} has non-finite values")
            entries.append((key, st_dtype(t), list(t.shape), raw_bytes(t)))
        data = encode_safetensors(entries, {"case": name, "op": op})
        # Read back and compare before anything else is written.
        back = decode_safetensors(data)
        for key, t in tensors.items():
            dt, shape, raw = back[key]
            if (dt, shape, raw) != (st_dtype(t), list(t.shape), raw_bytes(t)):
                raise AssertionError(f"{name}: {key} did not read back")
            if t.numel() and t.dtype != torch.bool:
                rebuilt = torch.frombuffer(bytearray(raw), dtype=t.dtype).reshape(t.shape)
                if not torch.equal(rebuilt, t.detach().cpu().contiguous()):
                    raise AssertionError(f"{name}: {key} rebuilt differs")
        file = f"{name}.safetensors"
        with open(os.path.join(self.out_dir, file), "wb") as f:
            f.write(data)
        self.total += len(data)
        entry = {
            "name": name,
            "op": op,
            "file": file,
            "args": args,
            "dtype": dtype_name(dtype),
            "atol": atol,
            "rtol": rtol,
            "tensors": {
                k: {"dtype": st_dtype(t), "shape": list(t.shape)} for k, t in tensors.items()
            },
        }
        if extra:
            entry.update(extra)
        self.cases.append(entry)

    def finish(self, limit=2 * 1024 * 1024):
        manifest = {
            "version": 1,
            "torch": torch.__version__,
            "written_by": "ci/pytorch-fixtures.py",
            "gradients": "of (output * grad_output).sum()",
            "cases": self.cases,
        }
        text = json.dumps(manifest, indent=1).encode("utf-8")
        if self.total + len(text) > limit:
            raise AssertionError(f"fixtures take {self.total + len(text)} bytes, over {limit}")
        with open(os.path.join(self.out_dir, "manifest.json"), "wb") as f:
            f.write(text)
        return self.total + len(text)


def seed(name):
    torch.manual_seed(zlib.crc32(name.encode()))


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def gradients(name, primary, leaves, tensors, prefix):
    """g and the gradients of (primary * g).sum() with respect to `leaves` (a dict of
    key -> tensor), stored as `prefix + key`."""
    g = torch.randn(primary.shape, dtype=torch.float32).to(primary.dtype)
    tensors["grad_output"] = g
    keys = [k for k, t in leaves.items() if t.requires_grad]
    grads = torch.autograd.grad(primary, [leaves[k] for k in keys], g, allow_unused=True)
    for k, gr in zip(keys, grads):
        if gr is None:
            gr = torch.zeros_like(leaves[k])
        if gr.shape != leaves[k].shape:
            raise AssertionError(f"{name}: grad of {k} has shape {list(gr.shape)}")
        tensors[prefix + k] = gr.detach()


def functional(w, name, op, args, inputs, fn, dtype=None, composite=False):
    """One op over `inputs` (made inside the seeded scope by the caller's lambdas)."""
    dtype = dtype or torch.float32
    leaves = []
    for x in inputs:
        x = x.detach().clone()
        if x.is_floating_point():
            x.requires_grad_(True)
        leaves.append(x)
    outs = as_tuple(fn(*leaves))
    tensors = {f"input.{i}": x.detach() for i, x in enumerate(leaves)}
    tensors["output"] = outs[0].detach()
    for k, extra in enumerate(outs[1:], 1):
        tensors[f"output.{k}"] = extra.detach()
    if outs[0].is_floating_point() and outs[0].requires_grad:
        gradients(name, outs[0], {str(i): x for i, x in enumerate(leaves)}, tensors, "grad.input.")
    w.add(name, op, args, tensors, dtype, composite)


def module_case(w, name, op, args, module, inputs, call=None, dtype=None):
    """One module: its parameters (randomised by the caller where PyTorch initialises
    constants, so that no gradient is trivial) and its inputs."""
    dtype = dtype or torch.float32
    module = module.to(dtype)
    leaves = []
    for x in inputs:
        x = x.detach().clone()
        if x.is_floating_point():
            x = x.to(dtype).requires_grad_(True)
        leaves.append(x)
    out = as_tuple(call(module, *leaves) if call else module(*leaves))[0]
    tensors = {f"input.{i}": x.detach() for i, x in enumerate(leaves)}
    params = dict(module.named_parameters())
    for k, p in params.items():
        tensors[f"param.{k}"] = p.detach().clone()
    tensors["output"] = out.detach()
    g = torch.randn(out.shape, dtype=torch.float32).to(out.dtype)
    tensors["grad_output"] = g
    float_inputs = [(f"input.{i}", x) for i, x in enumerate(leaves) if x.requires_grad]
    targets = float_inputs + [(f"param.{k}", p) for k, p in params.items()]
    grads = torch.autograd.grad(out, [t for _, t in targets], g, allow_unused=True)
    for (k, t), gr in zip(targets, grads):
        tensors[f"grad.{k}"] = (torch.zeros_like(t) if gr is None else gr).detach()
    w.add(
        name,
        op,
        args,
        tensors,
        dtype,
        composite=True,
        extra={"params": list(params.keys()), "inputs": len(leaves)},
    )


def randomise(module, scale=0.5):
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * scale)
    return module


def optim_case(w, name, op, args, make, steps=3):
    seed(name)
    params = [nn.Parameter(torch.randn(4, 5)), nn.Parameter(torch.randn(5))]
    opt = make(params)
    tensors = {}
    for i, p in enumerate(params):
        tensors[f"param.{i}.0"] = p.detach().clone()
    for k in range(1, steps + 1):
        for i, p in enumerate(params):
            p.grad = torch.randn_like(p)
            tensors[f"grad.{i}.{k}"] = p.grad.detach().clone()
        opt.step()
        for i, p in enumerate(params):
            tensors[f"param.{i}.{k}"] = p.detach().clone()
    w.add(name, op, args, tensors, torch.float32, extra={"params": len(params), "steps": steps})


def positive(*shape):
    return torch.rand(*shape) * 1.5 + 0.25


def make_tiny_gpt2():
    """nanoGPT's GPT (its names and layout: Linear weights [out, in], biases on), defined
    here once torch is imported."""

    class Attention(nn.Module):
        def __init__(self, d, n_head):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.n_head = n_head

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Mlp(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.c_fc = nn.Linear(d, 4 * d)
            self.c_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, d, n_head):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = Attention(d, n_head)
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = Mlp(d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        def __init__(self, vocab, n_positions, d, n_layer, n_head):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab, d),
                wpe=nn.Embedding(n_positions, d),
                h=nn.ModuleList([Block(d, n_head) for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(d),
            ))
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied

        def forward(self, idx):
            pos = torch.arange(idx.shape[1])
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            return self.lm_head(self.transformer.ln_f(x))

    return Gpt


def TinyGpt2(*sizes):
    return make_tiny_gpt2()(*sizes)


def build(w):
    # Unary ops: same shape in and out.
    unary = [
        ("neg", torch.neg, lambda: torch.randn(4, 5)),
        ("exp", torch.exp, lambda: torch.randn(4, 5)),
        ("log", torch.log, lambda: positive(4, 5)),
        ("sqrt", torch.sqrt, lambda: positive(4, 5)),
        ("rsqrt", torch.rsqrt, lambda: positive(4, 5)),
        ("tanh", torch.tanh, lambda: torch.randn(4, 5)),
        ("relu", torch.relu, lambda: torch.randn(4, 5)),
        ("sigmoid", torch.sigmoid, lambda: torch.randn(4, 5)),
    ]
    for op, fn, make in unary:
        seed(op)
        functional(w, op, op, {}, [make()], fn)
    seed("gelu")
    functional(w, "gelu", "gelu", {"approximate": "none"}, [torch.randn(4, 5) * 2], F.gelu)
    seed("gelu_tanh")
    functional(
        w,
        "gelu_tanh",
        "gelu",
        {"approximate": "tanh"},
        [torch.randn(4, 5) * 2],
        lambda x: F.gelu(x, approximate="tanh"),
    )

    # Binary ops: same shapes, then broadcasting ones.
    binary = [
        ("add", torch.add, torch.randn, torch.randn),
        ("sub", torch.sub, torch.randn, torch.randn),
        ("mul", torch.mul, torch.randn, torch.randn),
        ("div", torch.div, torch.randn, positive),
        ("pow", torch.pow, positive, torch.randn),
        ("maximum", torch.maximum, torch.randn, torch.randn),
        ("minimum", torch.minimum, torch.randn, torch.randn),
    ]
    broadcast_shapes = {
        "add": ([4, 5], [5]),
        "sub": ([3, 1, 6], [4, 1]),
        "mul": ([2, 3, 4], [3, 1]),
        "div": ([4, 5], [4, 1]),
        "pow": ([4, 5], [1, 5]),
        "maximum": ([4, 5], [1, 5]),
        "minimum": ([3, 4], [4]),
    }
    for op, fn, make_a, make_b in binary:
        seed(op)
        functional(w, op, op, {}, [make_a(4, 5), make_b(4, 5)], fn)
        sa, sb = broadcast_shapes[op]
        seed(op + "_broadcast")
        functional(w, op + "_broadcast", op, {}, [make_a(*sa), make_b(*sb)], fn)
    seed("pow_scalar")
    functional(
        w, "pow_scalar", "pow_scalar", {"exponent": 2.5}, [positive(4, 5)], lambda x: x**2.5
    )
    seed("where")
    functional(
        w,
        "where",
        "where",
        {"condition": "input.0 (bool, stored as U8)"},
        [torch.rand(4, 5) > 0.5, torch.randn(4, 5), torch.randn(1, 5)],
        torch.where,
    )

    # Reductions over dimensions.
    for op, fn in [("sum", torch.sum), ("mean", torch.mean)]:
        for dims, keepdim in [([1], False), ([0, 2], True), ([0, 1, 2], False)]:
            name = f"{op}_dims{''.join(map(str, dims))}{'_keepdim' if keepdim else ''}"
            seed(name)
            functional(
                w,
                name,
                op,
                {"dim": dims, "keepdim": keepdim},
                [torch.randn(3, 4, 5)],
                lambda x, fn=fn, dims=dims, keepdim=keepdim: fn(x, dim=dims, keepdim=keepdim),
            )
    for dims, keepdim in [([1], False), ([0, 2], True)]:
        name = f"var_dims{''.join(map(str, dims))}{'_keepdim' if keepdim else ''}"
        seed(name)
        functional(
            w,
            name,
            "var",
            {"dim": dims, "keepdim": keepdim, "correction": 1},
            [torch.randn(3, 4, 5)],
            lambda x, dims=dims, keepdim=keepdim: torch.var(
                x, dim=dims, keepdim=keepdim, correction=1
            ),
        )
    for dim, keepdim in [(1, False), (0, True)]:
        name = f"max_dim{dim}{'_keepdim' if keepdim else ''}"
        seed(name)
        functional(
            w,
            name,
            "max",
            {"dim": dim, "keepdim": keepdim, "outputs": "values, indices (int64)"},
            [torch.randn(4, 5)],
            lambda x, dim=dim, keepdim=keepdim: tuple(torch.max(x, dim=dim, keepdim=keepdim)),
        )
    seed("argmax")
    functional(
        w, "argmax", "argmax", {"dim": 1, "keepdim": False}, [torch.randn(4, 5)],
        lambda x: torch.argmax(x, dim=1),
    )

    # Row ops.
    seed("softmax")
    functional(w, "softmax", "softmax", {"dim": -1}, [torch.randn(4, 5) * 2], lambda x: F.softmax(x, dim=-1))
    seed("softmax_33")
    functional(
        w, "softmax_33", "softmax", {"dim": -1}, [torch.randn(3, 33) * 3], lambda x: F.softmax(x, dim=-1)
    )
    seed("softmax_dim0")
    functional(
        w, "softmax_dim0", "softmax", {"dim": 0}, [torch.randn(4, 5) * 2], lambda x: F.softmax(x, dim=0)
    )
    seed("log_softmax")
    functional(
        w, "log_softmax", "log_softmax", {"dim": -1}, [torch.randn(4, 5) * 2],
        lambda x: F.log_softmax(x, dim=-1),
    )
    seed("log_softmax_33")
    functional(
        w, "log_softmax_33", "log_softmax", {"dim": -1}, [torch.randn(2, 33) * 3],
        lambda x: F.log_softmax(x, dim=-1),
    )
    seed("layer_norm")
    functional(
        w,
        "layer_norm",
        "layer_norm",
        {"normalized_shape": [6], "eps": 1e-5},
        [torch.randn(4, 5, 6) * 2 + 1, torch.randn(6) + 1, torch.randn(6)],
        lambda x, wt, b: F.layer_norm(x, [6], wt, b, eps=1e-5),
    )
    seed("embedding")
    functional(
        w,
        "embedding",
        "embedding",
        {"inputs": "indices (int64), weight"},
        [torch.tensor([[1, 3, 3, 0], [9, 2, 3, 7], [0, 0, 5, 8]]), torch.randn(10, 6)],
        F.embedding,
    )
    for dim in [0, 1]:
        name = f"cat_dim{dim}"
        seed(name)
        a, b = (torch.randn(2, 3), torch.randn(4, 3)) if dim == 0 else (torch.randn(3, 2), torch.randn(3, 4))
        functional(w, name, "cat", {"dim": dim}, [a, b], lambda a, b, dim=dim: torch.cat([a, b], dim=dim))
        name = f"stack_dim{dim}"
        seed(name)
        functional(
            w, name, "stack", {"dim": dim}, [torch.randn(3, 4), torch.randn(3, 4)],
            lambda a, b, dim=dim: torch.stack([a, b], dim=dim),
        )
    seed("cross_entropy")
    functional(
        w,
        "cross_entropy",
        "cross_entropy",
        {"ignore_index": -100, "reduction": "mean", "inputs": "logits, targets (int64)"},
        [torch.randn(5, 7) * 2, torch.tensor([3, -100, 0, 6, 2])],
        lambda x, t: F.cross_entropy(x, t, ignore_index=-100),
    )
    seed("cross_entropy_ignore1")
    functional(
        w,
        "cross_entropy_ignore1",
        "cross_entropy",
        {"ignore_index": 1, "reduction": "mean", "inputs": "logits, targets (int64)"},
        [torch.randn(6, 33) * 2, torch.tensor([1, 4, 32, 1, 0, 17])],
        lambda x, t: F.cross_entropy(x, t, ignore_index=1),
    )
    seed("linear_cross_entropy")
    functional(
        w,
        "linear_cross_entropy",
        "linear_cross_entropy",
        {"ignore_index": -100, "chunk_rows": 3, "reduction": "mean",
         "inputs": "x, weight, bias, targets (int64); the labs' fused op, PyTorch's "
                   "cross_entropy(linear(x, weight, bias), targets)"},
        [torch.randn(7, 6), torch.randn(9, 6), torch.randn(9),
         torch.tensor([3, -100, 0, 8, 2, 5, -100])],
        lambda x, wt, b, t: F.cross_entropy(F.linear(x, wt, b), t, ignore_index=-100),
    )
    seed("mse_loss")
    functional(
        w, "mse_loss", "mse_loss", {"reduction": "mean"}, [torch.randn(4, 5), torch.randn(4, 5)],
        F.mse_loss,
    )

    # Matrix products and views.
    seed("matmul_2d")
    functional(w, "matmul_2d", "matmul", {}, [torch.randn(4, 5), torch.randn(5, 3)], torch.matmul)
    seed("matmul_batched")
    functional(
        w, "matmul_batched", "matmul", {}, [torch.randn(2, 4, 5), torch.randn(2, 5, 3)], torch.matmul
    )
    seed("matmul_shared_weight")
    functional(
        w, "matmul_shared_weight", "matmul", {}, [torch.randn(2, 4, 5), torch.randn(5, 3)], torch.matmul
    )
    seed("transpose")
    functional(
        w, "transpose", "transpose", {"dim0": 0, "dim1": 1}, [torch.randn(4, 5)],
        lambda x: x.transpose(0, 1),
    )
    seed("permute")
    functional(
        w, "permute", "permute", {"dims": [2, 0, 1]}, [torch.randn(3, 4, 5)],
        lambda x: x.permute(2, 0, 1),
    )
    seed("reshape")
    functional(
        w, "reshape", "reshape", {"shape": [12, 5]}, [torch.randn(3, 4, 5)],
        lambda x: x.reshape(12, 5),
    )

    # Half precision: a few ops computed by PyTorch's CPU kernels in float16/bfloat16.
    for dtype, tag in [(torch.float16, "f16"), (torch.bfloat16, "bf16")]:
        for op, fn, shapes in [
            ("add", torch.add, ([4, 5], [4, 5])),
            ("mul", torch.mul, ([4, 5], [4, 5])),
            ("matmul", torch.matmul, ([4, 5], [5, 3])),
        ]:
            name = f"{op}_{tag}"
            seed(name)
            functional(
                w, name, op, {}, [torch.randn(*s).to(dtype) for s in shapes], fn, dtype=dtype
            )
        for op, fn in [("exp", torch.exp), ("relu", torch.relu)]:
            name = f"{op}_{tag}"
            seed(name)
            functional(w, name, op, {}, [torch.randn(4, 5).to(dtype)], fn, dtype=dtype)
        name = f"sum_dims1_{tag}"
        seed(name)
        functional(
            w, name, "sum", {"dim": [1], "keepdim": False}, [torch.randn(3, 4, 5).to(dtype)],
            lambda x: torch.sum(x, dim=[1]), dtype=dtype,
        )
        name = f"softmax_{tag}"
        seed(name)
        functional(
            w, name, "softmax", {"dim": -1}, [torch.randn(4, 5).to(dtype)],
            lambda x: F.softmax(x, dim=-1), dtype=dtype,
        )

    # Modules: one layer of each.
    seed("linear")
    module_case(w, "linear", "linear", {"in_features": 5, "out_features": 3, "bias": True},
                nn.Linear(5, 3), [torch.randn(4, 5)])
    seed("linear_3d")
    module_case(w, "linear_3d", "linear", {"in_features": 5, "out_features": 3, "bias": True},
                nn.Linear(5, 3), [torch.randn(2, 3, 5)])
    seed("linear_nobias")
    module_case(w, "linear_nobias", "linear", {"in_features": 5, "out_features": 3, "bias": False},
                nn.Linear(5, 3, bias=False), [torch.randn(4, 5)])
    seed("linear_bf16")
    module_case(w, "linear_bf16", "linear", {"in_features": 5, "out_features": 3, "bias": True},
                nn.Linear(5, 3), [torch.randn(4, 5)], dtype=torch.bfloat16)
    seed("mlp")
    module_case(
        w, "mlp", "mlp",
        {"layers": "Sequential(Linear(4, 8), ReLU(), Linear(8, 3))", "sizes": [4, 8, 3]},
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), [torch.randn(5, 4)],
    )
    seed("embedding_module")
    module_case(w, "embedding_module", "embedding_module",
                {"num_embeddings": 10, "embedding_dim": 6},
                nn.Embedding(10, 6), [torch.tensor([[1, 3, 3, 0, 9], [2, 2, 7, 5, 4]])])
    seed("layer_norm_module")
    module_case(w, "layer_norm_module", "layer_norm_module", {"normalized_shape": [6], "eps": 1e-5},
                randomise(nn.LayerNorm(6)), [torch.randn(2, 3, 6)])
    seed("multihead_attention")
    module_case(
        w, "multihead_attention", "multihead_attention",
        {"embed_dim": 8, "num_heads": 2, "dropout": 0.0, "batch_first": True,
         "call": "m(x, x, x, need_weights=False)[0]"},
        randomise(nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 4, 8)],
        call=lambda m, x: m(x, x, x, need_weights=False)[0],
    )
    seed("multihead_attention_cross")
    module_case(
        w, "multihead_attention_cross", "multihead_attention",
        {"embed_dim": 8, "num_heads": 2, "dropout": 0.0, "batch_first": True,
         "call": "m(q, kv, kv, need_weights=False)[0]"},
        randomise(nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 4, 8), torch.randn(2, 5, 8)],
        call=lambda m, q, kv: m(q, kv, kv, need_weights=False)[0],
    )
    seed("transformer_encoder_layer")
    module_case(
        w, "transformer_encoder_layer", "transformer_encoder_layer",
        {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "dropout": 0.0, "activation": "relu",
         "batch_first": True, "norm_first": False, "layer_norm_eps": 1e-5},
        randomise(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 4, 8)],
    )
    seed("transformer_decoder_layer")
    module_case(
        w, "transformer_decoder_layer", "transformer_decoder_layer",
        {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "dropout": 0.0, "activation": "relu",
         "batch_first": True, "norm_first": False, "layer_norm_eps": 1e-5,
         "tgt_mask": "causal (-inf above the diagonal)", "inputs": "tgt, memory"},
        randomise(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 4, 8), torch.randn(2, 5, 8)],
        call=lambda m, tgt, mem: m(
            tgt, mem, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4)
        ),
    )

    # Attention with masks: a bool key_padding_mask (True = padding) and a bool attn_mask
    # (True = not allowed), merged as PyTorch merges them; no row is fully hidden.
    seed("multihead_attention_masked")
    module_case(
        w, "multihead_attention_masked", "multihead_attention_masked",
        {"embed_dim": 8, "num_heads": 2, "dropout": 0.0, "batch_first": True,
         "call": "m(x, x, x, key_padding_mask=pad, attn_mask=hide, need_weights=False)[0]",
         "inputs": "x, key_padding_mask [2, 4] bool, attn_mask [4, 4] bool (causal)"},
        randomise(nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 4, 8), torch.tensor([[False, False, False, True], [False, True, False, False]]),
         torch.ones(4, 4, dtype=torch.bool).triu(1)],
        call=lambda m, x, pad, hide: m(x, x, x, key_padding_mask=pad, attn_mask=hide,
                                       need_weights=False)[0],
    )
    seed("multihead_attention_weights")
    module_case(
        w, "multihead_attention_weights", "multihead_attention_weights",
        {"embed_dim": 8, "num_heads": 2, "dropout": 0.0, "batch_first": True,
         "call": "m(q, kv, kv, need_weights=True)[1] (averaged over heads)"},
        randomise(nn.MultiheadAttention(8, 2, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 4, 8), torch.randn(2, 5, 8)],
        call=lambda m, q, kv: m(q, kv, kv, need_weights=True)[1],
    )
    seed("transformer_encoder_layer_prenorm_gelu")
    module_case(
        w, "transformer_encoder_layer_prenorm_gelu", "transformer_encoder_layer",
        {"d_model": 8, "nhead": 2, "dim_feedforward": 16, "dropout": 0.0, "activation": "gelu",
         "batch_first": True, "norm_first": True, "layer_norm_eps": 1e-5,
         "inputs": "src, src_key_padding_mask [2, 4] bool"},
        randomise(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                             batch_first=True, norm_first=True), 0.2),
        [torch.randn(2, 4, 8), torch.tensor([[False, False, True, False], [False, False, False, True]])],
        call=lambda m, src, pad: m(src, src_key_padding_mask=pad),
    )
    seed("transformer")
    module_case(
        w, "transformer", "transformer",
        {"d_model": 8, "nhead": 2, "num_encoder_layers": 2, "num_decoder_layers": 2,
         "dim_feedforward": 16, "dropout": 0.0, "activation": "relu", "batch_first": True,
         "norm_first": False, "layer_norm_eps": 1e-5,
         "tgt_mask": "causal (-inf above the diagonal)", "inputs": "src, tgt"},
        randomise(nn.Transformer(8, 2, 2, 2, 16, dropout=0.0, batch_first=True), 0.2),
        [torch.randn(2, 5, 8), torch.randn(2, 4, 8)],
        call=lambda m, src, tgt: m(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4)),
    )
    seed("gpt2_tiny")
    module_case(
        w, "gpt2_tiny", "gpt2",
        {"vocab": 11, "n_positions": 8, "d_model": 8, "n_layer": 2, "n_head": 2, "dropout": 0.0,
         "model": "nanoGPT's GPT (biases, GELU tanh, lm_head tied to wte)", "inputs": "idx"},
        randomise(TinyGpt2(11, 8, 8, 2, 2), 0.2),
        [torch.tensor([[1, 5, 2, 9, 0], [4, 4, 3, 10, 7]])],
    )

    # Optimizers: two parameters ([4, 5] and [5]), three steps each.
    optim_case(
        w, "sgd_momentum", "sgd",
        {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.01, "nesterov": False},
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    )
    optim_case(
        w, "sgd_nesterov", "sgd",
        {"lr": 0.05, "momentum": 0.8, "dampening": 0.0, "weight_decay": 0.0, "nesterov": True},
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
    )
    optim_case(
        w, "adam", "adam",
        {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    )
    optim_case(
        w, "adamw", "adamw",
        {"lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
    )


def main():
    global torch, F, nn
    if sys.byteorder != "little":
        raise SystemExit("this script writes little-endian data from memory: run it on x86 or ARM")
    self_test_format()
    import torch as torch_module
    import torch.nn as nn_module
    import torch.nn.functional as functional_module

    torch, nn, F = torch_module, nn_module, functional_module
    if not torch.__version__.startswith("2.11"):
        print(f"warning: written for PyTorch 2.11, running {torch.__version__}", file=sys.stderr)
    torch.set_num_threads(1)
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "data", "parity"
    )
    os.makedirs(out_dir, exist_ok=True)
    # A stale manifest must not outlive a failed run.
    manifest = os.path.join(out_dir, "manifest.json")
    if os.path.exists(manifest):
        os.remove(manifest)
    for old in os.listdir(out_dir):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(out_dir, old))
    w = Writer(out_dir)
    build(w)
    total = w.finish()
    print(f"{len(w.cases)} cases, {total} bytes, in {os.path.normpath(out_dir)} (PyTorch {torch.__version__})")


if __name__ == "__main__":
    main()
