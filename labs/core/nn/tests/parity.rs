//! PyTorch parity: every case of `data/parity/manifest.json` (written by
//! `ci/pytorch-fixtures.py` with PyTorch on the CPU) whose op the runtime has is run on
//! the device under test, and its output, its gradients (of `(output * g).sum()` with
//! the fixture's `g`) and, for optimizers, the parameters after each step are compared
//! within the case's tolerance. Cases the runtime cannot run yet are listed, not failed;
//! the ops that exist must be covered in full. A missing manifest is a failure that
//! names the command that writes it.

use std::collections::HashMap;
use std::io::Write;

use labs_device::kernels::{BinaryOp, UnaryOp};
use std::rc::Rc;

use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{
    causal_mask, Activation, AttentionMasks, Embedding, Gpt2, Gpt2Config, LayerNorm, Linear,
    Module, MultiheadAttention, Relu, Rng, Sequential, Transformer, TransformerConfig,
    TransformerDecoderLayer, TransformerEncoderLayer,
};
use labs_nn::optim::{Adam, AdamW, Optimizer, Sgd};
use labs_nn::testing::{parity_manifest, ParityCase, ParityManifest};
use labs_tensor::testing::host;
use labs_tensor::{DType, Tensor};

type Tensors = HashMap<String, Tensor>;

/// Ops whose cases must all run, in full (outputs and gradients): every op, module
/// and optimizer the runtime has.
const REQUIRED: &[&str] = &[
    "neg",
    "exp",
    "log",
    "sqrt",
    "tanh",
    "relu",
    "sigmoid",
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "sum",
    "mean",
    "matmul",
    "transpose",
    "permute",
    "reshape",
    "linear",
    "mlp",
    "multihead_attention",
    "multihead_attention_masked",
    "multihead_attention_weights",
    "transformer_encoder_layer",
    "transformer_decoder_layer",
    "transformer",
    "gpt2",
    "sgd",
    "adam",
    "adamw",
];

/// Why a case (or part of it) did not run.
struct NotCovered(String);

fn not_covered<T>(why: impl Into<String>) -> Result<T, NotCovered> {
    Err(NotCovered(why.into()))
}

/// What a case computed: tensors to compare with the fixture's of the same key, and
/// the keys it could not compute (with why).
#[derive(Default)]
struct Computed {
    tensors: Vec<(String, Tensor)>,
    partial: Vec<String>,
}

/// Compares `got` with the fixture's `want`; the first difference, if any.
fn compare(case: &ParityCase, key: &str, got: &Tensor, want: &Tensor) -> Option<String> {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return Some(format!(
            "{}: {key}: got {:?} {}, PyTorch {:?} {}",
            case.name,
            got.shape(),
            got.dtype(),
            want.shape(),
            want.dtype()
        ));
    }
    let (g, w) = (host(got), host(want));
    let worst = g
        .iter()
        .zip(&w)
        .enumerate()
        .map(|(i, (g, w))| (i, (g - w).abs() - (case.atol + case.rtol * w.abs())))
        // A NaN on either side is a difference.
        .filter(|(_, excess)| excess.is_nan() || *excess > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1));
    worst.map(|(i, _)| {
        format!(
            "{}: {key}[{i}]: got {}, PyTorch {} (atol {}, rtol {})",
            case.name, g[i], w[i], case.atol, case.rtol
        )
    })
}

fn get<'a>(t: &'a Tensors, key: &str) -> &'a Tensor {
    t.get(key)
        .unwrap_or_else(|| panic!("the fixture has no tensor `{key}`"))
}

/// The fixture's `prefix0`, `prefix1`, ... in order.
fn numbered(t: &Tensors, prefix: &str) -> Vec<Tensor> {
    (0..)
        .map_while(|i| t.get(&format!("{prefix}{i}")).cloned())
        .collect()
}

fn is_float(t: &Tensor) -> bool {
    matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

fn usizes(v: &serde_json::Value) -> Vec<usize> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default()
}

