//! The row kernels of chunked attention (`kernels/attention_chunk.cu`, twins in
//! `attention_chunk_cpu.rs`): attention computed as matrix products ([`Gemm`]s, tensor
//! cores on the GPU) over a chunk of query rows at a time, with these kernels between
//! the products. The scores of a chunk are dense float32 `[n, rows, cols]`
//! ([`ScoreChunk`]): `n` batch-heads, `rows` query rows, `cols` keys from key 0.
//!
//! The kernels compute what the fused ones do (`attention.rs`): the same causal mask,
//! the same dropout flags ([`attention_keep_row`]'s counter rule, drawn again from the
//! call's generator state), the same float32 log-sum-exp. Only the order of the sums
//! differs (the products sum in tiles), so results agree to rounding.
//!
//! [`Gemm`]: super::Gemm
//! [`attention_keep_row`]: super::attention_keep_row

use super::attention::{AttentionDropout, HeadsOperand};
use super::rows::Param;
use crate::device_id::DevicePtr;
use crate::dtype::DType;

/// Where a chunk's dense scores lie in the whole call: batch-heads `bh0..bh0 + n`,
/// query rows `r0..r0 + rows` (of `tq`), keys `0..cols` (of `tk`). Row `r` of
/// batch-head `bh0 + z` is at element `(z·rows + r)·cols` of each dense buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreChunk {
    pub bh0: usize,
    pub n: usize,
    pub r0: usize,
    pub rows: usize,
    pub cols: usize,
    pub tq: usize,
    pub tk: usize,
}

impl ScoreChunk {
    /// Elements of one dense buffer of the chunk.
    pub fn len(&self) -> usize {
        self.n * self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn params(&self) -> [Param; 7] {
        let u = |v: usize| Param::U64(v as u64);
        [
            u(self.bh0),
            u(self.n),
            u(self.r0),
            u(self.rows),
            u(self.cols),
            u(self.tq),
            u(self.tk),
        ]
    }
}

/// One launch of a chunked-attention row kernel.
#[derive(Debug, Clone, PartialEq)]
pub enum AttentionChunkKernel {
    /// From the scaled scores `s` (float32, already `q kᵀ · scale`): each row's
    /// log-sum-exp over its visible keys, `lse[bh·tq + i] = log(sum_j exp(s_ij))`
    /// (float32, of the undropped weights, as the fused forward writes it), and the
    /// weights `probs = exp(s − lse) · Z / keep` in `dtype`, 0 where masked (`j > i`
    /// under `causal`) or dropped.
    Probs {
        dtype: DType,
        scores: DevicePtr,
        probs: DevicePtr,
        lse: DevicePtr,
        chunk: ScoreChunk,
        causal: bool,
        dropout: AttentionDropout,
    },
    /// From the scaled scores `s` and `dprobs = dO vᵀ` (float32) and the saved `lse`
    /// and `delta = rowsum(dO ∘ O)`: `probs = p · Z / keep` and
    /// `dscores = p · (dprobs · Z / keep − delta)` in `dtype` with `p = exp(s − lse)`,
    /// 0 where masked. (`dscores` lacks the factor `scale`, which the products take.)
    Grads {
        dtype: DType,
        scores: DevicePtr,
        dprobs: DevicePtr,
        probs: DevicePtr,
        dscores: DevicePtr,
        lse: DevicePtr,
        delta: DevicePtr,
        chunk: ScoreChunk,
        causal: bool,
        dropout: AttentionDropout,
    },
    /// Writes a dense float32 `[n, t, d]` (`src`) into rows `0..t` of batch-heads
    /// `bh0..bh0 + n` of `dst` (`heads` heads per batch), narrowed to `dtype`: the
    /// key and value gradients, accumulated in float32 over the chunks.
    Store {
        dtype: DType,
        src: DevicePtr,
        dst: HeadsOperand,
        bh0: usize,
        n: usize,
        heads: usize,
        t: usize,
        d: usize,
    },
}

/// The functions of each dtype's attention module that chunked attention adds (the
/// CUDA function is `{name}_{dtype}`).
pub const ATTENTION_CHUNK_FUNCTIONS: [&str; 3] = [
    "attention_chunk_probs",
    "attention_chunk_grads",
    "attention_chunk_store",
];

impl AttentionChunkKernel {
    pub fn dtype(&self) -> DType {
        match *self {
            AttentionChunkKernel::Probs { dtype, .. }
            | AttentionChunkKernel::Grads { dtype, .. }
            | AttentionChunkKernel::Store { dtype, .. } => dtype,
        }
    }

