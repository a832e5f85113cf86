//! The copies, scatters and casts a training step launches, counted per kernel family
//! by the profiler, and the paths that avoid them checked against host arithmetic:
//! gradients of a tensor's parts written into one buffer, matmul gradients in their
//! operand's layout, sums over leading dimensions read in place, casts that keep a
//! transposed view's strides.
//!
//! The profiler counts every launch of the process, so the tests run one at a time.

use std::collections::HashMap;

use half::bf16;
use labs_base::testing::serial;
use labs_device::device::profile;
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{sdpa_kernel, Gpt2, Gpt2Config, Rng, SdpaBackend};
use labs_tensor::tensor::{autocast, set_attention_path, AttentionPath};
use labs_tensor::{DType, Tensor};

/// Launches per kernel family (the label's first word) while `f` runs.
fn launches(f: impl FnOnce()) -> HashMap<String, u64> {
    profile::take().unwrap();
    profile::start();
    f();
    profile::stop();
    let mut families = HashMap::new();
    for row in profile::take().unwrap() {
        let family = row.label.split(' ').next().unwrap_or("").to_string();
        *families.entry(family).or_insert(0) += row.launches;
    }
    families
}

fn count(families: &HashMap<String, u64>, family: &str) -> u64 {
    families.get(family).copied().unwrap_or(0)
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) * scale)
        .collect()
}

fn gpt2(layers: usize, device: &Device) -> Gpt2 {
    let config = Gpt2Config {
        vocab: 64,
        n_positions: 16,
        d_model: 32,
        n_layer: layers,
        n_head: 4,
        dropout: 0.0,
    };
    Gpt2::new(config, &mut Rng::seeded(1), device).unwrap()
}

/// One forward and backward of a GPT-2 of `layers` blocks (under bf16 autocast when
/// asked), returning the launches per family.
fn gpt2_step(layers: usize, amp: bool, device: &Device) -> HashMap<String, u64> {
    let model = gpt2(layers, device);
    let tokens: Vec<i64> = (0..2 * 16).map(|i| (i * 7 % 64) as i64).collect();
    let idx = Tensor::from_slice(&tokens, &[2, 16], device).unwrap();
    let targets: Vec<i64> = tokens.iter().map(|t| (t + 1) % 64).collect();
    let targets = Tensor::from_slice(&targets, &[2, 16], device).unwrap();
    // Fused attention, as a training step runs it (lab 10's default), by its single
    // kernels: the chunked path's own copies of small batches' heads are counted in
    // attention_chunked.rs; here only what surrounds attention is.
    let _fused = sdpa_kernel(SdpaBackend::Fused);
    let path = set_attention_path(Some(AttentionPath::Fused));
    let counted = launches(|| {
        let loss = {
            let _region = amp.then(|| autocast(DType::BF16).unwrap());
            model.loss(&idx, &targets).unwrap()
        };
        loss.backward().unwrap();
        device.synchronize().unwrap();
    });
    set_attention_path(path);
    counted
}

#[test]
fn a_gpt2_step_copies_nothing_and_scatters_only_the_query_key_value_gradients() {
    let _serial = serial();
    let d = test_device();
    for amp in [false, true] {
        let one = gpt2_step(1, amp, &d);
        let two = gpt2_step(2, amp, &d);
        let per_block = |family: &str| count(&two, family) - count(&one, family);
        // No dense copy anywhere: weight gradients come out dense, bias gradients are
        // summed in place, the tied head's weight is cast as it lies.
        assert_eq!(count(&two, "StridedCopy"), 0, "amp {amp}: {two:?}");
        // Query, key and value: one write each into the block's one buffer.
        assert_eq!(per_block("StridedScatter"), 3, "amp {amp}: {two:?}");
        assert_eq!(count(&one, "StridedScatter"), 3, "amp {amp}: {one:?}");
        if amp {
            // Per block: forward, the two LayerNorm outputs, 4 weights and 4 biases cast
            // to bfloat16; backward, each of those cast back, and the two bfloat16
            // residual branches' gradients cast to their dtype. The residual adds
            // themselves (float32 + bfloat16) read each operand in its dtype: no cast.
            assert_eq!(per_block("Cast"), 22, "{two:?}");
            assert_eq!(per_block("MixedBinary"), 2, "{two:?}");
        } else {
            assert_eq!(count(&two, "Cast"), 0, "{two:?}");
            assert_eq!(count(&two, "MixedBinary"), 0, "{two:?}");
        }
    }
}