/// The forward of a functional case over its inputs (leaves that require grad where
/// they are floats).
fn functional(case: &ParityCase, x: &[Tensor]) -> Result<Forward, NotCovered> {
    let args = &case.args;
    let no_args = args.as_object().is_none_or(|o| o.is_empty());
    let op = case.op.as_str();
    let shapes_differ = x.len() == 2 && x[0].shape() != x[1].shape();
    if let Some(u) = UnaryOp::ALL.iter().find(|u| u.name() == op) {
        if no_args && x.len() == 1 {
            return Ok(Forward::One(x[0].unary(*u).expect(op)));
        }
    }
    if op == "gelu" {
        let approximate = args["approximate"].as_str().unwrap_or("none");
        return Ok(Forward::One(x[0].gelu(approximate).expect("gelu")));
    }
    if let Some(b) = BinaryOp::ALL.iter().find(|b| b.name() == op) {
        if no_args && x.len() == 2 {
            return match x[0].binary(*b, &x[1]) {
                Ok(y) => Ok(Forward::One(y)),
                Err(e) if shapes_differ => not_covered(format!("broadcasting: {e}")),
                Err(e) => panic!("{}: {e}", case.name),
            };
        }
    }
    let dims = usizes(&args["dim"]);
    let keepdim = args["keepdim"].as_bool().unwrap_or(false);
    // A single `dim`, negative ones counted from the end as PyTorch does.
    let dim = || -> usize {
        let d = args["dim"].as_i64().expect("dim");
        let rank = x[0].shape().len() as i64;
        (if d < 0 { d + rank } else { d }) as usize
    };
    let ok = |r: labs_base::Result<Tensor>| r.unwrap_or_else(|e| panic!("{}: {e}", case.name));
    Ok(match op {
        "sum" => x[0].sum_dims(&dims, keepdim).expect("sum"),
        "mean" => x[0].mean_dims(&dims, keepdim).expect("mean"),
        "var" => {
            let correction = args["correction"].as_u64().unwrap_or(1) as usize;
            ok(x[0].var_dims(&dims, correction, keepdim))
        }
        "max" => {
            let (values, indices) = x[0]
                .max_dim(dim(), keepdim)
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            return Ok(Forward::Two(values, indices));
        }
        "argmax" => ok(x[0].argmax(dim(), keepdim)),
        "softmax" => ok(x[0].softmax(dim())),
        "log_softmax" => ok(x[0].log_softmax(dim())),
        "pow_scalar" => ok(x[0].pow_scalar(args["exponent"].as_f64().expect("exponent"))),
        "where" => ok(Tensor::where_(&x[0], &x[1], &x[2])),
        "layer_norm" => {
            let eps = args["eps"].as_f64().unwrap_or(1e-5) as f32;
            let shape = usizes(&args["normalized_shape"]);
            ok(x[0].layer_norm(&shape, Some(&x[1]), Some(&x[2]), eps))
        }
        "embedding" => ok(Tensor::embedding(&x[0], &x[1])),
        "cat" => ok(Tensor::cat(&[&x[0], &x[1]], dim())),
        "stack" => ok(Tensor::stack(&[&x[0], &x[1]], dim())),
        "cross_entropy" => {
            let ignore = args["ignore_index"].as_i64().unwrap_or(-100);
            ok(x[0].cross_entropy(&x[1], ignore))
        }
        "linear_cross_entropy" => {
            let ignore = args["ignore_index"].as_i64().unwrap_or(-100);
            let chunk = args["chunk_rows"].as_u64().expect("chunk_rows") as usize;
            ok(x[0].linear_cross_entropy(&x[1], Some(&x[2]), &x[3], ignore, chunk))
        }
        "mse_loss" => ok(x[0].mse_loss(&x[1])),
        "matmul" => x[0].matmul(&x[1]).expect("matmul"),
        "transpose" => {
            let (a, b) = (args["dim0"].as_u64(), args["dim1"].as_u64());
            x[0].transpose(a.unwrap() as usize, b.unwrap() as usize)
                .expect("transpose")
        }
        "permute" => x[0].permute(&usizes(&args["dims"])).expect("permute"),
        "reshape" => x[0].reshape(&usizes(&args["shape"])).expect("reshape"),
        _ => return not_covered(format!("no `{op}` in the runtime yet")),
    }
    .into())
}

/// What a functional op returned: most one tensor, `max` two (values, indices).
enum Forward {
    One(Tensor),
    Two(Tensor, Tensor),
}

impl From<Tensor> for Forward {
    fn from(t: Tensor) -> Forward {
        Forward::One(t)
    }
}

/// A module case's model, built with its constructor and loaded with the fixture's
/// parameters by `load_state_dict` (so PyTorch's names are checked too), and its
/// forward over the case's inputs.
type Forwarding = Box<dyn Fn(&[Tensor]) -> labs_base::Result<Tensor>>;

