//! `softmax` and `log_softmax` with an output dtype (PyTorch's `dtype=` argument), and
//! autocast running them as PyTorch's `fp32_set_opt_dtype` ops: a half-precision input
//! read as it is and written in float32 (no float32 copy of the input, no Cast
//! launch), the gradient written in the input's dtype (no float32 gradient, no cast).
//! The fused kernels compute what a cast to float32 followed by the float32 kernel
//! computes, in the same order, so results agree bit for bit on every backend.
//!
//! The profiler counts every launch of the process, so the tests run one at a time.

use std::collections::HashMap;

use half::{bf16, f16};
use labs_base::testing::serial;
use labs_device::device::profile;
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{sdpa_kernel, Gpt2, Gpt2Config, Module, Rng, SdpaBackend};
use labs_tensor::tensor::{autocast, set_attention_path, AttentionPath};
use labs_tensor::{DType, Tensor};

/// Launches per label (`Rows Softmax BF16`, `Cast`, ...) while `f` runs.
fn launches(f: impl FnOnce()) -> HashMap<String, u64> {
    profile::take().unwrap();
    profile::start();
    f();
    profile::stop();
    let mut labels = HashMap::new();
    for row in profile::take().unwrap() {
        *labels.entry(row.label).or_insert(0) += row.launches;
    }
    labels
}

/// Launches whose label starts with `prefix`.
fn count(labels: &HashMap<String, u64>, prefix: &str) -> u64 {
    labels
        .iter()
        .filter(|(l, _)| l.starts_with(prefix))
        .map(|(_, n)| n)
        .sum()
}

fn values(n: usize, seed: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 37 + seed * 11) % 97) as f32 - 48.0) * scale)
        .collect()
}

fn make(data: &[f32], shape: &[usize], dtype: DType, device: &Device) -> Tensor {
    match dtype {
        DType::F32 => Tensor::from_slice(data, shape, device),
        DType::F16 => {
            let v: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
            Tensor::from_slice(&v, shape, device)
        }
        DType::BF16 => {
            let v: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
            Tensor::from_slice(&v, shape, device)
        }
        other => panic!("no float dtype {other}"),
    }
    .unwrap()
}

/// The elements' bits, whatever the float dtype (exact comparisons).
fn bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits().into())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits().into())
            .collect(),
        other => panic!("no float dtype {other}"),
    }
}

