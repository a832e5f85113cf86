//! The fused attention kernels (`kernels/attention.cu`, twins in `attention_cpu.rs`):
//! a forward that writes only the output and each query row's log-sum-exp, and a
//! backward in three launches (`delta = rowsum(dO * O)`, then dQ, then dK and dV) that
//! recomputes the attention probabilities tile by tile from q, k and the saved
//! log-sum-exp. Tensors are dense `[bh, t, d]` (batch and heads flattened), `d <= 128`,
//! of one float dtype; the log-sum-exp and delta are float32 `[bh, tq]`.

use super::rows::Param;
use crate::device_id::DevicePtr;
use crate::dtype::DType;

/// The largest head dimension the kernels hold in registers (4 floats per lane).
pub const ATTENTION_MAX_HEAD_DIM: usize = 128;

/// Query (or key) rows per block of the forward and backward kernels: one warp each.
const ROWS_PER_BLOCK: usize = 8;
/// Threads per block the kernels are written for (the launcher's block size).
const BLOCK: usize = 256;

/// One launch of an attention kernel.
#[derive(Debug, Clone, PartialEq)]
pub enum AttentionKernel {
    /// `out = softmax(q kᵀ · scale [causal: keys j > i hidden]) v` and
    /// `lse[r] = log(sum_j exp(s_rj))` (float32).
    Forward {
        dtype: DType,
        q: DevicePtr,
        k: DevicePtr,
        v: DevicePtr,
        out: DevicePtr,
        lse: DevicePtr,
        bh: usize,
        tq: usize,
        tk: usize,
        d: usize,
        scale: f32,
        causal: bool,
    },
    /// `delta[r] = sum_d out[r, d] * dout[r, d]` over `rows = bh * tq` rows (float32).
    Delta {
        dtype: DType,
        out: DevicePtr,
        dout: DevicePtr,
        delta: DevicePtr,
        rows: usize,
        d: usize,
    },
    /// The query gradient.
    BackwardDq {
        dtype: DType,
        q: DevicePtr,
        k: DevicePtr,
        v: DevicePtr,
        dout: DevicePtr,
        lse: DevicePtr,
        delta: DevicePtr,
        dq: DevicePtr,
        bh: usize,
        tq: usize,
        tk: usize,
        d: usize,
        scale: f32,
        causal: bool,
    },
    /// The key and value gradients.
    BackwardDkDv {
        dtype: DType,
        q: DevicePtr,
        k: DevicePtr,
        v: DevicePtr,
        dout: DevicePtr,
        lse: DevicePtr,
        delta: DevicePtr,
        dk: DevicePtr,
        dv: DevicePtr,
        bh: usize,
        tq: usize,
        tk: usize,
        d: usize,
        scale: f32,
        causal: bool,
    },
}

/// The functions of each dtype's attention module (the CUDA function is
/// `{name}_{dtype}`).
pub const ATTENTION_FUNCTIONS: [&str; 4] = [
    "attention_forward",
    "attention_backward_delta",
    "attention_backward_dq",
    "attention_backward_dkdv",
];

impl AttentionKernel {
    pub fn dtype(&self) -> DType {
        match *self {
            AttentionKernel::Forward { dtype, .. }
            | AttentionKernel::Delta { dtype, .. }
            | AttentionKernel::BackwardDq { dtype, .. }
            | AttentionKernel::BackwardDkDv { dtype, .. } => dtype,
        }
    }

    pub fn name(&self) -> &'static str {
        ATTENTION_FUNCTIONS[match self {
            AttentionKernel::Forward { .. } => 0,
            AttentionKernel::Delta { .. } => 1,
            AttentionKernel::BackwardDq { .. } => 2,
            AttentionKernel::BackwardDkDv { .. } => 3,
        }]
    }

    /// Threads the launch asks for: a block of 256 per tile of 8 rows (the kernels walk
    /// their tiles in a grid-stride loop over blocks, so a capped grid still covers
    /// them), one warp per row for `delta`.
    pub fn elements(&self) -> usize {
        let tiles = |bh: usize, t: usize| bh * t.div_ceil(ROWS_PER_BLOCK) * BLOCK;
        match *self {
            AttentionKernel::Forward { bh, tq, .. }
            | AttentionKernel::BackwardDq { bh, tq, .. } => tiles(bh, tq),
            AttentionKernel::BackwardDkDv { bh, tk, .. } => tiles(bh, tk),
            AttentionKernel::Delta { rows, d, .. } => {
                if d == 0 {
                    0
                } else {
                    rows * 32
                }
            }
        }
    }

    /// The arguments in the order of the C signatures in `kernels/attention.cu`.
    pub fn params(&self) -> Vec<Param> {
        use Param::*;
        let u = |v: usize| U64(v as u64);
        let d32 = |v: usize| U32(v as u32);
        match *self {
            AttentionKernel::Forward {
                q,
                k,
                v,
                out,
                lse,
                bh,
                tq,
                tk,
                d,
                scale,
                causal,
                ..
            } => vec![
                U64(q),
                U64(k),
                U64(v),
                U64(out),
                U64(lse),
                u(bh),
                u(tq),
                u(tk),
                d32(d),
                F32(scale),
                U32(causal as u32),
            ],
            AttentionKernel::Delta {
                out,
                dout,
                delta,
                rows,
                d,
                ..
            } => vec![U64(out), U64(dout), U64(delta), u(rows), d32(d)],
            AttentionKernel::BackwardDq {
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dq,
                bh,
                tq,
                tk,
                d,
                scale,
                causal,
                ..
            } => vec![
                U64(q),
                U64(k),
                U64(v),
                U64(dout),
                U64(lse),
                U64(delta),
                U64(dq),
                u(bh),
                u(tq),
                u(tk),
                d32(d),
                F32(scale),
                U32(causal as u32),
            ],
            AttentionKernel::BackwardDkDv {
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dk,
                dv,
                bh,
                tq,
                tk,
                d,
                scale,
                causal,
                ..
            } => vec![
                U64(q),
                U64(k),
                U64(v),
                U64(dout),
                U64(lse),
                U64(delta),
                U64(dk),
                U64(dv),
                u(bh),
                u(tq),
                u(tk),
                d32(d),
                F32(scale),
                U32(causal as u32),
            ],
        }
    }
}