fn module(case: &ParityCase, t: &Tensors) -> Result<(Rc<dyn Module>, Forwarding), NotCovered> {
    let device = get(t, "output").device().clone();
    let rng = &mut Rng::seeded(0);
    let args = &case.args;
    let size = |k: &str| {
        args[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: {k}", case.name)) as usize
    };
    let eps = args["layer_norm_eps"]
        .as_f64()
        .or(args["eps"].as_f64())
        .unwrap_or(1e-5) as f32;
    // A layer's configuration from PyTorch's constructor arguments.
    let transformer_config = || TransformerConfig {
        d_model: size("d_model"),
        nhead: size("nhead"),
        dim_feedforward: size("dim_feedforward"),
        dropout: args["dropout"].as_f64().unwrap_or(0.0) as f32,
        activation: match args["activation"].as_str() {
            Some("gelu") => Activation::Gelu,
            _ => Activation::Relu,
        },
        layer_norm_eps: eps,
        norm_first: args["norm_first"].as_bool().unwrap_or(false),
    };
    let param = |k: &str| {
        t.get(&format!("param.{k}"))
            .map(|p| p.deep_clone().unwrap())
    };
    // Each arm: the module, and its forward over the case's inputs.
    fn plain<M: Module + 'static>(m: M) -> (Rc<dyn Module>, Forwarding) {
        let m = Rc::new(m);
        let f = m.clone();
        (m, Box::new(move |x: &[Tensor]| f.forward(&x[0])))
    }
    let (model, forward) = match case.op.as_str() {
        // Built from the fixture's tensors, so that their dtype (bfloat16) is kept.
        "linear" => {
            plain(Linear::from_parameters(param("weight").unwrap(), param("bias")).unwrap())
        }
        "mlp" => {
            let mut model = Sequential::new();
            let mut i = 0;
            while let Some(w) = param(&format!("{i}.weight")) {
                if i > 0 {
                    model = model.push(Relu::new());
                }
                let b = param(&format!("{i}.bias"));
                model = model.push(Linear::from_parameters(w, b).unwrap());
                i += 2;
            }
            plain(model)
        }
        "embedding_module" => plain(
            Embedding::new(size("num_embeddings"), size("embedding_dim"), rng, &device).unwrap(),
        ),
        "layer_norm_module" => {
            plain(LayerNorm::new(&usizes(&args["normalized_shape"]), eps, &device).unwrap())
        }
        "multihead_attention" => {
            let m = Rc::new(
                MultiheadAttention::new(size("embed_dim"), size("num_heads"), 0.0, rng, &device)
                    .unwrap(),
            );
            let f = m.clone();
            let forward: Forwarding = Box::new(move |x: &[Tensor]| match x {
                [x] => f.attend(x, x, x, None),
                [q, kv] => f.attend(q, kv, kv, None),
                _ => unreachable!("one or two inputs"),
            });
            (m as Rc<dyn Module>, forward)
        }
        "multihead_attention_masked" | "multihead_attention_weights" => {
            let m = Rc::new(
                MultiheadAttention::new(size("embed_dim"), size("num_heads"), 0.0, rng, &device)
                    .unwrap(),
            );
            let f = m.clone();
            let forward: Forwarding = Box::new(move |x: &[Tensor]| match x {
                // x, key_padding_mask, attn_mask (both uint8, 1 = hidden).
                [x, pad, hide] => {
                    let masks = AttentionMasks {
                        attn_mask: Some(hide),
                        key_padding_mask: Some(pad),
                        is_causal: false,
                    };
                    Ok(f.forward_qkv(x, x, x, masks, false)?.0)
                }
                // need_weights=True: the weights averaged over the heads.
                [q, kv] => Ok(f
                    .forward_qkv(q, kv, kv, AttentionMasks::default(), true)?
                    .1
                    .expect("weights")),
                _ => unreachable!("two or three inputs"),
            });
            (m as Rc<dyn Module>, forward)
        }
        "transformer_encoder_layer" | "transformer_decoder_layer" => {
            let config = transformer_config();
            if case.op == "transformer_encoder_layer" {
                let m = Rc::new(TransformerEncoderLayer::new(config, rng, &device).unwrap());
                let f = m.clone();
                let forward: Forwarding = Box::new(move |x: &[Tensor]| match x {
                    [src] => f.forward(src),
                    // src, src_key_padding_mask (uint8, 1 = padding).
                    [src, pad] => f.forward_with(
                        src,
                        AttentionMasks {
                            key_padding_mask: Some(pad),
                            ..Default::default()
                        },
                    ),
                    _ => unreachable!("one or two inputs"),
                });
                (m as Rc<dyn Module>, forward)
            } else {
                let m = Rc::new(TransformerDecoderLayer::new(config, rng, &device).unwrap());
                let f = m.clone();
                let forward: Forwarding = Box::new(move |x: &[Tensor]| {
                    // The fixture's tgt_mask: causal.
                    let mask = causal_mask(x[0].shape()[1], x[0].device())?;
                    f.forward_decoder(&x[0], &x[1], Some(&mask), None)
                });
                (m as Rc<dyn Module>, forward)
            }
        }
        "transformer" => {
            let m = Rc::new(
                Transformer::new(
                    transformer_config(),
                    size("num_encoder_layers"),
                    size("num_decoder_layers"),
                    rng,
                    &device,
                )
                .unwrap(),
            );
            let f = m.clone();
            let forward: Forwarding = Box::new(move |x: &[Tensor]| {
                // The fixture's tgt_mask: causal.
                let mask = causal_mask(x[1].shape()[1], x[1].device())?;
                f.forward_seq2seq(&x[0], &x[1], None, Some(&mask), None)
            });
            (m as Rc<dyn Module>, forward)
        }
        "gpt2" => {
            let config = Gpt2Config {
                vocab: size("vocab"),
                n_positions: size("n_positions"),
                d_model: size("d_model"),
                n_layer: size("n_layer"),
                n_head: size("n_head"),
                dropout: args["dropout"].as_f64().unwrap_or(0.0) as f32,
            };
            plain(Gpt2::new(config, rng, &device).unwrap())
        }
        op => return not_covered(format!("no `{op}` module in the runtime yet")),
    };
    let state: Vec<(String, Tensor)> = t
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("param.")?.to_string(), v.deep_clone().ok()?)))
        .collect();
    model
        .load_state_dict(&state)
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    Ok((model, forward))
}

