//! The chunked path of fused attention (matrix products over chunks of query rows, the
//! GPU's default) against the fused kernels on the same inputs: the same outputs and
//! gradients, dropout included (the same flags), strided and expanded inputs, every
//! float dtype; chunks small enough that a call takes many, with rows and keys that do
//! not divide evenly; the launches it makes and the temporaries it holds. Runs on the
//! simulated GPU by default (the CPU twins) and on the GPU with `LABS_DEVICE=cuda`
//! (cuBLAS and `kernels/attention_chunk.cu` against `kernels/attention.cu`).

use labs_core::device::profile;
use labs_core::tensor::{attention_path, path_for, set_attention_chunk_bytes, set_attention_path};
use labs_core::tensor::{AttentionPath, DEFAULT_CHUNK_BYTES};
// The profiler is process-wide: the tests of this file take turns (serial).
use labs_core::testing::{host, max_error, serial, test_device};
use labs_core::{DType, Device, Tensor};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn random(shape: &[usize], seed: u64, dtype: DType, device: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(&values(n, seed), shape, device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// Runs `f` with this thread's attention forced onto `path`, chunks bounded at `bytes`.
fn on_path<T>(path: AttentionPath, bytes: usize, f: impl FnOnce() -> T) -> T {
    let before = (
        set_attention_path(Some(path)),
        set_attention_chunk_bytes(Some(bytes)),
    );
    let out = f();
    set_attention_path(before.0);
    set_attention_chunk_bytes(before.1);
    out
}

/// One call's output and the gradients of `sum(out * w)` for q, k and v, the inputs
/// made by `make` (leaves, then any views of them), under generator seed 7.
fn run(
    device: &Device,
    make: &dyn Fn() -> [Tensor; 3],
    causal: bool,
    dropout_p: f32,
) -> Vec<Vec<f64>> {
    let leaves = make().map(|t| t.requires_grad_(true));
    let [q, k, v] = &leaves;
    device.manual_seed(7);
    let out = Tensor::fused_attention(q, k, v, causal, None, dropout_p).unwrap();
    let w = random(out.shape(), 9, out.dtype(), device);
    out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let mut all = vec![host(&out)];
    all.extend(leaves.iter().map(|x| host(&x.grad().unwrap())));
    all
}

/// Asserts both paths agree within `tolerance` (the chunked one in chunks of `bytes`).
fn assert_paths_agree(
    what: &str,
    make: &dyn Fn() -> [Tensor; 3],
    causal: bool,
    dropout_p: f32,
    bytes: usize,
    tolerance: f64,
) {
    let device = test_device();
    let fused = on_path(AttentionPath::Fused, bytes, || {
        run(&device, make, causal, dropout_p)
    });
    let chunked = on_path(AttentionPath::Chunked, bytes, || {
        run(&device, make, causal, dropout_p)
    });
    for (which, (c, f)) in chunked.iter().zip(&fused).enumerate() {
        let err = max_error(c, f);
        assert!(
            err < tolerance,
            "{what} causal={causal} p={dropout_p}: {} error {err:e}",
            ["out", "dq", "dk", "dv"][which]
        );
    }
}

#[test]
fn chunks_give_the_fused_kernels_outputs_and_gradients_in_float32() {
    let _serial = serial();
    let device = test_device();
    // 2 KiB of temporaries: one or two query rows per chunk, so a call takes many.
    for (tq, tk, d) in [
        (37, 37, 16),
        (13, 29, 8),
        (29, 13, 32),
        (1, 5, 4),
        (70, 70, 64),
    ] {
        for causal in [false, true] {
            for p in [0.0, 0.3] {
                for bytes in [2048, DEFAULT_CHUNK_BYTES] {
                    let make = || {
                        [(tq, 1), (tk, 2), (tk, 3)]
                            .map(|(t, seed)| random(&[2, 3, t, d], seed, DType::F32, &device))
                    };
                    let what = format!("tq={tq} tk={tk} d={d} bytes={bytes}");
                    assert_paths_agree(&what, &make, causal, p, bytes, 2e-5);
                }
            }
        }
    }
}

#[test]
fn chunks_read_head_views_and_expanded_inputs_where_they_lie() {
    let _serial = serial();
    let device = test_device();
    let (b, t, h, d) = (3, 21, 4, 8);
    let e = h * d;
    // The heads of one packed [B, T, 3E] projection (GPT-2's c_attn): strides that
    // step over batches and heads differently, so the products go batch by batch.
    let packed = || {
        let x = random(&[b, t, 3 * e], 4, DType::F32, &device);
        let head = |i: usize| {
            x.narrow(2, i * e, e)
                .unwrap()
                .reshape(&[b, t, h, d])
                .unwrap()
                .transpose(1, 2)
                .unwrap()
        };
        [head(0), head(1), head(2)]
    };
    for causal in [false, true] {
        assert_paths_agree("packed heads", &packed, causal, 0.2, 4096, 2e-5);
    }
    // One key and value row expanded over the sequence (rows 0 apart, copied for the
    // products) and one head expanded over the heads (a batch stride of 0).
    let expanded = || {
        let q = random(&[b, h, t, d], 5, DType::F32, &device);
        let k = random(&[b, h, 1, d], 6, DType::F32, &device)
            .expand(&[b, h, t, d])
            .unwrap();
        let v = random(&[b, 1, t, d], 7, DType::F32, &device)
            .expand(&[b, h, t, d])
            .unwrap();
        [q, k, v]
    };
    assert_paths_agree("expanded", &expanded, true, 0.0, 4096, 2e-5);
}

#[test]
fn chunks_agree_with_the_fused_kernels_in_half_types() {
    let _serial = serial();
    let device = test_device();
    // The chunked path rounds the weights (and their gradients) to the inputs' dtype
    // before the second products, as flash attention does; the fused kernels keep them
    // in float32. The difference is a rounding of the dtype per weight, averaged over
    // the keys, and the final rounding of the result (a unit in the last place of
    // bfloat16 is 2^-8 relative): the tolerances fused_attention.rs allows the half
    // types against float64.
    for (dtype, tolerance) in [(DType::F16, 2e-3), (DType::BF16, 1.6e-2)] {
        for causal in [false, true] {
            let make = || {
                [(1, 40), (2, 40), (3, 40)]
                    .map(|(seed, t)| random(&[2, 2, t, 64], seed, dtype, &device))
            };
            assert_paths_agree(&format!("{dtype}"), &make, causal, 0.1, 1 << 14, tolerance);
        }
    }
}

#[test]
fn packed_half_heads_take_the_tensor_core_kernels_and_agree_with_the_chunks() {
    // GPT-2's heads under autocast: bfloat16 views of one packed [B, T, 3E] projection,
    // rows 16-byte aligned, no dropout: the fused path runs kernels/attention_flash.cu
    // on the GPU, and agrees with the chunked products.
    let _serial = serial();
    let device = test_device();
    let (b, t, h, d) = (2, 150, 3, 64);
    let e = h * d;
    for dtype in [DType::BF16, DType::F16] {
        let packed = || {
            let x = random(&[b, t, 3 * e], 12, dtype, &device);
            let head = |i: usize| {
                x.narrow(2, i * e, e)
                    .unwrap()
                    .reshape(&[b, t, h, d])
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
            };
            [head(0), head(1), head(2)]
        };
        let tolerance = if dtype == DType::BF16 { 1.6e-2 } else { 2e-3 };
        for causal in [false, true] {
            assert_paths_agree(
                &format!("packed {dtype}"),
                &packed,
                causal,
                0.0,
                1 << 16,
                tolerance,
            );
        }
    }
}

#[test]
fn the_chunked_path_launches_products_and_row_kernels_and_bounds_its_temporaries() {
    let _serial = serial();
    let device = test_device();
    // Calls the tensor-core kernels serve take the fused path, the others the chunked
    // one, unless the environment forces one. Forced here.
    if std::env::var("LABS_ATTENTION").is_err() {
        assert_eq!(attention_path().unwrap(), None);
        assert_eq!(path_for(false).unwrap(), AttentionPath::Chunked);
        assert_eq!(path_for(true).unwrap(), AttentionPath::Fused);
    }
    let (h, t, d) = (4, 512, 16);
    let [q, k, v] = [1, 2, 3].map(|s| random(&[1, h, t, d], s, DType::F32, &device));
    let bound = 64 << 10;
    let alloc = device.allocator().unwrap();
    device.synchronize().unwrap();
    let before = alloc.stats().allocated.current;
    alloc.reset_peak_stats();
    profile::take().unwrap();
    profile::start();
    let out = on_path(AttentionPath::Chunked, bound, || {
        Tensor::fused_attention(&q, &k, &v, true, None, 0.0).unwrap()
    });
    device.synchronize().unwrap();
    profile::stop();
    let launches = profile::take().unwrap();
    let count = |needle: &str| -> u64 {
        launches
            .iter()
            .filter(|l| l.label.contains(needle))
            .map(|l| l.launches)
            .sum()
    };
    // 64 KiB of float32 scores and weights over 4 heads of 512 keys: 4 rows a chunk
    // (8 bytes a score), 128 chunks, two products and one row kernel each.
    assert_eq!(count("AttentionChunk Probs"), 128, "{launches:?}");
    assert_eq!(count("Gemm"), 256, "{launches:?}");
    assert_eq!(count("Attention Forward"), 0, "{launches:?}");
    // Beyond the output and the log-sum-exp, the call held no more than the bound,
    // where the whole scores would be 4 MiB.
    let peak = alloc.stats().allocated.peak - before;
    let kept = (h * t * d * 4 + h * t * 4) as u64;
    assert!(
        peak <= kept + bound as u64 + 4096,
        "peak {peak} over the output's and lse's {kept} and the bound {bound}"
    );
    drop(out);
}

#[test]
fn packed_heads_of_several_batches_take_one_product_per_chunk() {
    let _serial = serial();
    let device = test_device();
    // GPT-2's layout in small: the heads of a packed [B, T, 3E] projection step over
    // batches by T·3E and over heads by D, no one stride. The products cover all B·H
    // batch-heads at once after one dense copy per input; the output comes back into
    // its [B, T, H, D] memory with one scatter.
    let (b, t, h, d) = (4, 64, 3, 16);
    let e = h * d;
    let x = random(&[b, t, 3 * e], 11, DType::F32, &device).requires_grad_(true);
    let head = |i: usize| {
        x.narrow(2, i * e, e)
            .unwrap()
            .reshape(&[b, t, h, d])
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let [q, k, v] = [head(0), head(1), head(2)];
    device.synchronize().unwrap();
    profile::take().unwrap();
    profile::start();
    // One chunk: 4·3 batch-heads of 64 × 64 float32 scores and weights are 384 KiB.
    let out = on_path(AttentionPath::Chunked, 1 << 20, || {
        Tensor::fused_attention(&q, &k, &v, false, None, 0.0).unwrap()
    });
    device.synchronize().unwrap();
    let forward = profile::take().unwrap();
    on_path(AttentionPath::Chunked, 1 << 20, || {
        out.sum_all().unwrap().backward().unwrap()
    });
    device.synchronize().unwrap();
    profile::stop();
    let backward = profile::take().unwrap();
    let count = |launches: &[profile::KernelTime], needle: &str| -> u64 {
        launches
            .iter()
            .filter(|l| l.label.starts_with(needle))
            .map(|l| l.launches)
            .sum()
    };
    let gemms = |launches: &[profile::KernelTime]| -> Vec<String> {
        launches
            .iter()
            .filter(|l| l.label.starts_with("Gemm"))
            .map(|l| l.label.clone())
            .collect()
    };
    assert_eq!(count(&forward, "Gemm"), 2, "{forward:?}");
    assert!(
        gemms(&forward).iter().all(|g| g.contains("batch 12")),
        "{forward:?}"
    );
    assert_eq!(count(&forward, "StridedCopy"), 3, "{forward:?}");
    assert_eq!(count(&forward, "StridedScatter"), 1, "{forward:?}");
    // Backward: S, dP, dV, dK, dQ over all batch-heads (the attention's own products;
    // the views' backward adds none).
    assert_eq!(count(&backward, "Gemm"), 5, "{backward:?}");
    assert!(
        gemms(&backward).iter().all(|g| g.contains("batch 12")),
        "{backward:?}"
    );
    // And the gradients are the fused kernels'.
    let make = || [head(0), head(1), head(2)].map(|t| t.detach());
    assert_paths_agree("packed heads, one chunk", &make, true, 0.0, 1 << 20, 2e-5);
}
