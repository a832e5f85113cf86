//! The fused attention kernels (`kernels/attention.cu`, twins in `attention_cpu.rs`):
//! a forward that writes only the output and each query row's log-sum-exp, and a
//! backward in three launches (`delta = rowsum(dO * O)`, then dQ, then dK and dV) that
//! recomputes the attention probabilities tile by tile from q, k and the saved
//! log-sum-exp. Every `[B, H, T, D]` operand is a [`HeadsOperand`]: any strides over
//! batch, head and sequence (the head views of a `[B, T, E]` projection are read where
//! they lie), unit stride over `d <= 128`; one float dtype. The log-sum-exp and delta
//! are dense float32 `[B·H, Tq]`.
//!
//! Dropout on the attention weights happens inside the kernels ([`AttentionDropout`]):
//! the keep mask of element `(b·h, i, j)` comes from Philox4x32-10 under the device
//! generator's seed, one block per four keys of a row ([`attention_keep_row`]), so the
//! backward regenerates the forward's mask instead of storing it.

use super::rows::{philox4x32_10, Param};
use crate::device_id::DevicePtr;
use crate::dtype::DType;

/// The largest head dimension the kernels hold in registers (4 floats per lane).
pub const ATTENTION_MAX_HEAD_DIM: usize = 128;

/// The head dimensions the tensor-core kernels (`kernels/attention_flash.cu`) are built
/// for: a multiple of the instruction's 16-element depth, at most 64 so that a warp's
/// rows, accumulators and scores stay in registers.
pub const FLASH_HEAD_DIMS: [usize; 4] = [16, 32, 48, 64];

/// Rows a block of the tensor-core kernels owns (16 per warp of the 256-thread block).
const FLASH_ROWS: usize = 128;

/// The functions of each float dtype's tensor-core module by head dimension (the CUDA
/// function is `{name}_{dtype}`): forward, dq, dk and dv.
pub const FLASH_FUNCTIONS: [[&str; 3]; 4] = [
    [
        "flash_attention_forward_d16",
        "flash_attention_backward_dq_d16",
        "flash_attention_backward_dkdv_d16",
    ],
    [
        "flash_attention_forward_d32",
        "flash_attention_backward_dq_d32",
        "flash_attention_backward_dkdv_d32",
    ],
    [
        "flash_attention_forward_d48",
        "flash_attention_backward_dq_d48",
        "flash_attention_backward_dkdv_d48",
    ],
    [
        "flash_attention_forward_d64",
        "flash_attention_backward_dq_d64",
        "flash_attention_backward_dkdv_d64",
    ],
];

/// Whether the tensor-core kernels serve an attention call: a float dtype (float32 by
/// 3xTF32, to float32's accuracy), a head dimension of [`FLASH_HEAD_DIMS`], no dropout
/// (their schedule draws no mask), and every operand's rows 16-byte aligned (they move
/// rows 16 bytes at a time). The other calls
/// run on the kernels of `kernels/attention.cu`. The test is the same on every backend
/// (the simulator runs the reference twins for both), so a training step allocates the
/// same on each.
pub fn flash_serves(
    dtype: DType,
    d: usize,
    dropout: &AttentionDropout,
    operands: &[&HeadsOperand],
) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && FLASH_HEAD_DIMS.contains(&d)
        && !dropout.active()
        && operands.iter().all(|o| o.rows_aligned(dtype.size()))
}

/// Query (or key) rows per block of the forward and backward kernels: one warp each.
const ROWS_PER_BLOCK: usize = 8;
/// Threads per block the kernels are written for (the launcher's block size).
const BLOCK: usize = 256;

/// A `[B, H, T, D]` operand where it lies: its address and its element strides over
/// batch, head and sequence (head_dim has unit stride). Row `t` of batch-head `bh`
/// starts at element `(bh / H)·batch + (bh % H)·head + t·seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadsOperand {
    pub ptr: DevicePtr,
    pub batch: usize,
    pub head: usize,
    pub seq: usize,
}

impl HeadsOperand {
    /// The first element of row `t` of batch-head `bh`, `heads` heads per batch.
    pub fn row(&self, bh: usize, heads: usize, t: usize) -> usize {
        (bh / heads) * self.batch + (bh % heads) * self.head + t * self.seq
    }

    /// The elements from `ptr` to the end of the last row of `bh` batch-heads of `t`
    /// rows of `d`: what a kernel may touch (0 when there is no row).
    pub fn extent(&self, bh: usize, heads: usize, t: usize, d: usize) -> usize {
        if bh == 0 || t == 0 || d == 0 {
            0
        } else {
            self.row(bh - 1, heads, t - 1) + d
        }
    }

