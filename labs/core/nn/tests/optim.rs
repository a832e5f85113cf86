//! Optimizers against host float64 references of PyTorch's update rules over three
//! steps (weight decay, momentum, Nesterov, bias correction, decoupled decay), lazy
//! state, zero_grad, half-precision parameters, an MLP whose loss falls, and memory
//! back to its baseline once model and optimizer are dropped.

use half::f16;
use labs_base::testing::{assert_close, serial};
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{Mlp, Module, Rng};
use labs_nn::optim::{Adam, AdamW, Optimizer, Sgd};
use labs_tensor::Tensor;

/// Gives the leaf `p` the gradient `g` (the backward of `sum(p * g)`), replacing any.
fn set_grad(p: &Tensor, g: &[f32], device: &Device) {
    p.clear_grad();
    let g = Tensor::from_slice(g, p.shape(), device).unwrap();
    p.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
}

const N: usize = 7;

fn start() -> (Vec<f32>, [Vec<f32>; 3]) {
    let mut rng = Rng::seeded(5);
    let p = rng.uniform(N, 1.0);
    let g = [
        rng.uniform(N, 1.0),
        rng.uniform(N, 0.5),
        rng.uniform(N, 2.0),
    ];
    (p, g)
}

/// Runs three steps of `opt` over one parameter with the gradients of `start()`,
/// checking against `reference` (which updates the float64 parameter in place).
fn three_steps(
    make: impl Fn(Vec<Tensor>) -> Box<dyn Optimizer>,
    mut reference: impl FnMut(&mut [f64], &[f64]),
    what: &str,
) {
    let device = test_device();
    let (p0, grads) = start();
    let p = Tensor::from_slice(&p0, &[N], &device)
        .unwrap()
        .requires_grad_(true);
    let mut opt = make(vec![p.clone()]);
    let mut want: Vec<f64> = p0.iter().map(|&v| v as f64).collect();
    for (step, g) in grads.iter().enumerate() {
        set_grad(&p, g, &device);
        opt.step().unwrap();
        let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
        reference(&mut want, &g64);
        assert_close(
            &format!("{what} step {}", step + 1),
            &p.to_vec::<f32>().unwrap(),
            &want,
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn sgd_follows_pytorchs_rule() {
    let _serial = serial();
    // Plain SGD with weight decay: p -= lr (g + wd p).
    three_steps(
        |ps| {
            let mut o = Sgd::new(ps, 0.1);
            o.weight_decay = 0.05;
            Box::new(o)
        },
        |p, g| {
            for i in 0..N {
                p[i] -= 0.1 * (g[i] + 0.05 * p[i]);
            }
        },
        "sgd",
    );
    // Momentum with dampening: buf = d at the first step, then m buf + (1 - damp) d.
    for nesterov in [false, true] {
        let mut buf: Option<Vec<f64>> = None;
        let (lr, m, damp, wd) = (0.05, 0.9, if nesterov { 0.0 } else { 0.3 }, 0.01);
        three_steps(
            |ps| {
                let mut o = Sgd::new(ps, lr).momentum(m);
                o.dampening = damp;
                o.weight_decay = wd;
                o.nesterov = nesterov;
                Box::new(o)
            },
            |p, g| {
                let d: Vec<f64> = (0..N).map(|i| g[i] + wd * p[i]).collect();
                let b: Vec<f64> = match &buf {
                    None => d.clone(),
                    Some(b) => (0..N).map(|i| m * b[i] + (1.0 - damp) * d[i]).collect(),
                };
                for i in 0..N {
                    let step = if nesterov { d[i] + m * b[i] } else { b[i] };
                    p[i] -= lr * step;
                }
                buf = Some(b);
            },
            &format!("sgd momentum nesterov={nesterov}"),
        );
    }
}

/// The float64 reference of Adam (`decoupled`: AdamW) over one parameter.
fn adam_reference(
    lr: f64,
    (b1, b2): (f64, f64),
    eps: f64,
    wd: f64,
    decoupled: bool,
) -> impl FnMut(&mut [f64], &[f64]) {
    let (mut m, mut v, mut t) = (vec![0.0; N], vec![0.0; N], 0);
    move |p, g| {
        t += 1;
        for i in 0..N {
            let mut g = g[i];
            if decoupled {
                p[i] *= 1.0 - lr * wd;
            } else {
                g += wd * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let mhat = m[i] / (1.0 - b1.powi(t));
            let vhat = v[i] / (1.0 - b2.powi(t));
            p[i] -= lr * mhat / (vhat.sqrt() + eps);
        }
    }
}

#[test]
fn adam_and_adamw_follow_pytorchs_rules() {
    let _serial = serial();
    three_steps(
        |ps| Box::new(Adam::new(ps, 0.01)),
        adam_reference(0.01, (0.9, 0.999), 1e-8, 0.0, false),
        "adam",
    );
    // L2 penalty, other betas, a large eps (so that it matters).
    three_steps(
        |ps| {
            let mut o = Adam::new(ps, 0.05);
            o.betas = (0.8, 0.95);
            o.eps = 1e-3;
            o.weight_decay = 0.1;
            Box::new(o)
        },
        adam_reference(0.05, (0.8, 0.95), 1e-3, 0.1, false),
        "adam with weight decay",
    );
    three_steps(
        |ps| {
            let mut o = AdamW::new(ps, 0.05);
            o.weight_decay = 0.2;
            Box::new(o)
        },
        adam_reference(0.05, (0.9, 0.999), 1e-8, 0.2, true),
        "adamw",
    );
    // Capturable (the step count on the device, the bias corrections from it in
    // float32): the same rules.
    three_steps(
        |ps| {
            let mut o = AdamW::new(ps, 0.05);
            o.weight_decay = 0.2;
            o.capturable = true;
            Box::new(o)
        },
        adam_reference(0.05, (0.9, 0.999), 1e-8, 0.2, true),
        "capturable adamw",
    );
    three_steps(
        |ps| {
            let mut o = Adam::new(ps, 0.05);
            o.betas = (0.8, 0.95);
            o.eps = 1e-3;
            o.weight_decay = 0.1;
            o.capturable = true;
            Box::new(o)
        },
        adam_reference(0.05, (0.8, 0.95), 1e-3, 0.1, false),
        "capturable adam with weight decay",
    );
    // AdamW's default decay is 0.01 and is decoupled.
    let device = test_device();
    let p = Tensor::zeros(&[1], labs_tensor::DType::F32, &device).unwrap();
    let w = AdamW::new(vec![p], 1e-3);
    assert!(w.is_decoupled() && w.weight_decay == 0.01);
}

#[test]
fn state_appears_at_the_first_step_and_skips_parameters_without_grad() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let a = Tensor::from_slice(&[1.0f32; 1024], &[1024], &device)
        .unwrap()
        .requires_grad_(true);
    let b = Tensor::from_slice(&[2.0f32; 16], &[16], &device)
        .unwrap()
        .requires_grad_(true);
    set_grad(&a, &[0.5; 1024], &device);
    let base = alloc.memory_allocated();
    let mut opt = Adam::new(vec![a.clone(), b.clone()], 0.1);
    assert_eq!(alloc.memory_allocated(), base, "no state before step 1");
    opt.step().unwrap();
    assert!(
        alloc.memory_allocated() >= base + 2 * 1024 * 4,
        "exp_avg and exp_avg_sq of `a` at step 1"
    );
    let s = opt.state(0).expect("a's state");
    assert_eq!(s.step, 1);
    // Counted as optimizer state, as PyTorch's memory profiler would.
    use labs_alloc::alloc::Category;
    assert_eq!(s.exp_avg.category().unwrap(), Category::OptimizerState);
    assert_eq!(s.exp_avg_sq.category().unwrap(), Category::OptimizerState);
    assert_eq!(a.grad().unwrap().category().unwrap(), Category::Gradient);
    assert!(opt.state(1).is_none(), "b had no gradient: no state");
    assert_eq!(b.to_vec::<f32>().unwrap(), [2.0; 16], "b untouched");
    // The first Adam step moves every element by lr (m̂ / sqrt(v̂) = ±1).
    assert!(a
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&v| (v - 0.9).abs() < 1e-6));
    // zero_grad(false) zeroes in place; zero_grad(true) drops.
    opt.zero_grad(false).unwrap();
    assert_eq!(a.grad().unwrap().to_vec::<f32>().unwrap(), [0.0; 1024]);
    opt.zero_grad(true).unwrap();
    assert!(a.grad().is_none());
    // SGD without momentum keeps no state; with momentum, a buffer per parameter.
    let mut sgd = Sgd::new(vec![a.clone()], 0.1);
    set_grad(&a, &[1.0; 1024], &device);
    sgd.step().unwrap();
    assert!(sgd.momentum_buffer(0).is_none());
    let mut sgd = Sgd::new(vec![a.clone()], 0.1).momentum(0.9);
    sgd.step().unwrap();
    assert_eq!(
        sgd.momentum_buffer(0).unwrap().to_vec::<f32>().unwrap(),
        [1.0; 1024]
    );
    // Nesterov without momentum is refused, as PyTorch refuses it.
    let mut bad = Sgd::new(vec![a.clone()], 0.1);
    bad.nesterov = true;
    assert!(bad.step().is_err());
}

#[test]
fn half_precision_parameters_step_with_float32_state() {
    let _serial = serial();
    let device = test_device();
    let (p0, grads) = start();
    let h: Vec<f16> = p0.iter().map(|&v| f16::from_f32(v)).collect();
    let p = Tensor::from_slice(&h, &[N], &device)
        .unwrap()
        .requires_grad_(true);
    let mut opt = Adam::new(vec![p.clone()], 0.01);
    let mut reference = adam_reference(0.01, (0.9, 0.999), 1e-8, 0.0, false);
    let mut want: Vec<f64> = h.iter().map(|v| v.to_f64()).collect();
    for g in &grads {
        let gh: Vec<f16> = g.iter().map(|&v| f16::from_f32(v)).collect();
        p.clear_grad();
        let gt = Tensor::from_slice(&gh, &[N], &device).unwrap();
        // The implicit seed of backward is float32 today: give a float16 one.
        let one = Tensor::full(&[], f16::ONE, &device).unwrap();
        let loss = p.mul(&gt).unwrap().sum_all().unwrap();
        loss.backward_with(Some(one), false).unwrap();
        opt.step().unwrap();
        let g64: Vec<f64> = gh.iter().map(|v| v.to_f64()).collect();
        reference(&mut want, &g64);
        // Rounded back to float16 each step: within a few float16 ulps.
        for (got, w) in p.to_vec::<f16>().unwrap().iter().zip(&want) {
            assert!(
                (got.to_f64() - w).abs() < 4e-3 * (1.0 + w.abs()),
                "{got} vs {w}"
            );
        }
        want = p
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect();
    }
    assert_eq!(
        opt.state(0).unwrap().exp_avg.dtype(),
        labs_tensor::DType::F32
    );
}

/// Mean squared error of `model(x)` against `y`.
fn mse(model: &dyn Module, x: &Tensor, y: &Tensor) -> Tensor {
    let d = model.forward(x).unwrap().sub(y).unwrap();
    d.mul(&d).unwrap().mean_all().unwrap()
}

#[test]
fn an_mlp_learns_a_tiny_problem_and_memory_returns_to_baseline() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let base = alloc.memory_allocated();
    {
        // y = sin-like target of two inputs, 32 points.
        let mut rng = Rng::seeded(9);
        let xs = rng.uniform(32 * 2, 1.0);
        let ys: Vec<f32> = xs
            .chunks(2)
            .map(|p| (2.0 * p[0]).tanh() - 0.5 * p[1] * p[1])
            .collect();
        let x = Tensor::from_slice(&xs, &[32, 2], &device).unwrap();
        let y = Tensor::from_slice(&ys, &[32, 1], &device).unwrap();
        for make in [0, 1, 2] {
            let model = Mlp::new(&[2, 16, 1], &mut Rng::seeded(3), &device).unwrap();
            let mut opt: Box<dyn Optimizer> = match make {
                0 => Box::new(Adam::new(model.parameters(), 0.02)),
                1 => Box::new(AdamW::new(model.parameters(), 0.02)),
                _ => Box::new(Sgd::new(model.parameters(), 0.1).momentum(0.9)),
            };
            let first = mse(&model, &x, &y).to_vec::<f32>().unwrap()[0];
            let mut last = first;
            for _ in 0..100 {
                opt.zero_grad(true).unwrap();
                let loss = mse(&model, &x, &y);
                loss.backward().unwrap();
                opt.step().unwrap();
                last = loss.to_vec::<f32>().unwrap()[0];
            }
            assert!(
                last < first * 0.2,
                "optimizer {make}: loss {first} -> {last} did not fall"
            );
        }
    }
    assert_eq!(
        alloc.memory_allocated(),
        base,
        "model, optimizer state and gradients all freed"
    );
}

#[test]
fn a_tiny_transformer_learns_with_adamw_and_frees_everything() {
    use labs_nn::nn::{causal_mask, Embedding, Linear, TransformerConfig, TransformerEncoderLayer};
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let base = alloc.memory_allocated();
    {
        // Next-token prediction on one repeating sequence of 6 tokens (vocabulary 6):
        // an embedding, one encoder layer with a causal mask, a linear head.
        let rng = &mut Rng::seeded(12);
        let (vocab, d, len, batch) = (6, 16, 6, 4);
        let emb = Embedding::new(vocab, d, rng, &device).unwrap();
        let config = TransformerConfig {
            dim_feedforward: 32,
            dropout: 0.0,
            ..TransformerConfig::new(d, 2)
        };
        let layer = TransformerEncoderLayer::new(config, rng, &device).unwrap();
        let head = Linear::new(d, vocab, true, rng, &device).unwrap();
        let tokens: Vec<i64> = (0..batch * len)
            .map(|i| ((i % len) * 5 % vocab) as i64)
            .collect();
        let targets: Vec<i64> = (0..batch * len)
            .map(|i| (((i % len) + 1) * 5 % vocab) as i64)
            .collect();
        let x = Tensor::from_slice(&tokens, &[batch, len], &device).unwrap();
        let y = Tensor::from_slice(&targets, &[batch * len], &device).unwrap();
        let mask = causal_mask(len, &device).unwrap();
        let mut params = emb.parameters();
        params.extend(layer.parameters());
        params.extend(head.parameters());
        let mut opt = AdamW::new(params, 0.01);
        let loss_of = || {
            let h = layer
                .forward_masked(&emb.forward(&x).unwrap(), Some(&mask))
                .unwrap();
            let logits = head
                .forward(&h)
                .unwrap()
                .reshape(&[batch * len, vocab])
                .unwrap();
            logits.cross_entropy(&y, -100).unwrap()
        };
        let first = loss_of().to_vec::<f32>().unwrap()[0];
        let mut last = first;
        for _ in 0..40 {
            opt.zero_grad(true).unwrap();
            let loss = loss_of();
            loss.backward().unwrap();
            opt.step().unwrap();
            last = loss.to_vec::<f32>().unwrap()[0];
        }
        assert!(last < first * 0.3, "loss {first} -> {last} did not fall");
    }
    assert_eq!(alloc.memory_allocated(), base, "everything freed");
}
