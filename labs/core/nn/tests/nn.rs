//! `nn`: parameter names and counts as PyTorch gives them, Linear against a host
//! float64 reference, gradients through an MLP against finite differences, train/eval
//! and zero_grad, and safetensors: a bit-exact round trip for every dtype, state dicts,
//! and every error case. Runs on the simulated GPU by default and on the GPU with
//! `LABS_DEVICE=cuda`.

use half::{bf16, f16};
use labs_base::testing::serial;
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{self, Linear, Mlp, Module, Relu, Rng, Sequential};
use labs_tensor::tensor::no_grad;
use labs_tensor::testing::host;
use labs_tensor::{DType, Tensor};

fn names(m: &dyn Module) -> Vec<String> {
    m.named_parameters().into_iter().map(|(n, _)| n).collect()
}

/// A module with named children, as a user's `nn.Module` subclass with `fc1`, `fc2`.
struct TwoLayer {
    fc1: Linear,
    fc2: Linear,
    training: bool,
}

impl Module for TwoLayer {
    fn forward(&self, x: &Tensor) -> labs_base::Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
    fn visit_parameters(&self, prefix: &str, f: &mut dyn FnMut(String, &Tensor)) {
        self.fc1.visit_parameters(&nn::join(prefix, "fc1"), f);
        self.fc2.visit_parameters(&nn::join(prefix, "fc2"), f);
    }
    fn train(&mut self, mode: bool) {
        self.training = mode;
        self.fc1.train(mode);
        self.fc2.train(mode);
    }
    fn training(&self) -> bool {
        self.training
    }
}

#[test]
fn parameter_names_and_counts_are_pytorchs() {
    let device = test_device();
    let mut rng = Rng::seeded(0);
    // nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)): named_parameters()
    // gives 0.weight [8, 4], 0.bias [8], 2.weight [3, 8], 2.bias [3]; 67 in all.
    let mlp = Mlp::new(&[4, 8, 3], &mut rng, &device).unwrap();
    assert_eq!(names(&mlp), ["0.weight", "0.bias", "2.weight", "2.bias"]);
    let shapes: Vec<Vec<usize>> = mlp
        .parameters()
        .iter()
        .map(|p| p.shape().to_vec())
        .collect();
    assert_eq!(shapes, [vec![8, 4], vec![8], vec![3, 8], vec![3]]);
    assert_eq!(mlp.num_parameters(), 67);
    // nn.Linear(5, 3, bias=False): weight only, 15.
    let l = Linear::new(5, 3, false, &mut rng, &device).unwrap();
    assert_eq!(names(&l), ["weight"]);
    assert_eq!(l.num_parameters(), 15);
    // fc1 = nn.Linear(3, 6), fc2 = nn.Linear(6, 2): fc1.weight, fc1.bias, fc2.weight,
    // fc2.bias; 3*6 + 6 + 6*2 + 2 = 38.
    let two = TwoLayer {
        fc1: Linear::new(3, 6, true, &mut rng, &device).unwrap(),
        fc2: Linear::new(6, 2, true, &mut rng, &device).unwrap(),
        training: true,
    };
    assert_eq!(
        names(&two),
        ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    );
    assert_eq!(two.num_parameters(), 38);
    // Nested: nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), TwoLayer) gives
    // 0.0.weight, 0.0.bias, 1.fc1.weight, ...
    let nested = Sequential::new()
        .push(
            Sequential::new()
                .push(Linear::new(2, 2, true, &mut rng, &device).unwrap())
                .push(Relu::new()),
        )
        .push(two);
    assert_eq!(
        names(&nested),
        [
            "0.0.weight",
            "0.0.bias",
            "1.fc1.weight",
            "1.fc1.bias",
            "1.fc2.weight",
            "1.fc2.bias"
        ]
    );
    assert_eq!(nested.num_parameters(), 6 + 38);
    for p in nested.parameters() {
        assert!(p.requires_grad() && p.is_leaf());
        assert_eq!(
            p.category().unwrap(),
            labs_alloc::alloc::Category::Parameter
        );
    }
}