    /// Whether every row starts on a 16-byte boundary (elements of `size` bytes): the
    /// address and each stride a whole number of 16 bytes.
    pub fn rows_aligned(&self, size: usize) -> bool {
        let bytes = |elements: usize| (elements * size).is_multiple_of(16);
        self.ptr.is_multiple_of(16) && bytes(self.batch) && bytes(self.head) && bytes(self.seq)
    }

    fn params(&self) -> [Param; 4] {
        let u = |v: usize| Param::U64(v as u64);
        [
            Param::U64(self.ptr),
            u(self.batch),
            u(self.head),
            u(self.seq),
        ]
    }
}

/// The sizes of one attention call: `bh = B·H` batch-heads of `heads` heads, `tq`
/// queries, `tk` keys, head_dim `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub bh: usize,
    pub heads: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
}

impl AttentionShape {
    fn params(&self) -> [Param; 5] {
        let u = |v: usize| Param::U64(v as u64);
        [
            u(self.bh),
            u(self.heads),
            u(self.tq),
            u(self.tk),
            Param::U32(self.d as u32),
        ]
    }
}

/// Dropout on the attention weights: element `(b·h, i, j)` is kept with probability
/// `keep` (scaled by `1 / keep`), drawn from the generator state `(seed, offset)` the
/// call reserved. `keep = 1` is no dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDropout {
    pub keep: f32,
    pub seed: u64,
    pub offset: u64,
}

impl AttentionDropout {
    /// No dropout: every weight kept as it is.
    pub const NONE: AttentionDropout = AttentionDropout {
        keep: 1.0,
        seed: 0,
        offset: 0,
    };

    /// Whether any weight may be dropped.
    pub fn active(&self) -> bool {
        self.keep < 1.0
    }

    /// The factor of a kept weight: `1 / keep`, 0 when nothing is kept (`p = 1`, as
    /// `dropout` does).
    pub fn scale(&self) -> f32 {
        if self.keep == 0.0 {
            0.0
        } else {
            1.0 / self.keep
        }
    }

    fn params(&self) -> [Param; 4] {
        [
            Param::F32(self.keep),
            Param::F32(self.scale()),
            Param::U64(self.seed),
            Param::U64(self.offset),
        ]
    }
}

/// Which weights of row `row = bh·tq + i` (of a call with `tk` keys) survive `dropout`:
/// key `j` takes word `j % 4` of the Philox4x32-10 block of counter
/// `offset + row·⌈tk/4⌉ + ⌊j/4⌋` under `seed`, as a 24-bit uniform `u`, kept when
/// `u < keep` (the rule of the `dropout` kernel). One block serves four keys; the
/// counters of a call stay below `offset + B·H·Tq·Tk`, the increment it reserves (as
/// PyTorch's memory-efficient kernel reserves).
pub fn attention_keep_row(dropout: &AttentionDropout, row: usize, tk: usize) -> Vec<bool> {
    let groups = tk.div_ceil(4);
    let seed = [dropout.seed as u32, (dropout.seed >> 32) as u32];
    let mut keeps = Vec::with_capacity(groups * 4);
    for g in 0..groups {
        let counter = dropout.offset.wrapping_add((row * groups + g) as u64);
        let words = philox4x32_10([counter as u32, (counter >> 32) as u32, 0, 0], seed);
        keeps.extend(
            words
                .iter()
                .map(|w| ((w >> 8) as f32 * (1.0 / 16_777_216.0)) < dropout.keep),
        );
    }
    keeps.truncate(tk);
    keeps
}

