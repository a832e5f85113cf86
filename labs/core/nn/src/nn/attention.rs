//! The attention core every attention module calls: [`scaled_dot_product_attention`]
//! over `[batch, heads, seq, head_dim]`, PyTorch's
//! `torch.nn.functional.scaled_dot_product_attention`, and the masks it takes.
//!
//! Two paths behind one signature, chosen per thread with [`sdpa_kernel`] (PyTorch's
//! `torch.nn.attention.sdpa_kernel`):
//!
//! - [`SdpaBackend::Math`] (the default): the scores `q kᵀ / sqrt(head_dim)` are
//!   materialised as a `[B, H, L, S]` tensor, softmaxed, dropped out and multiplied by
//!   `v`, each step one op with its own saved tensors (the scores' softmax and the
//!   dropout mask are what backward keeps: `O(L S)` memory per head);
//! - [`SdpaBackend::Fused`]: one flash-style kernel ([`Tensor::fused_attention`]) that
//!   keeps only each row's log-sum-exp, `O(L)`, and applies dropout inside the kernel
//!   (its mask drawn again in backward, never stored), as PyTorch's memory-efficient
//!   kernel does: a training `nn.Transformer` stores neither the probabilities nor the
//!   mask. It reads q, k and v where they lie (the head views of a projection) and
//!   writes its output as `[B, L, H, Dh]` memory, so the caller's
//!   `transpose(1, 2).reshape(B, L, E)` copies nothing. It takes no additive mask; a
//!   call it cannot serve falls back to the math path, as PyTorch's dispatcher does.

use std::cell::Cell;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{is_floating_point, DType, Scalar, Tensor};

/// An additive causal mask `[len, len]`: 0 on and below the diagonal, -inf above
/// (`nn.Transformer.generate_square_subsequent_mask`).
pub fn causal_mask(len: usize, device: &Device) -> Result<Tensor> {
    causal_mask_rect(len, len, device)
}

/// An additive causal mask `[l, s]` aligned to the top left, as `is_causal=True` builds
/// it (`torch.ones(L, S).tril()`): query `i` sees keys `0..=i`.
pub fn causal_mask_rect(l: usize, s: usize, device: &Device) -> Result<Tensor> {
    if device.is_capturing()? {
        return causal_mask_on_device(l, s, device);
    }
    let mut m = vec![0.0f32; l * s];
    for i in 0..l {
        for j in i + 1..s {
            m[i * s + j] = f32::NEG_INFINITY;
        }
    }
    Tensor::from_slice(&m, &[l, s], device)
}

/// [`causal_mask_rect`] computed by kernels, for a graph's capture (which cannot record
/// a copy of host values): key positions above query positions, as `-inf`.
fn causal_mask_on_device(l: usize, s: usize, device: &Device) -> Result<Tensor> {
    let queries = Tensor::arange(0, l, device)?.reshape(&[l, 1])?;
    let keys = Tensor::arange(0, s, device)?.reshape(&[1, s])?;
    let above = keys.gt(&queries)?;
    let minus_inf = Tensor::full(&[l, s], f32::NEG_INFINITY, device)?;
    let zero = Tensor::zeros(&[l, s], DType::F32, device)?;
    Tensor::where_(&above, &minus_inf, &zero)
}

/// A uint8 mask as an additive float mask of `dtype`: `-inf` where the mask holds
/// `hidden` (1 for `nn.MultiheadAttention`'s masks, where true means "do not attend";
/// 0 for `scaled_dot_product_attention`'s, where true means "attend"), 0 elsewhere.
/// A float mask is returned as it is (cast to `dtype`).
pub fn additive_mask(mask: &Tensor, hidden: u8, dtype: DType) -> Result<Tensor> {
    match mask.dtype() {
        DType::U8 => {
            let device = mask.device();
            let inf = Tensor::scalar_tensor(Scalar::Float(f64::NEG_INFINITY), dtype, device)?;
            let zero = Tensor::scalar_tensor(Scalar::Float(0.0), dtype, device)?;
            if hidden == 1 {
                Tensor::where_(mask, &inf, &zero)
            } else {
                Tensor::where_(mask, &zero, &inf)
            }
        }
        d if is_floating_point(d) => mask.to_dtype(dtype),
        other => Err(Error::DType {
            op: "attention mask",
            found: other,
            supported: "uint8 (the labs' bool) or a float dtype (additive)",
        }),
    }
}

/// Which kernel [`scaled_dot_product_attention`] runs (PyTorch's `SDPBackend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaBackend {
    /// The composition of matmul, softmax and dropout (PyTorch's `MATH`).
    Math,
    /// The fused kernel that never stores the scores (PyTorch's `FLASH_ATTENTION` and
    /// `EFFICIENT_ATTENTION`), where the call allows it; math otherwise.
    Fused,
}

thread_local! {
    static BACKEND: Cell<SdpaBackend> = const { Cell::new(SdpaBackend::Math) };
}

/// The backend in force until the guard drops; dropping it restores the previous one.
#[must_use = "the backend applies only while the guard is alive"]
pub struct SdpaGuard {
    previous: SdpaBackend,
}

impl Drop for SdpaGuard {
    fn drop(&mut self) {
        BACKEND.with(|b| b.set(self.previous));
    }
}

/// Runs this thread's attention calls on `backend` until the guard drops
/// (`with torch.nn.attention.sdpa_kernel(backend):`).
pub fn sdpa_kernel(backend: SdpaBackend) -> SdpaGuard {
    SdpaGuard {
        previous: BACKEND.with(|b| b.replace(backend)),
    }
}