#[test]
fn linear_init_is_kaiming_uniform_and_reproducible() {
    let device = test_device();
    let a = Linear::new(16, 4, true, &mut Rng::seeded(7), &device).unwrap();
    let b = Linear::new(16, 4, true, &mut Rng::seeded(7), &device).unwrap();
    let c = Linear::new(16, 4, true, &mut Rng::seeded(8), &device).unwrap();
    let w = a.weight.to_vec::<f32>().unwrap();
    let bias = a.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
    let bound = 1.0 / 16f32.sqrt();
    assert!(w.iter().chain(&bias).all(|v| v.abs() <= bound));
    // Spread over the range, not clustered: some values beyond half the bound.
    assert!(w.iter().filter(|v| v.abs() > bound / 2.0).count() > 10);
    assert_eq!(w, b.weight.to_vec::<f32>().unwrap());
    assert_ne!(w, c.weight.to_vec::<f32>().unwrap());
    assert_eq!((a.in_features(), a.out_features()), (16, 4));
}

fn values(n: usize, rng: &mut Rng, scale: f32) -> Vec<f32> {
    rng.uniform(n, scale)
}

#[test]
fn linear_forward_matches_a_host_reference() {
    let device = test_device();
    let mut rng = Rng::seeded(3);
    let layer = Linear::new(5, 3, true, &mut rng, &device).unwrap();
    let w = layer.weight.to_vec::<f32>().unwrap();
    let b = layer.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
    for shape in [vec![4, 5], vec![2, 3, 5], vec![5]] {
        let n: usize = shape.iter().product();
        let x = values(n, &mut rng, 2.0);
        let y = layer
            .forward(&Tensor::from_slice(&x, &shape, &device).unwrap())
            .unwrap();
        let mut want_shape = shape.clone();
        *want_shape.last_mut().unwrap() = 3;
        assert_eq!(y.shape(), &want_shape[..]);
        let y = y.to_vec::<f32>().unwrap();
        for r in 0..n / 5 {
            for o in 0..3 {
                let want: f64 = b[o] as f64
                    + (0..5)
                        .map(|i| x[r * 5 + i] as f64 * w[o * 5 + i] as f64)
                        .sum::<f64>();
                let got = y[r * 3 + o] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "{shape:?} [{r}, {o}]: {got} vs {want}"
                );
            }
        }
    }
    let bad = Tensor::zeros(&[2, 4], DType::F32, &device).unwrap();
    let err = layer.forward(&bad).unwrap_err().to_string();
    assert!(err.contains("[2, 4]") && err.contains("[3, 5]"), "{err}");
}

/// An MLP `4 -> 6 -> 3` over given parameters (`[w1, b1, w2, b2]`).
fn mlp_of(params: &[Vec<f32>], device: &Device) -> Sequential {
    let t = |i: usize, shape: &[usize]| Tensor::from_slice(&params[i], shape, device).unwrap();
    Sequential::new()
        .push(Linear::from_parameters(t(0, &[6, 4]), Some(t(1, &[6]))).unwrap())
        .push(Relu::new())
        .push(Linear::from_parameters(t(2, &[3, 6]), Some(t(3, &[3]))).unwrap())
}