/// One launch of an attention kernel.
#[derive(Debug, Clone, PartialEq)]
pub enum AttentionKernel {
    /// `out = (softmax(q kᵀ · scale [causal: keys j > i hidden]) ∘ Z / keep) v` and
    /// `lse[r] = log(sum_j exp(s_rj))` (float32, of the undropped weights).
    Forward {
        dtype: DType,
        q: HeadsOperand,
        k: HeadsOperand,
        v: HeadsOperand,
        out: HeadsOperand,
        lse: DevicePtr,
        shape: AttentionShape,
        scale: f32,
        causal: bool,
        dropout: AttentionDropout,
    },
    /// `delta[r] = sum_d out[r, d] * dout[r, d]` over the `bh · tq` rows (float32).
    Delta {
        dtype: DType,
        out: HeadsOperand,
        dout: HeadsOperand,
        delta: DevicePtr,
        shape: AttentionShape,
    },
    /// The query gradient.
    BackwardDq {
        dtype: DType,
        q: HeadsOperand,
        k: HeadsOperand,
        v: HeadsOperand,
        dout: HeadsOperand,
        lse: DevicePtr,
        delta: DevicePtr,
        dq: HeadsOperand,
        shape: AttentionShape,
        scale: f32,
        causal: bool,
        dropout: AttentionDropout,
    },
    /// The key and value gradients.
    BackwardDkDv {
        dtype: DType,
        q: HeadsOperand,
        k: HeadsOperand,
        v: HeadsOperand,
        dout: HeadsOperand,
        lse: DevicePtr,
        delta: DevicePtr,
        dk: HeadsOperand,
        dv: HeadsOperand,
        shape: AttentionShape,
        scale: f32,
        causal: bool,
        dropout: AttentionDropout,
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

    /// Whether this launch runs on the tensor-core kernels ([`flash_serves`]).
    pub fn flash(&self) -> bool {
        match self {
            AttentionKernel::Forward {
                dtype,
                q,
                k,
                v,
                out,
                shape,
                dropout,
                ..
            } => flash_serves(*dtype, shape.d, dropout, &[q, k, v, out]),
            AttentionKernel::Delta { .. } => false,
            AttentionKernel::BackwardDq {
                dtype,
                q,
                k,
                v,
                dout,
                dq,
                shape,
                dropout,
                ..
            } => flash_serves(*dtype, shape.d, dropout, &[q, k, v, dout, dq]),
            AttentionKernel::BackwardDkDv {
                dtype,
                q,
                k,
                v,
                dout,
                dk,
                dv,
                shape,
                dropout,
                ..
            } => flash_serves(*dtype, shape.d, dropout, &[q, k, v, dout, dk, dv]),
        }
    }

    fn shape(&self) -> AttentionShape {
        match *self {
            AttentionKernel::Forward { shape, .. }
            | AttentionKernel::Delta { shape, .. }
            | AttentionKernel::BackwardDq { shape, .. }
            | AttentionKernel::BackwardDkDv { shape, .. } => shape,
        }
    }

    pub fn name(&self) -> &'static str {
        if self.flash() {
            let by_dim = FLASH_HEAD_DIMS
                .iter()
                .position(|&d| d == self.shape().d)
                .expect("flash() checked the head dimension");
            return FLASH_FUNCTIONS[by_dim][match self {
                AttentionKernel::Forward { .. } => 0,
                AttentionKernel::BackwardDq { .. } => 1,
                _ => 2,
            }];
        }
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
    /// The tensor-core kernels take 128 rows a block instead.
    pub fn elements(&self) -> usize {
        let rows = if self.flash() {
            FLASH_ROWS
        } else {
            ROWS_PER_BLOCK
        };
        let tiles = |bh: usize, t: usize| bh * t.div_ceil(rows) * BLOCK;
        match *self {
            AttentionKernel::Forward { shape, .. } | AttentionKernel::BackwardDq { shape, .. } => {
                tiles(shape.bh, shape.tq)
            }
            AttentionKernel::BackwardDkDv { shape, .. } => tiles(shape.bh, shape.tk),
            AttentionKernel::Delta { shape, .. } => {
                if shape.d == 0 {
                    0
                } else {
                    shape.bh * shape.tq * 32
                }
            }
        }
    }

    /// The arguments in the order of the C signatures in `kernels/attention.cu`: each
    /// operand as its pointer and three strides, then the shape, then the scalars.
    pub fn params(&self) -> Vec<Param> {
        let mut p = Vec::new();
        let tail = |p: &mut Vec<Param>, scale: f32, causal: bool, dropout: &AttentionDropout| {
            p.push(Param::F32(scale));
            p.push(Param::U32(causal as u32));
            p.extend(dropout.params());
        };
        match self {
            AttentionKernel::Forward {
                q,
                k,
                v,
                out,
                lse,
                shape,
                scale,
                causal,
                dropout,
                ..
            } => {
                for o in [q, k, v, out] {
                    p.extend(o.params());
                }
                p.push(Param::U64(*lse));
                p.extend(shape.params());
                tail(&mut p, *scale, *causal, dropout);
            }
            AttentionKernel::Delta {
                out,
                dout,
                delta,
                shape,
                ..
            } => {
                p.extend(out.params());
                p.extend(dout.params());
                p.push(Param::U64(*delta));
                p.extend(shape.params());
            }
            AttentionKernel::BackwardDq {
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dq,
                shape,
                scale,
                causal,
                dropout,
                ..
            } => {
                for o in [q, k, v, dout] {
                    p.extend(o.params());
                }
                p.push(Param::U64(*lse));
                p.push(Param::U64(*delta));
                p.extend(dq.params());
                p.extend(shape.params());
                tail(&mut p, *scale, *causal, dropout);
            }
            AttentionKernel::BackwardDkDv {
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dk,
                dv,
                shape,
                scale,
                causal,
                dropout,
                ..
            } => {
                for o in [q, k, v, dout] {
                    p.extend(o.params());
                }
                p.push(Param::U64(*lse));
                p.push(Param::U64(*delta));
                p.extend(dk.params());
                p.extend(dv.params());
                p.extend(shape.params());
                tail(&mut p, *scale, *causal, dropout);
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = include_str!("../../../../../kernels/attention.cu");

    /// The number of parameters of `extern "C"` function `name` in attention.cu.
    fn c_arity(name: &str) -> usize {
        let start = SOURCE
            .find(&format!("void {name}_DT("))
            .unwrap_or_else(|| panic!("{name} in attention.cu"));
        let open = start + SOURCE[start..].find('(').unwrap();
        let close = open + SOURCE[open..].find(')').unwrap();
        SOURCE[open + 1..close].split(',').count()
    }

    fn kernels() -> Vec<AttentionKernel> {
        let o = HeadsOperand {
            ptr: 0,
            batch: 0,
            head: 0,
            seq: 0,
        };
        let shape = AttentionShape {
            bh: 1,
            heads: 1,
            tq: 1,
            tk: 1,
            d: 1,
        };
        let dropout = AttentionDropout::NONE;
        let dtype = DType::F32;
        vec![
            AttentionKernel::Forward {
                dtype,
                q: o,
                k: o,
                v: o,
                out: o,
                lse: 0,
                shape,
                scale: 1.0,
                causal: false,
                dropout,
            },
            AttentionKernel::Delta {
                dtype,
                out: o,
                dout: o,
                delta: 0,
                shape,
            },
            AttentionKernel::BackwardDq {
                dtype,
                q: o,
                k: o,
                v: o,
                dout: o,
                lse: 0,
                delta: 0,
                dq: o,
                shape,
                scale: 1.0,
                causal: false,
                dropout,
            },
            AttentionKernel::BackwardDkDv {
                dtype,
                q: o,
                k: o,
                v: o,
                dout: o,
                lse: 0,
                delta: 0,
                dk: o,
                dv: o,
                shape,
                scale: 1.0,
                causal: false,
                dropout,
            },
        ]
    }

    #[test]
    fn params_follow_the_cuda_signatures() {
        // A launch passes exactly as many arguments as the C function takes; their
        // order is the one `params` documents.
        for k in kernels() {
            assert_eq!(k.params().len(), c_arity(k.name()), "{}", k.name());
        }
    }

    const FLASH_SOURCE: &str = include_str!("../../../../../kernels/attention_flash.cu");

    /// The number of parameters of the function `name` defines in attention_flash.cu's
    /// `FL_DEFINE` (named there `name##D##_DT`).
    fn flash_arity(name: &str) -> usize {
        let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
        let start = FLASH_SOURCE
            .find(&format!("{stem}##D##_DT("))
            .unwrap_or_else(|| panic!("{name} in attention_flash.cu"));
        let open = start + FLASH_SOURCE[start..].find('(').unwrap();
        let close = open + FLASH_SOURCE[open..].find(')').unwrap();
        FLASH_SOURCE[open + 1..close].split(',').count()
    }

    #[test]
    fn calls_without_dropout_on_aligned_rows_take_the_tensor_core_kernels() {
        let aligned = HeadsOperand {
            ptr: 1 << 20,
            batch: 1024 * 3 * 768,
            head: 64,
            seq: 3 * 768,
        };
        let shape = AttentionShape {
            bh: 96,
            heads: 12,
            tq: 1024,
            tk: 1024,
            d: 64,
        };
        let forward = |dtype, o: HeadsOperand, d: usize, dropout| AttentionKernel::Forward {
            dtype,
            q: o,
            k: o,
            v: o,
            out: aligned,
            lse: 0,
            shape: AttentionShape { d, ..shape },
            scale: 0.125,
            causal: true,
            dropout,
        };
        let none = AttentionDropout::NONE;
        let bf16 = forward(DType::BF16, aligned, 64, none);
        assert!(bf16.flash());
        assert_eq!(bf16.name(), "flash_attention_forward_d64");
        // 8 batches x 12 heads x 8 tiles of 128 rows, a block of 256 threads each.
        assert_eq!(bf16.elements(), 96 * 8 * 256);
        assert!(forward(DType::F16, aligned, 32, none).flash());
        assert!(forward(DType::F32, aligned, 16, none).flash());
        // Another head size, dropout, or a row off a 16-byte boundary: the reference
        // kernels.
        assert!(!forward(DType::BF16, aligned, 40, none).flash());
        assert!(!forward(DType::BF16, aligned, 128, none).flash());
        let dropping = AttentionDropout {
            keep: 0.9,
            seed: 1,
            offset: 0,
        };
        assert!(!forward(DType::BF16, aligned, 64, dropping).flash());
        let odd = HeadsOperand {
            seq: 3 * 768 + 4,
            ..aligned
        };
        assert!(!forward(DType::BF16, odd, 64, none).flash());
        assert_eq!(
            forward(DType::BF16, odd, 64, none).name(),
            "attention_forward"
        );
    }

    #[test]
    fn flash_params_follow_the_cuda_signatures() {
        let o = HeadsOperand {
            ptr: 256,
            batch: 64,
            head: 64,
            seq: 64,
        };
        for d in FLASH_HEAD_DIMS {
            let shape = AttentionShape {
                bh: 1,
                heads: 1,
                tq: 1,
                tk: 1,
                d,
            };
            let half: Vec<AttentionKernel> = kernels()
                .into_iter()
                .map(|k| retyped(k, o, shape))
                .filter(AttentionKernel::flash)
                .collect();
            assert_eq!(half.len(), 3, "forward, dq, dkdv");
            for k in half {
                assert!(k.name().ends_with(&format!("_d{d}")), "{}", k.name());
                assert_eq!(k.params().len(), flash_arity(k.name()), "{}", k.name());
                assert_eq!(k.params().len(), c_arity(without_dim(k.name())));
            }
        }
    }

    /// `k` as a bfloat16 launch over operand `o` with `shape`.
    fn retyped(k: AttentionKernel, o: HeadsOperand, shape: AttentionShape) -> AttentionKernel {
        let dtype = DType::BF16;
        match k {
            AttentionKernel::Forward {
                scale,
                causal,
                dropout,
                lse,
                ..
            } => AttentionKernel::Forward {
                dtype,
                q: o,
                k: o,
                v: o,
                out: o,
                lse,
                shape,
                scale,
                causal,
                dropout,
            },
            AttentionKernel::Delta { delta, .. } => AttentionKernel::Delta {
                dtype,
                out: o,
                dout: o,
                delta,
                shape,
            },
            AttentionKernel::BackwardDq {
                lse,
                delta,
                scale,
                causal,
                dropout,
                ..
            } => AttentionKernel::BackwardDq {
                dtype,
                q: o,
                k: o,
                v: o,
                dout: o,
                lse,
                delta,
                dq: o,
                shape,
                scale,
                causal,
                dropout,
            },
            AttentionKernel::BackwardDkDv {
                lse,
                delta,
                scale,
                causal,
                dropout,
                ..
            } => AttentionKernel::BackwardDkDv {
                dtype,
                q: o,
                k: o,
                v: o,
                dout: o,
                lse,
                delta,
                dk: o,
                dv: o,
                shape,
                scale,
                causal,
                dropout,
            },
        }
    }

    /// The reference kernel a tensor-core function stands in for.
    fn without_dim(name: &str) -> &'static str {
        if name.contains("forward") {
            "attention_forward"
        } else if name.contains("dkdv") {
            "attention_backward_dkdv"
        } else {
            "attention_backward_dq"
        }
    }

    #[test]
    fn the_first_word_of_a_group_is_the_dropout_kernels_draw() {
        // Key 4g of a row takes word 0 of the block, as `dropout` takes for its element
        // of the same counter: the two kernels share one generator scheme.
        let dropout = AttentionDropout {
            keep: 0.6,
            seed: 0x1234_5678_9abc,
            offset: 77,
        };
        let (tk, row) = (13, 5);
        let keeps = attention_keep_row(&dropout, row, tk);
        assert_eq!(keeps.len(), tk);
        for g in 0..tk.div_ceil(4) {
            let counter = dropout.offset + (row * tk.div_ceil(4) + g) as u64;
            let u = crate::kernels::rows::dropout_uniform(dropout.seed, counter);
            assert_eq!(keeps[4 * g], u < dropout.keep, "group {g}");
        }
        // About `keep` of many weights survive.
        let many: Vec<bool> = (0..100)
            .flat_map(|r| attention_keep_row(&dropout, r, 100))
            .collect();
        let share = many.iter().filter(|&&k| k).count() as f64 / many.len() as f64;
        assert!((share - 0.6).abs() < 0.02, "{share}");
    }
}
