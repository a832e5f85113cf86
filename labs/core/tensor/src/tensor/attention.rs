//! Fused attention (flash-attention style): `softmax(q kᵀ · scale) v` over
//! `[B, H, T, Dh]` in one kernel that never writes the `T × T` scores. Forward writes
//! the output and each query row's log-sum-exp (float32); backward recomputes the
//! probabilities tile by tile from q, k, v, the output, the log-sum-exp and the output's
//! gradient (`kernels/attention.cu`, twins in `kernels/attention_cpu.rs`).
//!
//! A drop-in for the naive composition (`nn::attention`'s `scaled_dot_product_attention`)
//! when there is no additive mask: the causal mask is built in (keys `j > i` hidden,
//! PyTorch's `is_causal=True`, aligned top-left), and dropout on the weights happens in
//! the kernel, its mask drawn from the device generator (Philox, keyed by each weight's
//! position) and drawn again by the backward, never stored (PyTorch's memory-efficient
//! kernel does the same).
//!
//! The inputs are read where they lie: any strides over batch, head and sequence (the
//! `[B, H, T, Dh]` head views of a `[B, T, E]` projection are not copied, and are what
//! backward saves), a copy only when head_dim is not unit-stride. The output and the
//! gradients are written as `[B, T, H, Dh]` memory and returned as `[B, H, T, Dh]`
//! views, as PyTorch's efficient attention returns them, so that the caller's
//! `transpose(1, 2).reshape(B, T, E)` is free.
//!
//! Calls without dropout and with head_dim 16 to 64 run on tensor cores
//! (`kernels/attention_flash.cu`, FlashAttention-2's schedule; float32 by 3xTF32); the others run by default as matrix products over
//! chunks of query rows (`attention_chunked.rs`), with what is saved unchanged;
//! [`path_for`](super::path_for) says which path serves a call.

use super::attention_chunked as chunked;
use super::attention_path::{path_for, AttentionPath};
use super::graph::GradOp;
use super::{DType, Tensor};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernels::{
    attention_keep_row, flash_serves, AttentionDropout, AttentionKernel, AttentionShape,
    HeadsOperand, Kernel, ATTENTION_MAX_HEAD_DIM,
};

/// The checked sizes of an attention call.
struct Dims {
    batch: usize,
    heads: usize,
    tq: usize,
    tk: usize,
    d: usize,
}

impl Dims {
    fn shape(&self) -> AttentionShape {
        AttentionShape {
            bh: self.batch * self.heads,
            heads: self.heads,
            tq: self.tq,
            tk: self.tk,
            d: self.d,
        }
    }
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

/// `t` (`[B, H, T, D]`) as a kernel operand: its own strides over batch, head and
/// sequence; a dense copy only when head_dim is not unit-stride.
fn operand(t: &Tensor) -> Result<(Tensor, HeadsOperand)> {
    // The tensor itself where the kernel reads it in place, its graph kept: what the
    // op saves is then the caller's tensor, produced by the caller's op (which a
    // selective checkpoint's policy asks about), as PyTorch's attention saves its
    // inputs.
    let t = if t.shape()[3] > 1 && t.strides()[3] != 1 {
        t.detach().contiguous()?
    } else {
        t.clone()
    };
    let s = t.strides();
    let op = HeadsOperand {
        ptr: t.ptr(),
        batch: s[0],
        head: s[1],
        seq: s[2],
    };
    Ok((t, op))
}

/// A new `[B, H, T, D]` tensor whose memory is `[B, T, H, D]` (the heads of one position
/// side by side), with its operand.
fn heads_last(shape: &[usize], dtype: DType, device: &Device) -> Result<(Tensor, HeadsOperand)> {
    let (b, h, t, d) = (shape[0], shape[1], shape[2], shape[3]);
    let dense = Tensor::empty(&[b, t, h, d], dtype, device)?;
    operand(&dense.transpose(1, 2)?)
}

/// The dropout of a call with probability `p` over `counters = B·H·Tq·Tk` weights:
/// none when `p = 0`, else the generator's state, advanced past the counters.
fn dropout_for(p: f32, counters: usize, device: &Device) -> Result<AttentionDropout> {
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::InvalidArgument(format!(
            "fused_attention: dropout probability has to be between 0 and 1, but got {p}"
        )));
    }
    if p == 0.0 {
        return Ok(AttentionDropout::NONE);
    }
    let (seed, offset) = device.philox_seed_offset(counters as u64);
    Ok(AttentionDropout {
        keep: 1.0 - p,
        seed,
        offset,
    })
}