#[test]
fn mlp_gradients_match_finite_differences() {
    let _serial = serial();
    let device = test_device();
    let mut rng = Rng::seeded(11);
    let shapes: [&[usize]; 4] = [&[6, 4], &[6], &[3, 6], &[3]];
    let params: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| values(s.iter().product(), &mut rng, 0.8))
        .collect();
    let x = values(5 * 4, &mut rng, 1.5);
    let g = values(5 * 3, &mut rng, 1.0);
    let loss = |model: &Sequential, x: &Tensor| -> Tensor {
        let y = model.forward(x).unwrap();
        let g = Tensor::from_slice(&g, y.shape(), &device).unwrap();
        y.mul(&g).unwrap().sum_all().unwrap()
    };
    let model = mlp_of(&params, &device);
    let xt = Tensor::from_slice(&x, &[5, 4], &device)
        .unwrap()
        .requires_grad_(true);
    loss(&model, &xt).backward().unwrap();
    let eval = |params: &[Vec<f32>], x: &[f32]| -> f64 {
        let _off = no_grad();
        let model = mlp_of(params, &device);
        let x = Tensor::from_slice(x, &[5, 4], &device).unwrap();
        loss(&model, &x).to_vec::<f32>().unwrap()[0] as f64
    };
    let eps = 1e-2f32;
    let check = |name: &str, analytic: Vec<f32>, numeric: &dyn Fn(usize) -> f64| {
        for (i, a) in analytic.iter().enumerate() {
            let n = numeric(i);
            assert!(
                (*a as f64 - n).abs() < 2e-2 * (1.0 + n.abs()),
                "{name}[{i}]: backward {a}, finite differences {n}"
            );
        }
    };
    for (k, (name, p)) in model.named_parameters().into_iter().enumerate() {
        let analytic = p.grad().expect("a gradient").to_vec::<f32>().unwrap();
        assert_eq!(analytic.len(), params[k].len());
        check(&name, analytic, &|i| {
            let mut plus = params.to_vec();
            plus[k][i] += eps;
            let mut minus = params.to_vec();
            minus[k][i] -= eps;
            (eval(&plus, &x) - eval(&minus, &x)) / (2.0 * eps as f64)
        });
    }
    check("x", xt.grad().unwrap().to_vec::<f32>().unwrap(), &|i| {
        let mut plus = x.clone();
        plus[i] += eps;
        let mut minus = x.clone();
        minus[i] -= eps;
        (eval(&params, &plus) - eval(&params, &minus)) / (2.0 * eps as f64)
    });
    // zero_grad drops every gradient (set_to_none).
    model.zero_grad();
    assert!(model.parameters().iter().all(|p| p.grad().is_none()));
}

