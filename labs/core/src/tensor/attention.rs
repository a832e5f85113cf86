//! Fused attention (flash-attention style): `softmax(q kᵀ · scale) v` over
//! `[B, H, T, Dh]` in one kernel that never writes the `T × T` scores. Forward writes
//! the output and each query row's log-sum-exp (float32); backward recomputes the
//! probabilities tile by tile from q, k, v, the output, the log-sum-exp and the output's
//! gradient (`kernels/attention.cu`, twins in `kernels/attention_cpu.rs`).
//!
//! A drop-in for the naive composition (`nn::attention`'s `scaled_dot_product_attention`)
//! when there is no additive mask and no dropout on the weights: the causal mask is
//! built in (keys `j > i` hidden, PyTorch's `is_causal=True`, aligned top-left), dropout
//! is not implemented (callers with `dropout_p > 0` in training keep the naive path).

use super::graph::GradOp;
use super::{DType, Tensor};
use crate::error::{Error, Result};
use crate::kernels::{AttentionKernel, Kernel, ATTENTION_MAX_HEAD_DIM};

/// The checked sizes of an attention call.
struct Dims {
    batch: usize,
    heads: usize,
    tq: usize,
    tk: usize,
    d: usize,
}

fn check(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Dims> {
    const OP: &str = "fused_attention";
    for (name, t) in [("query", q), ("key", k), ("value", v)] {
        if t.shape().len() != 4 {
            return Err(Error::InvalidArgument(format!(
                "{OP}: {name} must be [batch, heads, seq, head_dim], got {:?}",
                t.shape()
            )));
        }
        t.check_float(OP)?;
        q.check_same_device(t)?;
        if t.dtype() != q.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                a: q.dtype(),
                b: t.dtype(),
            });
        }
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if ks != vs || qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
        return Err(Error::InvalidArgument(format!(
            "{OP}: key and value must be [batch, heads, seq_k, head_dim] matching the \
             query's batch, heads and head_dim: query {qs:?}, key {ks:?}, value {vs:?}"
        )));
    }
    let d = qs[3];
    if d == 0 || d > ATTENTION_MAX_HEAD_DIM {
        return Err(Error::InvalidArgument(format!(
            "{OP}: head_dim must be 1 to {ATTENTION_MAX_HEAD_DIM}, got {d}"
        )));
    }
    if ks[2] == 0 {
        return Err(Error::InvalidArgument(format!(
            "{OP}: no keys (seq_k = 0): the softmax of an empty row is undefined"
        )));
    }
    Ok(Dims {
        batch: qs[0],
        heads: qs[1],
        tq: qs[2],
        tk: ks[2],
        d,
    })
}

impl Tensor {
    /// `softmax(q kᵀ · scale) v` for `q [B, H, Tq, D]`, `k`, `v [B, H, Tk, D]` (one float
    /// dtype, `D <= 128`), computed by one fused kernel (PyTorch's
    /// `scaled_dot_product_attention` with the flash backend). `scale` defaults to
    /// `1 / sqrt(D)`; `causal` hides keys `j > i` from query `i`. No additive mask, no
    /// dropout. Saved for backward: q, k, v, the output and a float32 `[B, H, Tq]`
    /// log-sum-exp: `O(T)` more memory than the inputs, never `O(T²)`.
    pub fn fused_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        let dims = check(q, k, v)?;
        let scale = scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
        let (qc, kc, vc) = (
            q.detach().contiguous()?,
            k.detach().contiguous()?,
            v.detach().contiguous()?,
        );
        let device = q.device();
        let out = Tensor::empty(q.shape(), q.dtype(), device)?;
        let lse = Tensor::empty(&[dims.batch, dims.heads, dims.tq], DType::F32, device)?;
        device.launch(&Kernel::Attention(AttentionKernel::Forward {
            dtype: q.dtype(),
            q: qc.ptr(),
            k: kc.ptr(),
            v: vc.ptr(),
            out: out.ptr(),
            lse: lse.ptr(),
            bh: dims.batch * dims.heads,
            tq: dims.tq,
            tk: dims.tk,
            d: dims.d,
            scale,
            causal,
        }))?;
        let saved = vec![qc, kc, vc, out.clone(), lse];
        Ok(Tensor::recorded(
            out,
            GradOp::Attention { scale, causal },
            &[q, k, v],
            saved,
        ))
    }

    /// The gradients `(dq, dk, dv)` of [`Tensor::fused_attention`] from what it saved
    /// and the output's gradient `dout`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fused_attention_backward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        dout: &Tensor,
        scale: f32,
        causal: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let dims = check(q, k, v)?;
        dout.check_binary_dtype(out, "fused_attention_backward")?;
        // Saved dense; a hook may hand back another layout (no copy when dense).
        let (q, k, v, out) = (
            q.contiguous()?,
            k.contiguous()?,
            v.contiguous()?,
            out.contiguous()?,
        );
        let dout = dout.contiguous()?;
        let device = q.device();
        let bh = dims.batch * dims.heads;
        let dtype = q.dtype();
        let delta = Tensor::empty(&[bh * dims.tq], DType::F32, device)?;
        device.launch(&Kernel::Attention(AttentionKernel::Delta {
            dtype,
            out: out.ptr(),
            dout: dout.ptr(),
            delta: delta.ptr(),
            rows: bh * dims.tq,
            d: dims.d,
        }))?;
        let dq = Tensor::empty(q.shape(), dtype, device)?;
        let dk = Tensor::empty(k.shape(), dtype, device)?;
        let dv = Tensor::empty(v.shape(), dtype, device)?;
        device.launch(&Kernel::Attention(AttentionKernel::BackwardDq {
            dtype,
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            dout: dout.ptr(),
            lse: lse.ptr(),
            delta: delta.ptr(),
            dq: dq.ptr(),
            bh,
            tq: dims.tq,
            tk: dims.tk,
            d: dims.d,
            scale,
            causal,
        }))?;
        device.launch(&Kernel::Attention(AttentionKernel::BackwardDkDv {
            dtype,
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            dout: dout.ptr(),
            lse: lse.ptr(),
            delta: delta.ptr(),
            dk: dk.ptr(),
            dv: dv.ptr(),
            bh,
            tq: dims.tq,
            tk: dims.tk,
            d: dims.d,
            scale,
            causal,
        }))?;
        Ok((dq, dk, dv))
    }
}