/// The backend this thread's attention calls use now.
pub fn sdpa_backend() -> SdpaBackend {
    BACKEND.with(Cell::get)
}

/// How many calls of [`scaled_dot_product_attention`] this thread ran on each path since
/// the last [`reset_sdpa_calls`] (a checkpoint's recomputation counts again): which
/// calls a backend switch actually served fused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SdpaCalls {
    pub fused: u64,
    pub math: u64,
}

thread_local! {
    static CALLS: Cell<SdpaCalls> = const { Cell::new(SdpaCalls { fused: 0, math: 0 }) };
}

/// This thread's attention calls by path.
pub fn sdpa_calls() -> SdpaCalls {
    CALLS.with(Cell::get)
}

/// Starts this thread's counts of attention calls again from zero.
pub fn reset_sdpa_calls() {
    CALLS.with(|c| c.set(SdpaCalls::default()));
}

fn count_call(fused: bool) {
    CALLS.with(|c| {
        let mut n = c.get();
        if fused {
            n.fused += 1;
        } else {
            n.math += 1;
        }
        c.set(n);
    });
}

/// Whether the fused kernel can serve this call: no additive mask, values as wide as
/// the keys, a head size it supports (dropout it applies itself).
fn fused_serves(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> bool {
    mask.is_none()
        && q.shape().len() == 4
        && k.shape() == v.shape()
        && q.shape()[3] <= crate::tensor::ATTENTION_MAX_HEAD_DIM
}

/// `softmax(q kᵀ / sqrt(head_dim) + mask) v`, with dropout on the attention weights
/// when `training` (PyTorch's `F.scaled_dot_product_attention(q, k, v, attn_mask,
/// dropout_p, is_causal)`, `training` standing for its caller's `self.training`).
///
/// `q` is `[B, H, L, Dh]`, `k` and `v` are `[B, H, S, Dh]` (same dtype and device); the
/// output is `[B, H, L, Dh]`. `mask` broadcasts to `[B, H, L, S]`: a float mask is
/// added to the scores (`-inf` hides a key), a uint8 mask keeps the keys where it is 1
/// (PyTorch's bool `attn_mask` here). `causal` hides key `j > i` from query `i`
/// (top-left aligned); it may be combined with a mask. A query that sees no key gets
/// NaN, as in PyTorch's math path.
///
/// The math path or the fused kernel, as [`sdpa_kernel`] chose; see the module doc.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    dropout_p: f32,
    training: bool,
) -> Result<Tensor> {
    if sdpa_backend() == SdpaBackend::Fused && fused_serves(q, k, v, mask) {
        check_qkv(q, k, v)?;
        count_call(true);
        let p = if training { dropout_p } else { 0.0 };
        return Tensor::fused_attention(q, k, v, causal, None, p);
    }
    count_call(false);
    Ok(attention_with_weights(q, k, v, mask, causal, dropout_p, training)?.0)
}

/// [`scaled_dot_product_attention`] that also returns the attention weights
/// `[B, H, L, S]` (after dropout, as `nn.MultiheadAttention` returns them with
/// `need_weights=True`).
pub fn attention_with_weights(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    dropout_p: f32,
    training: bool,
) -> Result<(Tensor, Tensor)> {
    check_qkv(q, k, v)?;
    let (l, dh) = (q.shape()[2], q.shape()[3]);
    let s = k.shape()[2];
    // The scale goes on q (`[B, H, L, Dh]`) rather than on the scores (`[B, H, L, S]`),
    // as PyTorch's math path does: a smaller pass, and q comes out dense for the GEMM.
    let mut scores = q
        .scale(1.0 / (dh as f32).sqrt())?
        .matmul(&k.transpose(2, 3)?)?;
    if causal {
        let m = causal_mask_rect(l, s, q.device())?.to_dtype(q.dtype())?;
        scores = scores.add(&m)?;
    }
    if let Some(mask) = mask {
        let m = additive_mask(mask, 0, q.dtype())?;
        broadcast_check(&m, scores.shape())?;
        scores = scores.add(&m)?;
    }
    let weights = scores.softmax(3)?.dropout(dropout_p, training)?;
    let out = weights.matmul(v)?;
    Ok((out, weights))
}

fn check_qkv(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    for (what, t) in [("query", q), ("key", k), ("value", v)] {
        if t.shape().len() != 4 {
            return Err(Error::InvalidArgument(format!(
                "scaled_dot_product_attention: {what} must be [batch, heads, seq, head_dim], \
                 got {:?}",
                t.shape()
            )));
        }
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs[..2] != ks[..2] || ks[..3] != vs[..3] || qs[3] != ks[3] {
        return Err(Error::InvalidArgument(format!(
            "scaled_dot_product_attention: query {qs:?}, key {ks:?} and value {vs:?} must be \
             [B, H, L, Dh], [B, H, S, Dh] and [B, H, S, Dv]"
        )));
    }
    Ok(())
}

/// A mask must broadcast to the scores' shape (not widen them).
fn broadcast_check(mask: &Tensor, scores: &[usize]) -> Result<()> {
    let m = mask.shape();
    let fits = m.len() <= scores.len()
        && m.iter()
            .rev()
            .zip(scores.iter().rev())
            .all(|(&a, &b)| a == b || a == 1);
    if fits {
        Ok(())
    } else {
        Err(Error::Shape {
            op: "scaled_dot_product_attention (the mask must broadcast to [B, H, L, S])",
            a: m.to_vec(),
            b: scores.to_vec(),
        })
    }
}