#[test]
fn train_and_eval_reach_every_child() {
    let device = test_device();
    let mut model = Mlp::new(&[2, 3, 3, 1], &mut Rng::seeded(1), &device).unwrap();
    assert!(model.training());
    model.eval();
    assert!(!model.training());
    assert!((0..model.len()).all(|i| !model.get(i).unwrap().training()));
    model.train(true);
    assert!((0..model.len()).all(|i| model.get(i).unwrap().training()));
    assert!(Mlp::new(&[3], &mut Rng::seeded(1), &device).is_err());
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("labs-nn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn save_then_load_is_bit_exact_for_every_dtype() {
    let device = test_device();
    let f: Vec<f32> = vec![1.5, -0.0, f32::MIN_POSITIVE, 3.0e38, -7.25, 1e-40];
    let tensors = vec![
        (
            "a.f32".to_string(),
            Tensor::from_slice(&f, &[2, 3], &device).unwrap(),
        ),
        (
            "b.f16".to_string(),
            Tensor::from_slice(
                &f.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(),
                &[3, 2],
                &device,
            )
            .unwrap(),
        ),
        (
            "c.bf16".to_string(),
            Tensor::from_slice(
                &f.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(),
                &[6],
                &device,
            )
            .unwrap(),
        ),
        (
            "d.i32".to_string(),
            Tensor::from_slice(&[i32::MIN, -1, 0, i32::MAX], &[4], &device).unwrap(),
        ),
        (
            "e.i64".to_string(),
            Tensor::from_slice(&[i64::MIN, 1 << 40, i64::MAX], &[3, 1], &device).unwrap(),
        ),
        (
            "f.u8".to_string(),
            Tensor::from_slice(&[0u8, 7, 255], &[3], &device).unwrap(),
        ),
        (
            // A strided view is saved as its elements in row-major order.
            "g.view".to_string(),
            Tensor::from_slice(&f, &[2, 3], &device)
                .unwrap()
                .transpose(0, 1)
                .unwrap(),
        ),
        (
            "h.scalar".to_string(),
            Tensor::from_slice(&[42.0f32], &[], &device).unwrap(),
        ),
    ];
    let path = temp_path("round_trip.safetensors");
    nn::save(&path, &tensors).unwrap();
    let loaded = nn::load(&path, &device).unwrap();
    assert_eq!(loaded.len(), tensors.len());
    for ((name, t), (lname, l)) in tensors.iter().zip(&loaded) {
        assert_eq!(name, lname, "sorted by name");
        assert_eq!((t.shape(), t.dtype()), (l.shape(), l.dtype()), "{name}");
        let bytes = |t: &Tensor| -> Vec<u8> {
            match t.dtype() {
                DType::F32 => t
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                DType::F16 => t
                    .to_vec::<f16>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                DType::BF16 => t
                    .to_vec::<bf16>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                DType::I32 => t
                    .to_vec::<i32>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                DType::I64 => t
                    .to_vec::<i64>()
                    .unwrap()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                DType::U8 => t.to_vec::<u8>().unwrap(),
            }
        };
        assert_eq!(bytes(t), bytes(l), "{name}");
    }
    // The file is what any safetensors reader expects: an 8-byte length, JSON naming
    // dtypes as the format does.
    let raw = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
    assert_eq!(header["b.f16"]["dtype"], "F16");
    assert_eq!(header["e.i64"]["shape"], serde_json::json!([3, 1]));
    let dup = vec![tensors[0].clone(), tensors[0].clone()];
    assert!(nn::save(temp_path("dup.safetensors"), &dup)
        .unwrap_err()
        .to_string()
        .contains("a.f32"));
}

#[test]
fn state_dict_round_trip_restores_a_model_in_place() {
    let device = test_device();
    let a = Mlp::new(&[3, 5, 2], &mut Rng::seeded(1), &device).unwrap();
    let b = Mlp::new(&[3, 5, 2], &mut Rng::seeded(2), &device).unwrap();
    let x = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 1.0, 0.0, -0.5], &[2, 3], &device).unwrap();
    let ya = a.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(ya, b.forward(&x).unwrap().to_vec::<f32>().unwrap());
    let path = temp_path("mlp.safetensors");
    nn::save(&path, &a.state_dict()).unwrap();
    let held = b.parameters(); // what an optimizer would hold
    b.load_state_dict(&nn::load(&path, &device).unwrap())
        .unwrap();
    assert_eq!(ya, b.forward(&x).unwrap().to_vec::<f32>().unwrap());
    // In place: the tensors held before see the loaded values.
    assert_eq!(
        held[0].to_vec::<f32>().unwrap(),
        a.parameters()[0].to_vec::<f32>().unwrap()
    );
    assert!(b.parameters()[0].requires_grad());
}