/// The output's backward with the fixture's `g`, then the gradients of `leaves` (key,
/// leaf) as `grad.KEY`.
fn backward(t: &Tensors, out: &Tensor, leaves: &[(String, Tensor)], computed: &mut Computed) {
    let Some(g) = t.get("grad_output") else {
        return;
    };
    if let Err(e) = out.backward_with(Some(g.clone()), false) {
        computed.partial.push(format!("gradients ({e})"));
        return;
    }
    for (key, leaf) in leaves {
        let grad = match leaf.grad() {
            Some(g) => g,
            None => Tensor::zeros(leaf.shape(), leaf.dtype(), leaf.device()).unwrap(),
        };
        computed.tensors.push((format!("grad.{key}"), grad));
    }
}

fn run_optimizer(case: &ParityCase, t: &Tensors) -> Result<Computed, NotCovered> {
    let params: Vec<Tensor> = (0..)
        .map_while(|i| t.get(&format!("param.{i}.0")))
        .map(|p| p.deep_clone().unwrap().requires_grad_(true))
        .collect();
    let lr = case.arg_f64("lr").expect("lr");
    let betas = |c: &ParityCase| {
        let b = c.args["betas"].as_array().expect("betas");
        (b[0].as_f64().unwrap(), b[1].as_f64().unwrap())
    };
    let mut opt: Box<dyn Optimizer> = match case.op.as_str() {
        "sgd" => {
            let mut o =
                Sgd::new(params.clone(), lr).momentum(case.arg_f64("momentum").unwrap_or(0.0));
            o.dampening = case.arg_f64("dampening").unwrap_or(0.0);
            o.weight_decay = case.arg_f64("weight_decay").unwrap_or(0.0);
            o.nesterov = case.args["nesterov"].as_bool().unwrap_or(false);
            Box::new(o)
        }
        "adam" | "adamw" => {
            let mut o = if case.op == "adam" {
                Adam::new(params.clone(), lr)
            } else {
                AdamW::new(params.clone(), lr)
            };
            o.betas = betas(case);
            o.eps = case.arg_f64("eps").expect("eps");
            o.weight_decay = case.arg_f64("weight_decay").expect("weight_decay");
            Box::new(o)
        }
        op => return not_covered(format!("no `{op}` optimizer yet")),
    };
    let mut computed = Computed::default();
    for k in 1..=case.steps {
        for (i, p) in params.iter().enumerate() {
            p.clear_grad();
            // A leaf's backward with a given gradient makes that gradient its `.grad`.
            p.backward_with(Some(get(t, &format!("grad.{i}.{k}")).clone()), false)
                .unwrap();
        }
        opt.step().unwrap();
        for (i, p) in params.iter().enumerate() {
            computed
                .tensors
                .push((format!("param.{i}.{k}"), p.detach().deep_clone().unwrap()));
        }
    }
    Ok(computed)
}