/// The host reference of `narrow`'s gradient: `g` in its place, zeros around.
fn placed(full: &[usize], dim: usize, start: usize, g: &Tensor) -> Vec<f32> {
    let gs = g.shape().to_vec();
    let gv = g.to_vec::<f32>().unwrap();
    let mut out = vec![0.0f32; full.iter().product()];
    let inner: usize = full[dim + 1..].iter().product();
    let outer: usize = full[..dim].iter().product();
    for o in 0..outer {
        for i in 0..gs[dim] {
            for j in 0..inner {
                out[(o * full[dim] + start + i) * inner + j] = gv[(o * gs[dim] + i) * inner + j];
            }
        }
    }
    out
}

#[test]
fn parts_of_one_tensor_get_exactly_their_gradients_overlapping_or_not() {
    let _serial = serial();
    let d = test_device();
    let shape = [2, 6, 3];
    let x = Tensor::from_slice(&ramp(36, 0.25), &shape, &d)
        .unwrap()
        .requires_grad_(true);
    let w = |n: usize, s: f32| Tensor::from_slice(&ramp(n, s), &[2, n / 6, 3], &d).unwrap();
    // Three disjoint parts (the query/key/value case), one part overlapping them, and
    // the whole tensor: every kind of contribution to one gradient.
    let (wa, wb, wc, wo) = (w(12, 0.5), w(6, -1.0), w(18, 0.125), w(18, 2.0));
    let loss = x
        .narrow(1, 0, 2)
        .unwrap()
        .mul(&wa)
        .unwrap()
        .sum_all()
        .unwrap()
        .add(
            &x.narrow(1, 5, 1)
                .unwrap()
                .mul(&wb)
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap()
        .add(
            &x.narrow(1, 2, 3)
                .unwrap()
                .mul(&wc)
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap()
        .add(
            &x.narrow(1, 1, 3)
                .unwrap()
                .mul(&wo)
                .unwrap()
                .sum_all()
                .unwrap(),
        )
        .unwrap()
        .add(&x.mul(&x).unwrap().sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap();
    let mut expected: Vec<f32> = x.to_vec::<f32>().unwrap().iter().map(|v| 2.0 * v).collect();
    for (start, g) in [(0, &wa), (5, &wb), (2, &wc), (1, &wo)] {
        for (e, p) in expected.iter_mut().zip(placed(&shape, 1, start, g)) {
            *e += p;
        }
    }
    let grad = x.grad().unwrap();
    assert!(grad.is_contiguous());
    let got = grad.to_vec::<f32>().unwrap();
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (g - e).abs() <= 1e-5 * e.abs().max(1.0),
            "at {i}: {g} vs {e}"
        );
    }

    // A leaf whose gradient is already there (a second micro-batch) adds to it.
    let parts = |x: &Tensor| {
        let [a, b] = [x.narrow(0, 0, 1).unwrap(), x.narrow(0, 1, 1).unwrap()];
        a.scale(3.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .add(&b.scale(-2.0).unwrap().sum_all().unwrap())
            .unwrap()
    };
    let y = Tensor::from_slice(&ramp(6, 1.0), &[2, 3], &d)
        .unwrap()
        .requires_grad_(true);
    parts(&y).backward().unwrap();
    parts(&y).backward().unwrap();
    assert_eq!(
        y.grad().unwrap().to_vec::<f32>().unwrap(),
        [6.0, 6.0, 6.0, -4.0, -4.0, -4.0]
    );
}

#[test]
fn parts_of_a_packed_weight_are_written_in_place_one_scatter_each() {
    let _serial = serial();
    let d = test_device();
    let w = Tensor::from_slice(&ramp(12 * 4, 0.1), &[12, 4], &d)
        .unwrap()
        .requires_grad_(true);
    let x = Tensor::from_slice(&ramp(5 * 4, 0.3), &[5, 4], &d).unwrap();
    // The three products side by side, [5, 12]; the gradient of part i is i + 1.
    let g: Vec<f32> = (0..5 * 12).map(|j| ((j % 12) / 4 + 1) as f32).collect();
    let g = Tensor::from_slice(&g, &[5, 12], &d).unwrap();
    let families = launches(|| {
        let ys: Vec<Tensor> = (0..3)
            .map(|i| x.linear(&w.narrow(0, 4 * i, 4).unwrap(), None).unwrap())
            .collect();
        let y = Tensor::cat(&ys.iter().collect::<Vec<_>>(), 1).unwrap();
        y.backward_with(Some(g.clone()), false).unwrap();
    });
    // Three writes of `cat`'s forward, then one per part into the weight's gradient
    // (a cat of zeros around each part took seven, and two full-size additions).
    assert_eq!(count(&families, "StridedScatter"), 6, "{families:?}");
    assert_eq!(count(&families, "Binary"), 0, "{families:?}");
    assert_eq!(count(&families, "StridedCopy"), 0, "{families:?}");
    // d/dW_i of the part whose gradient is i + 1 everywhere: (i + 1) * column sums of x.
    let xs = x.to_vec::<f32>().unwrap();
    let colsum: Vec<f64> = (0..4)
        .map(|c| (0..5).map(|r| xs[r * 4 + c] as f64).sum())
        .collect();
    let g = w.grad().unwrap();
    assert!(g.is_contiguous());
    for (i, v) in g.to_vec::<f32>().unwrap().iter().enumerate() {
        let e = ((i / 16) + 1) as f64 * colsum[i % 4];
        assert!((*v as f64 - e).abs() < 1e-5, "at {i}: {v} vs {e}");
    }
}

#[test]
fn matmul_gradients_follow_their_operands_layout() {
    let _serial = serial();
    let d = test_device();
    let (m, k, n) = (3, 4, 5);
    let a = Tensor::from_slice(&ramp(m * k, 0.5), &[m, k], &d)
        .unwrap()
        .requires_grad_(true);
    let w = Tensor::from_slice(&ramp(n * k, 0.25), &[n, k], &d)
        .unwrap()
        .requires_grad_(true);
    // `a` used through its transpose too: both operands column-major.
    let at = Tensor::from_slice(&ramp(m * k, -0.5), &[k, m], &d)
        .unwrap()
        .requires_grad_(true);
    let g = Tensor::from_slice(&ramp(m * n, 1.0), &[m, n], &d).unwrap();
    let families = launches(|| {
        let y = a.matmul(&w.transpose(0, 1).unwrap()).unwrap();
        let y2 = at
            .transpose(0, 1)
            .unwrap()
            .matmul(&w.transpose(0, 1).unwrap())
            .unwrap();
        y.add(&y2)
            .unwrap()
            .backward_with(Some(g.clone()), false)
            .unwrap();
    });
    assert_eq!(count(&families, "StridedCopy"), 0, "{families:?}");
    let (av, atv, wv, gv) = (
        a.to_vec::<f32>().unwrap(),
        at.to_vec::<f32>().unwrap(),
        w.to_vec::<f32>().unwrap(),
        g.to_vec::<f32>().unwrap(),
    );
    // y = (a + atᵀ) wᵀ: dw = gᵀ (a + atᵀ), da = g w, dat = (g w)ᵀ.
    let sum = |i: usize, c: usize| av[i * k + c] as f64 + atv[c * m + i] as f64;
    let gw = |i: usize, c: usize| {
        (0..n)
            .map(|j| gv[i * n + j] as f64 * wv[j * k + c] as f64)
            .sum::<f64>()
    };
    let close = |got: &Tensor, want: &dyn Fn(usize) -> f64| {
        assert!(got.is_contiguous(), "a leaf's gradient is dense");
        for (i, v) in got.to_vec::<f32>().unwrap().iter().enumerate() {
            assert!(
                (*v as f64 - want(i)).abs() < 1e-4,
                "at {i}: {v} vs {}",
                want(i)
            );
        }
    };
    close(&w.grad().unwrap(), &|i| {
        let (j, c) = (i / k, i % k);
        (0..m).map(|r| gv[r * n + j] as f64 * sum(r, c)).sum()
    });
    close(&a.grad().unwrap(), &|i| gw(i / k, i % k));
    close(&at.grad().unwrap(), &|i| gw(i % m, i / m));
}

#[test]
fn sums_over_leading_dimensions_read_in_place() {
    let _serial = serial();
    let d = test_device();
    let (b, t, e) = (3, 5, 7);
    let values = ramp(b * t * e, 0.125);
    for dtype in [DType::F32, DType::BF16] {
        let x = Tensor::from_slice(&values, &[b, t, e], &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let host: Vec<f64> = x
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mut sums = None;
        let families = launches(|| sums = Some(x.sum_dims(&[0, 1], false).unwrap()));
        assert_eq!(count(&families, "StridedCopy"), 0, "{families:?}");
        let sums = sums.unwrap();
        assert_eq!(sums.shape(), [e]);
        let mean = x.mean_dims(&[0], true).unwrap();
        assert_eq!(mean.shape(), [1, t, e]);
        let got = sums.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let got_mean = mean.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        for c in 0..e {
            let want: f64 = (0..b * t).map(|r| host[r * e + c]).sum();
            assert!(
                (got[c] as f64 - want).abs() <= tol * want.abs().max(1.0),
                "{dtype} column {c}"
            );
        }
        for (i, v) in got_mean.iter().enumerate() {
            let want: f64 = (0..b).map(|r| host[r * t * e + i]).sum::<f64>() / b as f64;
            assert!(
                (*v as f64 - want).abs() <= tol * want.abs().max(1.0),
                "{dtype} mean {i}"
            );
        }
    }
}

#[test]
fn a_cast_keeps_a_transposed_views_strides_and_copies_nothing() {
    let _serial = serial();
    let d = test_device();
    let m = Tensor::from_slice(&ramp(12, 0.5), &[3, 4], &d).unwrap();
    let t = m.transpose(0, 1).unwrap();
    let mut cast = None;
    let families = launches(|| cast = Some(t.to_dtype(DType::BF16).unwrap()));
    let cast = cast.unwrap();
    assert_eq!(count(&families, "StridedCopy"), 0, "{families:?}");
    assert_eq!(count(&families, "Cast"), 1, "{families:?}");
    assert_eq!((cast.shape(), cast.strides()), (&[4, 3][..], &[1, 4][..]));
    let want: Vec<bf16> = t
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    assert_eq!(cast.to_vec::<bf16>().unwrap(), want);
    // A view that is not a reordering of dense memory is gathered first, as before.
    let cols = m.narrow(1, 1, 2).unwrap();
    let c = cols.to_dtype(DType::BF16).unwrap();
    assert!(c.is_contiguous());
    assert_eq!(
        c.to_vec::<bf16>().unwrap(),
        cols.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect::<Vec<_>>()
    );
    // Its gradient goes back through the same strides.
    let leaf = Tensor::from_slice(&ramp(12, 0.5), &[3, 4], &d)
        .unwrap()
        .requires_grad_(true);
    let y = leaf.transpose(0, 1).unwrap().to_dtype(DType::BF16).unwrap();
    y.to_dtype(DType::F32)
        .unwrap()
        .scale(2.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(leaf.grad().unwrap().to_vec::<f32>().unwrap(), vec![2.0; 12]);
}