#[test]
fn loading_fails_clearly() {
    let device = test_device();
    let model = Mlp::new(&[3, 4, 2], &mut Rng::seeded(1), &device).unwrap();
    let before = model.parameters()[0].to_vec::<f32>().unwrap();
    let err = |r: labs_base::Result<()>| r.unwrap_err().to_string();

    // A missing file.
    let missing = temp_path("no-such-file.safetensors");
    let e = nn::load(&missing, &device).unwrap_err().to_string();
    assert!(e.contains("no-such-file.safetensors"), "{e}");

    // A malformed header: garbage, a length past the end, JSON that is not a header.
    let bad = temp_path("bad.safetensors");
    for bytes in [
        b"hello".to_vec(),
        [&1000u64.to_le_bytes()[..], b"{}"].concat(),
        [&4u64.to_le_bytes()[..], b"[1,2"].concat(),
    ] {
        std::fs::write(&bad, &bytes).unwrap();
        let e = nn::load(&bad, &device).unwrap_err().to_string();
        assert!(e.contains("not a valid safetensors file"), "{e}");
    }

    // A dtype the labs do not have (F64), written by hand.
    let header = br#"{"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
    let file = [&(header.len() as u64).to_le_bytes()[..], header, &[0u8; 8]].concat();
    std::fs::write(&bad, file).unwrap();
    let e = nn::load(&bad, &device).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("F64"), "{e}");

    let state = model.state_dict();
    // A missing key.
    let e = err(model.load_state_dict(&state[1..]));
    assert!(e.contains("missing key(s) [\"0.weight\"]"), "{e}");
    // An extra key.
    let mut extra = state.clone();
    extra.push(("3.weight".into(), state[0].1.clone()));
    let e = err(model.load_state_dict(&extra));
    assert!(e.contains("unexpected key(s) [\"3.weight\"]"), "{e}");
    // A shape mismatch names the key and both shapes.
    let mut shaped = state.clone();
    shaped[2].1 = Tensor::zeros(&[2, 5], DType::F32, &device).unwrap();
    let e = err(model.load_state_dict(&shaped));
    assert!(
        e.contains("2.weight") && e.contains("[2, 5]") && e.contains("[2, 4]"),
        "{e}"
    );
    // A dtype mismatch names the key and both dtypes.
    let mut typed = state.clone();
    typed[1].1 = Tensor::zeros(&[4], DType::F16, &device).unwrap();
    let e = err(model.load_state_dict(&typed));
    assert!(
        e.contains("0.bias") && e.contains("float16") && e.contains("float32"),
        "{e}"
    );
    // Nothing was copied by the failed loads.
    assert_eq!(model.parameters()[0].to_vec::<f32>().unwrap(), before);
}

#[test]
fn attention_and_transformer_layers_are_named_as_pytorch() {
    use labs_nn::nn::{
        Embedding, LayerNorm, MultiheadAttention, TransformerConfig, TransformerDecoderLayer,
        TransformerEncoderLayer,
    };
    let device = test_device();
    let rng = &mut Rng::seeded(4);
    // nn.MultiheadAttention(8, 2): in_proj_weight [24, 8], in_proj_bias [24],
    // out_proj.weight [8, 8], out_proj.bias [8]; 288.
    let mha = MultiheadAttention::new(8, 2, 0.0, rng, &device).unwrap();
    assert_eq!(
        names(&mha),
        [
            "in_proj_weight",
            "in_proj_bias",
            "out_proj.weight",
            "out_proj.bias"
        ]
    );
    assert_eq!(mha.num_parameters(), 288);
    assert_eq!(mha.in_proj_weight.shape(), [24, 8]);
    // Biases start at zero; the weight is Xavier-uniform, bounded by sqrt(6 / (8 + 24)).
    assert!(mha
        .in_proj_bias
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|&v| v == 0.0));
    let bound = (6.0f32 / 32.0).sqrt();
    assert!(mha
        .in_proj_weight
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .all(|v| v.abs() <= bound));
    assert!(MultiheadAttention::new(8, 3, 0.0, rng, &device).is_err());
    let config = TransformerConfig {
        dim_feedforward: 16,
        dropout: 0.0,
        ..TransformerConfig::new(8, 2)
    };
    // nn.TransformerEncoderLayer(8, 2, 16): 288 + 144 + 136 + 16 + 16 = 600.
    let enc = TransformerEncoderLayer::new(config, rng, &device).unwrap();
    assert_eq!(
        names(&enc),
        [
            "self_attn.in_proj_weight",
            "self_attn.in_proj_bias",
            "self_attn.out_proj.weight",
            "self_attn.out_proj.bias",
            "linear1.weight",
            "linear1.bias",
            "linear2.weight",
            "linear2.bias",
            "norm1.weight",
            "norm1.bias",
            "norm2.weight",
            "norm2.bias"
        ]
    );
    assert_eq!(enc.num_parameters(), 600);
    // nn.TransformerDecoderLayer(8, 2, 16): two attentions, three norms; 904.
    let dec = TransformerDecoderLayer::new(config, rng, &device).unwrap();
    let dec_names = names(&dec);
    assert_eq!(dec_names.len(), 18);
    assert_eq!(
        &dec_names[4..6],
        [
            "multihead_attn.in_proj_weight",
            "multihead_attn.in_proj_bias"
        ]
    );
    assert_eq!(&dec_names[16..], ["norm3.weight", "norm3.bias"]);
    assert_eq!(dec.num_parameters(), 904);
    // nn.Embedding(10, 6): weight, 60; nn.LayerNorm(6): weight, bias, 12.
    assert_eq!(
        names(&Embedding::new(10, 6, rng, &device).unwrap()),
        ["weight"]
    );
    let ln = LayerNorm::new(&[6], 1e-5, &device).unwrap();
    assert_eq!(
        (names(&ln), ln.num_parameters()),
        (vec!["weight".to_string(), "bias".to_string()], 12)
    );
}