fn run(case: &ParityCase, t: &Tensors) -> Result<Computed, NotCovered> {
    if case.steps > 0 {
        return run_optimizer(case, t);
    }
    let inputs: Vec<Tensor> = numbered(t, "input.")
        .into_iter()
        .map(|x| {
            let x = x.deep_clone().unwrap();
            if is_float(&x) {
                x.requires_grad_(true)
            } else {
                x
            }
        })
        .collect();
    let input_leaves = || -> Vec<(String, Tensor)> {
        inputs
            .iter()
            .enumerate()
            .filter(|(_, x)| x.requires_grad())
            .map(|(i, x)| (format!("input.{i}"), x.clone()))
            .collect()
    };
    let mut computed = Computed::default();
    if t.keys().any(|k| k.starts_with("param.")) {
        let (model, forward) = module(case, t)?;
        let out = forward(&inputs).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        computed.tensors.push(("output".into(), out.clone()));
        let mut leaves = input_leaves();
        leaves.extend(
            model
                .named_parameters()
                .into_iter()
                .map(|(k, p)| (format!("param.{k}"), p)),
        );
        backward(t, &out, &leaves, &mut computed);
    } else {
        let out = match functional(case, &inputs)? {
            Forward::One(out) => out,
            Forward::Two(out, second) => {
                computed.tensors.push(("output.1".into(), second));
                out
            }
        };
        computed.tensors.push(("output".into(), out.clone()));
        if t.contains_key("output.1") && computed.tensors.len() == 1 {
            computed.partial.push("output.1".into());
        }
        if out.requires_grad() {
            backward(t, &out, &input_leaves(), &mut computed);
        }
    }
    Ok(computed)
}