    pub fn name(&self) -> &'static str {
        ATTENTION_CHUNK_FUNCTIONS[match self {
            AttentionChunkKernel::Probs { .. } => 0,
            AttentionChunkKernel::Grads { .. } => 1,
            AttentionChunkKernel::Store { .. } => 2,
        }]
    }

    /// Threads the launch asks for: a warp per row for `Probs` (a row's max and sum are
    /// warp reductions), a thread per four keys for `Grads` (one Philox block serves
    /// four), a thread per element for `Store`; the GPU kernels give each row whole
    /// warps of one block and loop grid-stride over the rows.
    pub fn elements(&self) -> usize {
        match *self {
            AttentionChunkKernel::Probs { chunk, .. } => {
                if chunk.cols == 0 {
                    0
                } else {
                    chunk.n * chunk.rows * 32
                }
            }
            AttentionChunkKernel::Grads { chunk, .. } => {
                chunk.n * chunk.rows * chunk.cols.div_ceil(4)
            }
            AttentionChunkKernel::Store { n, t, d, .. } => n * t * d,
        }
    }

    /// The arguments in the order of the C signatures in `kernels/attention_chunk.cu`.
    pub fn params(&self) -> Vec<Param> {
        let mut p = Vec::new();
        let tail = |p: &mut Vec<Param>, causal: bool, d: &AttentionDropout| {
            p.push(Param::U32(causal as u32));
            p.push(Param::F32(d.keep));
            p.push(Param::F32(d.scale()));
            p.push(Param::U64(d.seed));
            p.push(Param::U64(d.offset));
        };
        match self {
            AttentionChunkKernel::Probs {
                scores,
                probs,
                lse,
                chunk,
                causal,
                dropout,
                ..
            } => {
                p.extend([scores, probs, lse].map(|&x| Param::U64(x)));
                p.extend(chunk.params());
                tail(&mut p, *causal, dropout);
            }
            AttentionChunkKernel::Grads {
                scores,
                dprobs,
                probs,
                dscores,
                lse,
                delta,
                chunk,
                causal,
                dropout,
                ..
            } => {
                p.extend([scores, dprobs, probs, dscores, lse, delta].map(|&x| Param::U64(x)));
                p.extend(chunk.params());
                tail(&mut p, *causal, dropout);
            }
            AttentionChunkKernel::Store {
                src,
                dst,
                bh0,
                n,
                heads,
                t,
                d,
                ..
            } => {
                let u = |v: usize| Param::U64(v as u64);
                p.push(Param::U64(*src));
                p.extend([Param::U64(dst.ptr), u(dst.batch), u(dst.head), u(dst.seq)]);
                p.extend([u(*bh0), u(*n), u(*heads), u(*t), Param::U32(*d as u32)]);
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = include_str!("../../../../../kernels/attention_chunk.cu");

    /// The number of parameters of `extern "C"` function `name` in attention_chunk.cu.
    fn c_arity(name: &str) -> usize {
        let start = SOURCE
            .find(&format!("void {name}_DT("))
            .unwrap_or_else(|| panic!("{name} in attention_chunk.cu"));
        let open = start + SOURCE[start..].find('(').unwrap();
        let close = open + SOURCE[open..].find(')').unwrap();
        SOURCE[open + 1..close].split(',').count()
    }

    #[test]
    fn params_follow_the_cuda_signatures() {
        let chunk = ScoreChunk {
            bh0: 0,
            n: 1,
            r0: 0,
            rows: 1,
            cols: 1,
            tq: 1,
            tk: 1,
        };
        let dropout = AttentionDropout::NONE;
        let dtype = DType::F32;
        let dst = HeadsOperand {
            ptr: 0,
            batch: 0,
            head: 0,
            seq: 0,
        };
        let kernels = [
            AttentionChunkKernel::Probs {
                dtype,
                scores: 0,
                probs: 0,
                lse: 0,
                chunk,
                causal: false,
                dropout,
            },
            AttentionChunkKernel::Grads {
                dtype,
                scores: 0,
                dprobs: 0,
                probs: 0,
                dscores: 0,
                lse: 0,
                delta: 0,
                chunk,
                causal: false,
                dropout,
            },
            AttentionChunkKernel::Store {
                dtype,
                src: 0,
                dst,
                bh0: 0,
                n: 1,
                heads: 1,
                t: 1,
                d: 1,
            },
        ];
        for k in kernels {
            assert_eq!(k.params().len(), c_arity(k.name()), "{}", k.name());
        }
    }
}
