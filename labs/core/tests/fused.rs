//! The fused kernels launched on tensors (`tensor::fused`): each step's values against
//! its rule written out on the host, and each bad operand refused in one line before
//! anything is launched.

use labs_core::tensor::fused::{
    adam_step, sgd_step, unscale_grad, update_scale, AdamHyper, ScaleRule, SgdHyper,
};
use labs_core::tensor::no_grad;
use labs_core::testing::test_device;
use labs_core::{DType, Tensor};

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            (*g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

fn refused(r: labs_core::Result<()>, words: &[&str]) {
    let e = r.unwrap_err().to_string();
    assert!(!e.contains('\n'), "not one line: {e}");
    for w in words {
        assert!(e.contains(w), "`{e}` does not name {w}");
    }
}

const HYPER: AdamHyper = AdamHyper {
    one_minus_beta1: 0.1,
    beta2: 0.999,
    one_minus_beta2: 0.001,
    step_size: 0.01,
    bias_correction2_sqrt: 0.5,
    eps: 1e-8,
    weight_decay: 0.1,
    param_decay: 1.0,
    lr: 1e-3,
};

#[test]
fn adam_step_follows_its_rule_and_refuses_bad_operands() {
    let d = test_device();
    let p0 = [1.0f32, -2.0, 0.5];
    let g0 = [0.5f32, 0.25, -1.0];
    let p = Tensor::from_slice(&p0, &[3], &d).unwrap();
    let g = Tensor::from_slice(&g0, &[3], &d).unwrap();
    let m = Tensor::from_slice(&[0.1f32, 0.0, 0.0], &[3], &d).unwrap();
    let v = Tensor::from_slice(&[0.0f32, 0.01, 0.0], &[3], &d).unwrap();
    adam_step(&p, &g, &m, &v, &HYPER).unwrap();
    let h = HYPER;
    let (mut pw, mut mw, mut vw) = (vec![], vec![], vec![]);
    for i in 0..3 {
        let (p, g) = (
            p0[i] as f64,
            g0[i] as f64 + h.weight_decay as f64 * p0[i] as f64,
        );
        let m = [0.1, 0.0, 0.0][i] + h.one_minus_beta1 as f64 * (g - [0.1, 0.0, 0.0][i]);
        let v = h.beta2 as f64 * [0.0, 0.01, 0.0][i] + h.one_minus_beta2 as f64 * g * g;
        let denom = v.sqrt() / h.bias_correction2_sqrt as f64 + h.eps as f64;
        pw.push(p - h.step_size as f64 * m / denom);
        mw.push(m);
        vw.push(v);
    }
    close(&p.to_vec::<f32>().unwrap(), &pw);
    close(&m.to_vec::<f32>().unwrap(), &mw);
    close(&v.to_vec::<f32>().unwrap(), &vw);

    let before = p.to_vec::<f32>().unwrap();
    let short = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    refused(
        adam_step(&p, &short, &m, &v, &HYPER),
        &["adam_step", "[3]", "[2]"],
    );
    let half = Tensor::zeros(&[3], DType::F16, &d).unwrap();
    refused(
        adam_step(&p, &half, &m, &v, &HYPER),
        &["adam_step", "float16"],
    );
    refused(
        adam_step(&half, &half, &m, &half, &HYPER),
        &["exp_avg_sq", "float32"],
    );
    let ints = Tensor::zeros(&[3], DType::I32, &d).unwrap();
    refused(
        adam_step(&ints, &ints, &m, &v, &HYPER),
        &["adam_step", "int32"],
    );
    let wide = Tensor::zeros(&[3, 2], DType::F32, &d).unwrap();
    let t = wide.transpose(0, 1).unwrap();
    let m2 = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    refused(adam_step(&t, &m2, &m2, &m2, &HYPER), &["not contiguous"]);
    let leaf = Tensor::zeros(&[3], DType::F32, &d)
        .unwrap()
        .requires_grad_(true);
    refused(
        adam_step(&leaf, &g, &m, &v, &HYPER),
        &["adam_step", "no_grad"],
    );
    assert_eq!(p.to_vec::<f32>().unwrap(), before, "a refused step wrote");
    let _off = no_grad();
    adam_step(&leaf, &g, &m, &v, &HYPER).unwrap();
}

#[test]
fn sgd_step_follows_its_rule_and_needs_a_buffer_for_momentum() {
    let d = test_device();
    let p = Tensor::from_slice(&[1.0f32, -2.0], &[2], &d).unwrap();
    let g = Tensor::from_slice(&[0.5f32, 4.0], &[2], &d).unwrap();
    let plain = SgdHyper {
        lr: 0.5,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first: false,
    };
    sgd_step(&p, &g, None, &plain).unwrap();
    close(&p.to_vec::<f32>().unwrap(), &[0.75, -4.0]);

    let momentum = SgdHyper {
        momentum: 0.9,
        first: true,
        ..plain
    };
    refused(
        sgd_step(&p, &g, None, &momentum),
        &["sgd_step", "momentum buffer"],
    );
    let buf = Tensor::full(&[2], 7.0f32, &d).unwrap();
    sgd_step(&p, &g, Some(&buf), &momentum).unwrap();
    // The first step: the buffer becomes the gradient, and the step is along it.
    close(&buf.to_vec::<f32>().unwrap(), &[0.5, 4.0]);
    close(&p.to_vec::<f32>().unwrap(), &[0.5, -6.0]);
    let again = SgdHyper {
        first: false,
        ..momentum
    };
    sgd_step(&p, &g, Some(&buf), &again).unwrap();
    close(&buf.to_vec::<f32>().unwrap(), &[0.95, 7.6]);
    close(&p.to_vec::<f32>().unwrap(), &[0.025, -9.8]);

    let small = Tensor::zeros(&[1], DType::F32, &d).unwrap();
    refused(
        sgd_step(&p, &g, Some(&small), &again),
        &["sgd_step", "[2]", "[1]"],
    );
}

#[test]
fn the_scaler_kernels_unscale_flag_and_update_on_the_device() {
    let d = test_device();
    let grad = Tensor::from_slice(&[2.0f32, 4.0], &[2], &d).unwrap();
    let scale = Tensor::full(&[], 2.0f32, &d).unwrap();
    let found_inf = Tensor::zeros(&[1], DType::F32, &d).unwrap();
    unscale_grad(&grad, &found_inf, &scale).unwrap();
    assert_eq!(grad.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    assert_eq!(found_inf.item::<f32>().unwrap(), 0.0);
    let bad = Tensor::from_slice(&[f32::INFINITY, 1.0], &[2], &d).unwrap();
    unscale_grad(&bad, &found_inf, &scale).unwrap();
    assert_eq!(found_inf.item::<f32>().unwrap(), 1.0);

    let tracker = Tensor::zeros(&[], DType::I32, &d).unwrap();
    let rule = ScaleRule {
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 2,
    };
    update_scale(&scale, &tracker, &found_inf, &rule).unwrap();
    assert_eq!(scale.item::<f32>().unwrap(), 1.0);
    assert_eq!(tracker.item::<i32>().unwrap(), 0);
    let clear = Tensor::zeros(&[1], DType::F32, &d).unwrap();
    update_scale(&scale, &tracker, &clear, &rule).unwrap();
    assert_eq!(
        (scale.item::<f32>().unwrap(), tracker.item::<i32>().unwrap()),
        (1.0, 1)
    );
    update_scale(&scale, &tracker, &clear, &rule).unwrap();
    assert_eq!(
        (scale.item::<f32>().unwrap(), tracker.item::<i32>().unwrap()),
        (2.0, 0)
    );

    let two = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    refused(
        unscale_grad(&grad, &two, &scale),
        &["unscale_grad", "found_inf", "one float32 element"],
    );
    refused(
        update_scale(&scale, &clear, &clear, &rule),
        &["update_scale", "growth_tracker", "int32"],
    );
    let ints = Tensor::zeros(&[2], DType::I32, &d).unwrap();
    refused(
        unscale_grad(&ints, &clear, &scale),
        &["unscale_grad", "int32"],
    );
}
