# What autograd keeps for one GPT-2 small block (pre-norm, fused attention, no dropout)
# at 8 sequences of 1024 tokens: every tensor saved for backward, counted once per
# storage (q, k and v are views of one product), beside the formula of chapter 10 and
# Korthikanti et al.'s s*b*h*(34 + 5*a*s/h) for 16-bit tensors with dropout.
import torch
from torch import nn
import torch.nn.functional as F

MiB = 2**20
s, b, h, a = 1024, 8, 768, 12


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.c_attn, self.c_proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.c_fc, self.mlp_proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def saved_by_block(autocast):
    """The storages one block's forward saves for backward, by (shape, dtype); tensors
    without a batch dimension of b or b*s rows (weights, their autocast copies, RNG
    state) left out. A linear layer saves its input as a view of b*s rows."""
    block = Block().cuda()
    x = torch.randn(b, s, h, device="cuda", requires_grad=True)
    storages = {}

    def pack(t):
        if t.dim() > 0 and t.shape[0] in (b, b * s):
            st = t.untyped_storage()
            storages.setdefault(st.data_ptr(), (tuple(t.shape), t.dtype, st.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            block(x)
    return list(storages.values())


def formula(autocast):
    e = 2 if autocast else 4
    # ln_1's input and statistics; c_attn's input, q k v, attention's output; the
    # log-sum-exp; ln_2's input and statistics; c_fc's input, GELU's input and output.
    return 4 * s * b * h + 2 * 4 * s * b + 5 * e * s * b * h + 4 * a * s * b \
        + 4 * s * b * h + 2 * 4 * s * b + 9 * e * s * b * h


print(f"one GPT-2 small block, s={s} b={b} h={h} a={a}, on {torch.cuda.get_device_name()}")
print()
print("| block | saved storages | PyTorch keeps | formula | Korthikanti (16-bit, dropout) |")
print("| --- | ---: | ---: | ---: | ---: |")
for name, autocast in (("float32", False), ("autocast bf16", True)):
    saved = saved_by_block(autocast)
    kept = sum(n for _, _, n in saved)
    print(f"| {name} | {len(saved)} | {kept / MiB:.2f} MiB | {formula(autocast) / MiB:.2f} MiB "
          f"| {s * b * h * (34 + 5 * a * s / h) / MiB:.2f} MiB |")
print()
print("saved under autocast, largest first:")
for shape, dtype, n in sorted(saved_by_block(True), key=lambda r: -r[2]):
    print(f"  {str(list(shape)):22} {str(dtype).replace('torch.', ''):9} {n / MiB:8.2f} MiB")