/// The float64 reference of (log_)softmax over the last dimension of `[rows, cols]`.
fn reference(x: &[f64], cols: usize, log: bool) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            row.iter()
                .map(move |v| {
                    if log {
                        v - m - s.ln()
                    } else {
                        (v - m).exp() / s
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_half_input_written_in_float32_is_exactly_cast_then_op() {
    let _serial = serial();
    let d = test_device();
    // 300 columns: the four-loads loop and its tail both run on the GPU.
    let (rows, cols) = (6, 300);
    for dtype in [DType::F16, DType::BF16] {
        let x = make(&values(rows * cols, 1, 0.09), &[rows, cols], dtype, &d);
        let widened: Vec<f64> = bits_to_f64(&x);
        for log in [false, true] {
            for dim in [0, 1] {
                let fused = if log {
                    x.log_softmax_dtype(dim, DType::F32).unwrap()
                } else {
                    x.softmax_dtype(dim, DType::F32).unwrap()
                };
                let wide = x.to_dtype(DType::F32).unwrap();
                let cast_then_op = if log {
                    wide.log_softmax(dim).unwrap()
                } else {
                    wide.softmax(dim).unwrap()
                };
                assert_eq!(fused.dtype(), DType::F32);
                assert_eq!(fused.shape(), &[rows, cols]);
                assert_eq!(
                    bits(&fused),
                    bits(&cast_then_op),
                    "{dtype} log {log} dim {dim}"
                );
                if dim == 1 {
                    let want = reference(&widened, cols, log);
                    let got = fused.to_vec::<f32>().unwrap();
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                            "{g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

fn bits_to_f64(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect()
}

#[test]
fn the_gradient_is_written_in_the_inputs_dtype_as_the_float32_path_then_a_cast() {
    let _serial = serial();
    let d = test_device();
    let (rows, cols) = (5, 260);
    let w = make(&values(rows * cols, 3, 0.01), &[rows, cols], DType::F32, &d);
    for dtype in [DType::F16, DType::BF16] {
        for log in [false, true] {
            let data = values(rows * cols, 2, 0.07);
            let fused_x = make(&data, &[rows, cols], dtype, &d).requires_grad_(true);
            let cast_x = make(&data, &[rows, cols], dtype, &d).requires_grad_(true);
            let run = |y: Tensor| y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            let (fused, wide) = if log {
                (
                    fused_x.log_softmax_dtype(1, DType::F32).unwrap(),
                    cast_x.to_dtype(DType::F32).unwrap().log_softmax(1).unwrap(),
                )
            } else {
                (
                    fused_x.softmax_dtype(1, DType::F32).unwrap(),
                    cast_x.to_dtype(DType::F32).unwrap().softmax(1).unwrap(),
                )
            };
            let labels = launches(|| {
                run(fused);
                d.synchronize().unwrap();
            });
            assert_eq!(count(&labels, "Cast"), 0, "{labels:?}");
            assert_eq!(count(&labels, "Rows SoftmaxBackward"), 1, "{labels:?}");
            run(wide);
            let (g_fused, g_cast) = (fused_x.grad().unwrap(), cast_x.grad().unwrap());
            assert_eq!(g_fused.dtype(), dtype);
            assert_eq!(bits(&g_fused), bits(&g_cast), "{dtype} log {log}");
            // Not all zero: the comparison compares something.
            assert!(bits_to_f64(&g_fused).iter().any(|v| v.abs() > 1e-4));
        }
    }
}

#[test]
fn autocast_runs_log_softmax_of_half_logits_in_float32_without_a_cast() {
    let _serial = serial();
    let d = test_device();
    let (rows, cols) = (4, 200);
    let data = values(rows * cols, 5, 0.05);
    for dtype in [DType::F16, DType::BF16] {
        let x = make(&data, &[rows, cols], dtype, &d).requires_grad_(true);
        let mut y = None;
        let forward = launches(|| {
            let _region = autocast(dtype).unwrap();
            y = Some(x.log_softmax(1).unwrap());
            d.synchronize().unwrap();
        });
        let y = y.unwrap();
        assert_eq!(y.dtype(), DType::F32, "{dtype}");
        assert_eq!(count(&forward, "Cast"), 0, "{forward:?}");
        let softmax = format!("Rows Softmax {dtype:?}");
        assert_eq!(count(&forward, &softmax), 1, "{forward:?}");
        assert_eq!(forward.values().sum::<u64>(), 1, "{forward:?}");
        let want = x.to_dtype(DType::F32).unwrap().log_softmax(1).unwrap();
        assert_eq!(bits(&y), bits(&want));
        let targets: Vec<i64> = (0..rows as i64).map(|r| r * 7 % cols as i64).collect();
        let targets = Tensor::from_slice(&targets, &[rows], &d).unwrap();
        let loss = y.nll_loss(&targets, -100).unwrap();
        let backward = launches(|| {
            loss.backward().unwrap();
            d.synchronize().unwrap();
        });
        assert_eq!(count(&backward, "Cast"), 0, "{backward:?}");
        let grad = x.grad().unwrap();
        assert_eq!(grad.dtype(), dtype);
        // (softmax - onehot) / rows, rounded once to the input's dtype.
        let g = bits_to_f64(&grad);
        let p = reference(&bits_to_f64(&x), cols, false);
        for r in 0..rows {
            for c in 0..cols {
                let onehot = if c as i64 == r as i64 * 7 % cols as i64 {
                    1.0
                } else {
                    0.0
                };
                let want = (p[r * cols + c] - onehot) / rows as f64;
                let got = g[r * cols + c];
                assert!(
                    (got - want).abs() <= 1e-2 * want.abs() + 1e-6,
                    "{got} vs {want}"
                );
            }
        }
        // softmax is on the same list; a float32 input is left as it is.
        let _region = autocast(dtype).unwrap();
        assert_eq!(x.softmax(0).unwrap().dtype(), DType::F32);
        let wide = x.to_dtype(DType::F32).unwrap();
        assert_eq!(wide.log_softmax(1).unwrap().dtype(), DType::F32);
        // An explicit dtype is respected inside a region, as PyTorch's set_opt_dtype.
        assert_eq!(x.log_softmax_dtype(1, dtype).unwrap().dtype(), dtype);
    }
}

#[test]
fn other_dtype_pairs_cast_first_and_bad_ones_are_errors() {
    let _serial = serial();
    let d = test_device();
    let x = make(&values(3 * 40, 7, 0.1), &[3, 40], DType::F32, &d);
    let narrow = x.log_softmax_dtype(1, DType::BF16).unwrap();
    assert_eq!(narrow.dtype(), DType::BF16);
    let want = x.to_dtype(DType::BF16).unwrap().log_softmax(1).unwrap();
    assert_eq!(bits(&narrow), bits(&want));
    let h = x.to_dtype(DType::F16).unwrap();
    let across = h.softmax_dtype(1, DType::BF16).unwrap();
    assert_eq!(across.dtype(), DType::BF16);
    let same = x.softmax_dtype(1, DType::F32).unwrap();
    assert_eq!(bits(&same), bits(&x.softmax(1).unwrap()));
    let err = x.softmax_dtype(1, DType::I64).unwrap_err();
    assert!(err.to_string().contains("floating-point"), "{err}");
    let ints = Tensor::from_slice(&[1i64, 2, 3], &[3], &d).unwrap();
    assert!(ints.log_softmax_dtype(0, DType::F32).is_err());
    assert!(h.log_softmax_dtype(2, DType::F32).is_err(), "no dim 2");
}

const MIB: u64 = 1 << 20;

fn small_gpt2(device: &Device) -> Gpt2 {
    let config = Gpt2Config {
        vocab: 4096,
        n_positions: 64,
        d_model: 64,
        n_layer: 2,
        n_head: 4,
        dropout: 0.0,
    };
    Gpt2::new(config, &mut Rng::seeded(3), device).unwrap()
}

/// The peak allocated over one bf16-autocast forward and backward of a small GPT-2
/// with a large vocabulary, its loss through `log_softmax` of the bf16 logits (as
/// autocast now runs it) or, with `cast_first`, of their float32 copy (what autocast
/// did before: cast the input of every float32 op).
fn gpt2_step_peak(device: &Device, cast_first: bool) -> u64 {
    let model = small_gpt2(device);
    let (b, t) = (4, 64);
    let tokens: Vec<i64> = (0..b * t).map(|i| (i * 131 % 4096) as i64).collect();
    let idx = Tensor::from_slice(&tokens, &[b, t], device).unwrap();
    let targets: Vec<i64> = tokens.iter().map(|v| (v + 1) % 4096).collect();
    let targets = Tensor::from_slice(&targets, &[b * t], device).unwrap();
    let _fused = sdpa_kernel(SdpaBackend::Fused);
    let path = set_attention_path(Some(AttentionPath::Fused));
    let alloc = device.allocator().unwrap();
    device.synchronize().unwrap();
    alloc.reset_peak_stats();
    let loss = {
        let _region = autocast(DType::BF16).unwrap();
        let logits = model
            .forward(&idx)
            .unwrap()
            .reshape(&[b * t, 4096])
            .unwrap();
        assert_eq!(logits.dtype(), DType::BF16);
        let logits = if cast_first {
            logits.to_dtype(DType::F32).unwrap()
        } else {
            logits
        };
        logits.cross_entropy(&targets, -100).unwrap()
    };
    assert_eq!(loss.dtype(), DType::F32);
    loss.backward().unwrap();
    device.synchronize().unwrap();
    set_attention_path(path);
    alloc.max_memory_allocated()
}

#[test]
fn a_bf16_gpt2_step_peaks_lower_by_the_float32_gradient_and_dry_matches_sim() {
    let _serial = serial();
    let sim = Device::new_sim(4 << 30);
    let dry = Device::new_dry(4 << 30);
    let (before, after) = (gpt2_step_peak(&dry, true), gpt2_step_peak(&dry, false));
    assert_eq!(
        gpt2_step_peak(&sim, false),
        after,
        "sim and dry allocate alike"
    );
    assert_eq!(
        gpt2_step_peak(&sim, true),
        before,
        "sim and dry allocate alike"
    );
    eprintln!(
        "small GPT-2 bf16 step: peak {before} bytes ({:.2} MiB) before, {after} bytes \
         ({:.2} MiB) after",
        before as f64 / MIB as f64,
        after as f64 / MIB as f64,
    );
    // The step peaks in the log_softmax backward. Before: the saved float32 output,
    // the float32 incoming gradient and a float32 input gradient (cast to bf16 after,
    // when the first two are gone): 12 bytes per logit. Now the input gradient is
    // written in bf16: 4 + 4 + 2 bytes. The forward's float32 copy of the logits (4
    // more bytes per logit, beside the bf16 logits and the output) is gone too, but
    // the forward was not the peak.
    let logits = 4 * 64 * 4096;
    assert_eq!(before - after, logits * (4 - 2));
}