impl Tensor {
    /// `(softmax(q kᵀ · scale) ∘ Z / (1 − p)) v` for `q [B, H, Tq, D]`, `k`,
    /// `v [B, H, Tk, D]` (one float dtype, `D <= 128`), computed by one fused kernel,
    /// or on the GPU by matrix products over chunks of query rows, the same results to
    /// rounding ([`attention_path`](super::attention_path))
    /// (PyTorch's `scaled_dot_product_attention` with the efficient backend). `scale`
    /// defaults to `1 / sqrt(D)`; `causal` hides keys `j > i` from query `i`;
    /// `dropout_p` drops each weight with that probability (`Z`, drawn from the device
    /// generator, which advances by `B·H·Tq·Tk` counters; 0 draws nothing). No additive
    /// mask. The output is `[B, H, Tq, D]` over `[B, Tq, H, D]` memory. Saved for
    /// backward: q, k, v as given (views, not copies), the output and a float32
    /// `[B, H, Tq]` log-sum-exp: `O(T)` more memory than the inputs, never `O(T²)`.
    pub fn fused_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f32>,
        dropout_p: f32,
    ) -> Result<Tensor> {
        let dims = check(q, k, v)?;
        let shape = dims.shape();
        let scale = scale.unwrap_or(1.0 / (dims.d as f32).sqrt());
        let device = q.device();
        let dropout = dropout_for(dropout_p, shape.bh * shape.tq * shape.tk, device)?;
        let ((qv, qo), (kv, ko), (vv, vo)) = (operand(q)?, operand(k)?, operand(v)?);
        let (out, oo) = heads_last(q.shape(), q.dtype(), device)?;
        let lse = Tensor::empty(&[dims.batch, dims.heads, dims.tq], DType::F32, device)?;
        let flash = flash_serves(q.dtype(), dims.d, &dropout, &[&qo, &ko, &vo, &oo]);
        if path_for(flash)? == AttentionPath::Chunked {
            chunked::forward_views(
                chunked::Views {
                    q: (&qv, qo),
                    k: (&kv, ko),
                    v: (&vv, vo),
                },
                (&out, oo),
                lse.ptr(),
                shape,
                scale,
                causal,
                dropout,
            )?;
        } else {
            device.launch(&Kernel::Attention(AttentionKernel::Forward {
                dtype: q.dtype(),
                q: qo,
                k: ko,
                v: vo,
                out: oo,
                lse: lse.ptr(),
                shape,
                scale,
                causal,
                dropout,
            }))?;
        }
        let saved = vec![qv, kv, vv, out.clone(), lse];
        Ok(Tensor::recorded(
            out,
            GradOp::Attention {
                scale,
                causal,
                dropout,
            },
            &[q, k, v],
            saved,
        ))
    }

    /// The keep mask (`uint8 [B, H, Tq, Tk]`, 1 kept) that [`Tensor::fused_attention`]
    /// draws with probability `dropout_p` when the device generator is at `state`
    /// (read it with `Device::rng_state` before the call): the mask the kernels use,
    /// bit for bit, materialised to check them against the naive composition.
    #[doc(hidden)]
    pub fn fused_attention_dropout_mask(
        shape: [usize; 4],
        dropout_p: f32,
        state: (u64, u64),
        device: &Device,
    ) -> Result<Tensor> {
        let [b, h, tq, tk] = shape;
        let dropout = AttentionDropout {
            keep: 1.0 - dropout_p,
            seed: state.0,
            offset: state.1,
        };
        let mut mask = Vec::with_capacity(b * h * tq * tk);
        for row in 0..b * h * tq {
            mask.extend(
                attention_keep_row(&dropout, row, tk)
                    .into_iter()
                    .map(u8::from),
            );
        }
        Tensor::from_slice(&mask, &[b, h, tq, tk], device)
    }

    /// The gradients `(dq, dk, dv)` of [`Tensor::fused_attention`] from what it saved
    /// and the output's gradient `dout` (any strides; the gradients come out as
    /// `[B, H, T, D]` views of `[B, T, H, D]` memory, like the output).
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
        dropout: &AttentionDropout,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let dims = check(q, k, v)?;
        dout.check_binary_dtype(out, "fused_attention_backward")?;
        if dout.shape() != out.shape() || out.shape() != q.shape() {
            return Err(Error::Shape {
                op: "fused_attention_backward",
                a: dout.shape().to_vec(),
                b: q.shape().to_vec(),
            });
        }
        let shape = dims.shape();
        // A hook may hand back saved tensors in another layout: any strides serve. The
        // named bindings keep a copy `operand` had to make alive through the launches.
        let ((q_kept, qo), (k_kept, ko), (v_kept, vo)) = (operand(q)?, operand(k)?, operand(v)?);
        let ((_out, oo), (dout_kept, go)) = (operand(out)?, operand(dout)?);
        let lse = lse.contiguous()?;
        let device = q.device();
        let dtype = q.dtype();
        let delta = Tensor::empty(&[shape.bh * shape.tq], DType::F32, device)?;
        device.launch(&Kernel::Attention(AttentionKernel::Delta {
            dtype,
            out: oo,
            dout: go,
            delta: delta.ptr(),
            shape,
        }))?;
        let (dq, dqo) = heads_last(q.shape(), dtype, device)?;
        let (dk, dko) = heads_last(k.shape(), dtype, device)?;
        let (dv, dvo) = heads_last(v.shape(), dtype, device)?;
        let flash = flash_serves(
            dtype,
            dims.d,
            dropout,
            &[&qo, &ko, &vo, &go, &dqo, &dko, &dvo],
        );
        if path_for(flash)? == AttentionPath::Chunked {
            chunked::backward_views(
                chunked::Views {
                    q: (&q_kept, qo),
                    k: (&k_kept, ko),
                    v: (&v_kept, vo),
                },
                (&dout_kept, go),
                [lse.ptr(), delta.ptr()],
                (&dq, dqo),
                [&dko, &dvo],
                shape,
                scale,
                causal,
                *dropout,
            )?;
            return Ok((dq, dk, dv));
        }
        device.launch(&Kernel::Attention(AttentionKernel::BackwardDq {
            dtype,
            q: qo,
            k: ko,
            v: vo,
            dout: go,
            lse: lse.ptr(),
            delta: delta.ptr(),
            dq: dqo,
            shape,
            scale,
            causal,
            dropout: *dropout,
        }))?;
        device.launch(&Kernel::Attention(AttentionKernel::BackwardDkDv {
            dtype,
            q: qo,
            k: ko,
            v: vo,
            dout: go,
            lse: lse.ptr(),
            delta: delta.ptr(),
            dk: dko,
            dv: dvo,
            shape,
            scale,
            causal,
            dropout: *dropout,
        }))?;
        Ok((dq, dk, dv))
    }
}