fn report(line: &str) {
    // Straight to stderr, past the test harness's capture: the coverage list is wanted
    // on every run, not only on a failure.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// What a run over a manifest found.
#[derive(Default)]
struct Outcome {
    passed: usize,
    failures: Vec<String>,
    skipped: Vec<String>,
    partial: Vec<String>,
}

fn check(manifest: &ParityManifest, device: &Device) -> Outcome {
    let mut o = Outcome::default();
    for case in &manifest.cases {
        let t = case
            .tensors(device)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let required = REQUIRED.contains(&case.op.as_str());
        match run(case, &t) {
            Err(NotCovered(why)) => {
                if required {
                    o.failures
                        .push(format!("{}: required but not run: {why}", case.name));
                }
                o.skipped
                    .push(format!("{} ({}): {why}", case.name, case.op));
            }
            Ok(computed) => {
                let mut ok = true;
                for (key, got) in &computed.tensors {
                    let want = get(&t, key);
                    if let Some(diff) = compare(case, key, got, want) {
                        o.failures.push(diff);
                        ok = false;
                    }
                }
                let compared: Vec<&str> =
                    computed.tensors.iter().map(|(k, _)| k.as_str()).collect();
                let expected_grads: Vec<&String> = t
                    .keys()
                    .filter(|k| k.starts_with("grad.") && case.steps == 0)
                    .filter(|k| !compared.contains(&k.as_str()))
                    .collect();
                if !expected_grads.is_empty() && computed.partial.is_empty() {
                    o.failures
                        .push(format!("{}: not compared: {expected_grads:?}", case.name));
                    ok = false;
                }
                if !computed.partial.is_empty() {
                    let what = format!("{}: {}", case.name, computed.partial.join(", "));
                    if required {
                        o.failures.push(format!("required in full: {what}"));
                        ok = false;
                    }
                    o.partial.push(what);
                }
                if ok {
                    o.passed += 1;
                }
            }
        }
    }
    o
}

#[test]
fn pytorch_parity() {
    let manifest = parity_manifest().unwrap_or_else(|e| panic!("{e}"));
    let device: Device = test_device();
    let o = check(&manifest, &device);
    report(&format!(
        "PyTorch parity ({} cases from PyTorch {}, on {}): {} passed, {} failed, {} not covered yet",
        manifest.cases.len(),
        manifest.torch,
        device,
        o.passed,
        o.failures.len(),
        o.skipped.len()
    ));
    for s in &o.skipped {
        report(&format!("  not covered: {s}"));
    }
    for p in &o.partial {
        report(&format!("  partly covered: {p}"));
    }
    assert!(o.failures.is_empty(), "{}", o.failures.join("\n"));
}

/// The harness itself, on fixtures written here in the script's layout with values
/// computed on the host: correct cases pass, a wrong value fails naming the case and
/// the tensor, an op the runtime lacks is listed, not failed.
#[test]
fn the_harness_checks_what_the_script_writes() {
    let device = test_device();
    let dir = std::env::temp_dir().join(format!("labs-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, &device).unwrap();
    let (a, b, g) = (
        [0.5f32, -1.0, 2.0, 0.25, 3.0, -0.5],
        [1.5f32, 2.0, -1.0, 0.75, 0.5, 4.0],
        [1.0f32, -2.0, 0.5, 3.0, -1.0, 0.25],
    );
    let prod: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    let ga: Vec<f32> = g.iter().zip(&b).map(|(g, y)| g * y).collect();
    let gb: Vec<f32> = g.iter().zip(&a).map(|(g, x)| g * x).collect();
    let mul = |output: &[f32]| {
        vec![
            ("input.0".to_string(), f(&a, &[2, 3])),
            ("input.1".to_string(), f(&b, &[2, 3])),
            ("output".to_string(), f(output, &[2, 3])),
            ("grad_output".to_string(), f(&g, &[2, 3])),
            ("grad.input.0".to_string(), f(&ga, &[2, 3])),
            ("grad.input.1".to_string(), f(&gb, &[2, 3])),
        ]
    };
    let mut wrong = prod.clone();
    wrong[4] += 0.01;
    // One SGD step with momentum (the buffer starts as the gradient): p - lr g.
    let p0 = [1.0f32, -2.0];
    let g1 = [0.5f32, 0.25];
    let p1: Vec<f32> = p0.iter().zip(&g1).map(|(p, g)| p - 0.1 * g).collect();
    let sgd = vec![
        ("param.0.0".to_string(), f(&p0, &[2])),
        ("grad.0.1".to_string(), f(&g1, &[2])),
        ("param.0.1".to_string(), f(&p1, &[2])),
    ];
    let files = [
        ("mul", mul(&prod)),
        ("mul_wrong", mul(&wrong)),
        ("sgd", sgd),
        ("frobnicate", vec![("input.0".to_string(), f(&a, &[6]))]),
    ];
    for (name, tensors) in &files {
        labs_nn::nn::save(dir.join(format!("{name}.safetensors")), tensors).unwrap();
    }
    let case = |name: &str, op: &str, extra: serde_json::Value| {
        let mut c = serde_json::json!({
            "name": name, "op": op, "file": format!("{name}.safetensors"), "args": {},
            "dtype": "float32", "atol": 1e-5, "rtol": 1e-4,
        });
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let manifest = serde_json::json!({
        "torch": "none (written by the test)",
        "cases": [
            case("mul", "mul", serde_json::json!({})),
            case("mul_wrong", "mul", serde_json::json!({})),
            case("sgd", "sgd", serde_json::json!({"steps": 1, "args": {"lr": 0.1, "momentum": 0.9}})),
            case("frobnicate", "frobnicate", serde_json::json!({})),
        ],
    });
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    let o = check(&ParityManifest::read(&dir).unwrap(), &device);
    assert_eq!(o.passed, 2, "mul and sgd pass; failures: {:?}", o.failures);
    assert_eq!(o.failures.len(), 1, "{:?}", o.failures);
    assert!(
        o.failures[0].starts_with("mul_wrong: output[4]"),
        "{}",
        o.failures[0]
    );
    assert_eq!(o.skipped.len(), 1);
    assert!(o.skipped[0].starts_with("frobnicate"), "{}", o.skipped[0]);
    let e = ParityManifest::read(&dir.join("missing")).unwrap_err();
    assert!(e.contains("python3 ci/pytorch-fixtures.py"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