#[test]
fn attention_matches_a_host_reference_and_a_causal_mask_hides_the_future() {
    use labs_nn::nn::{causal_mask, MultiheadAttention};
    let device = test_device();
    let rng = &mut Rng::seeded(21);
    let (b, l, e, h) = (2, 3, 4, 2);
    let d = e / h;
    let mha = MultiheadAttention::from_parameters(
        h,
        0.0,
        Tensor::from_slice(&rng.uniform(3 * e * e, 0.7), &[3 * e, e], &device).unwrap(),
        Tensor::from_slice(&rng.uniform(3 * e, 0.3), &[3 * e], &device).unwrap(),
        Linear::new(e, e, true, rng, &device).unwrap(),
    )
    .unwrap();
    let x = rng.uniform(b * l * e, 1.0);
    let xt = Tensor::from_slice(&x, &[b, l, e], &device).unwrap();
    let (w_in, b_in) = (host(&mha.in_proj_weight), host(&mha.in_proj_bias));
    let (w_out, b_out) = (
        host(&mha.out_proj.weight),
        host(mha.out_proj.bias.as_ref().unwrap()),
    );
    // The reference: per batch, per head, softmax(q k^T / sqrt(d) + mask) v, then out_proj.
    let reference = |causal: bool| -> Vec<f64> {
        let proj = |bi: usize, t: usize, block: usize, j: usize| -> f64 {
            let r = block * e + j;
            b_in[r]
                + (0..e)
                    .map(|i| w_in[r * e + i] * x[(bi * l + t) * e + i] as f64)
                    .sum::<f64>()
        };
        let mut out = vec![0.0; b * l * e];
        for bi in 0..b {
            let mut heads = vec![0.0; l * e];
            for hd in 0..h {
                for t in 0..l {
                    let scores: Vec<f64> = (0..l)
                        .map(|s| {
                            if causal && s > t {
                                return f64::NEG_INFINITY;
                            }
                            (0..d)
                                .map(|j| proj(bi, t, 0, hd * d + j) * proj(bi, s, 1, hd * d + j))
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for j in 0..d {
                        heads[t * e + hd * d + j] = (0..l)
                            .map(|s| (scores[s] - max).exp() / z * proj(bi, s, 2, hd * d + j))
                            .sum();
                    }
                }
            }
            for t in 0..l {
                for o in 0..e {
                    out[(bi * l + t) * e + o] = b_out[o]
                        + (0..e)
                            .map(|i| w_out[o * e + i] * heads[t * e + i])
                            .sum::<f64>();
                }
            }
        }
        out
    };
    for causal in [false, true] {
        let mask = causal_mask(l, &device).unwrap();
        let y = mha.attend(&xt, &xt, &xt, causal.then_some(&mask)).unwrap();
        assert_eq!(y.shape(), [b, l, e]);
        for (i, (got, want)) in host(&y).iter().zip(reference(causal)).enumerate() {
            assert!(
                (got - want).abs() < 1e-5,
                "causal={causal} [{i}]: {got} vs {want}"
            );
        }
    }
}

#[test]
fn attention_gradients_match_finite_differences() {
    use labs_nn::nn::{causal_mask, MultiheadAttention};
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(5);
    let mha = MultiheadAttention::new(4, 2, 0.0, rng, &device).unwrap();
    let x = rng.uniform(2 * 3 * 4, 1.0);
    let g = rng.uniform(2 * 3 * 4, 1.0);
    let mask = causal_mask(3, &device).unwrap();
    let loss = |x: &Tensor| -> Tensor {
        let y = mha.attend(x, x, x, Some(&mask)).unwrap();
        let g = Tensor::from_slice(&g, y.shape(), &device).unwrap();
        y.mul(&g).unwrap().sum_all().unwrap()
    };
    let xt = Tensor::from_slice(&x, &[2, 3, 4], &device)
        .unwrap()
        .requires_grad_(true);
    loss(&xt).backward().unwrap();
    let eval = |x: &[f32]| -> f64 {
        let _off = no_grad();
        let x = Tensor::from_slice(x, &[2, 3, 4], &device).unwrap();
        loss(&x).to_vec::<f32>().unwrap()[0] as f64
    };
    let eps = 1e-2f32;
    let analytic = xt.grad().unwrap().to_vec::<f32>().unwrap();
    for i in 0..x.len() {
        let (mut plus, mut minus) = (x.clone(), x.clone());
        plus[i] += eps;
        minus[i] -= eps;
        let numeric = (eval(&plus) - eval(&minus)) / (2.0 * eps as f64);
        assert!(
            (analytic[i] as f64 - numeric).abs() < 1e-2 * (1.0 + numeric.abs()),
            "x[{i}]: backward {}, finite differences {numeric}",
            analytic[i]
        );
    }
    // Every parameter got a gradient of its shape.
    for (name, p) in mha.named_parameters() {
        assert_eq!(p.grad().expect(&name).shape(), p.shape(), "{name}");
    }
}

#[test]
fn embedding_layer_norm_and_dropout_modules() {
    use labs_nn::nn::{Dropout, Embedding, LayerNorm};
    let device = test_device();
    let rng = &mut Rng::seeded(8);
    let emb = Embedding::new(5, 3, rng, &device).unwrap();
    let table = emb.weight.to_vec::<f32>().unwrap();
    let idx = Tensor::from_slice(&[4i64, 0, 4], &[3], &device).unwrap();
    let rows = emb.forward(&idx).unwrap();
    assert_eq!(rows.shape(), [3, 3]);
    let got = rows.to_vec::<f32>().unwrap();
    assert_eq!(&got[0..3], &table[12..15]);
    assert_eq!(&got[3..6], &table[0..3]);
    // N(0, 1) initialisation: not all within a uniform's small bound.
    assert!(table.iter().any(|v| v.abs() > 0.5));

    let ln = LayerNorm::new(&[4], 1e-5, &device).unwrap();
    let x = Tensor::from_slice(
        &[1.0f32, 2.0, 3.0, 6.0, -1.0, 0.0, 1.0, 0.0],
        &[2, 4],
        &device,
    )
    .unwrap();
    let y = ln.forward(&x).unwrap().to_vec::<f32>().unwrap();
    for row in y.chunks(4) {
        let mean: f32 = row.iter().sum::<f32>() / 4.0;
        let var: f32 = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3, "{row:?}");
    }

    let mut drop = Dropout::new(0.5).unwrap();
    let ones = Tensor::full(&[1000], 1.0f32, &device).unwrap();
    let y = drop.forward(&ones).unwrap().to_vec::<f32>().unwrap();
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!(
        y.iter().all(|&v| v == 0.0 || v == 2.0),
        "kept values are scaled by 2"
    );
    assert!(
        (350..650).contains(&kept),
        "{kept} of 1000 kept with p = 0.5"
    );
    drop.eval();
    assert_eq!(
        drop.forward(&ones).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0; 1000]
    );
    assert!(Dropout::new(1.5).is_err());
}
