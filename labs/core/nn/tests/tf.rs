//! Attention and transformers: `scaled_dot_product_attention` against a float64 host
//! reference (float, uint8 and causal masks), `nn.MultiheadAttention`'s masks and
//! `need_weights`, the layers' `norm_first` and `activation` options, the stacks and
//! `nn.Transformer` named and counted as PyTorch's, a GPT-2 model (names, the
//! 124,439,808 parameters of GPT-2 small, the tied head, causality), gradients of a tiny
//! Transformer and a tiny GPT-2 against finite differences, and memory back to its
//! baseline once a model and its graph are dropped. Runs on the simulated GPU by default
//! and on the GPU with `LABS_DEVICE=cuda`.

use labs_base::testing::{assert_close, serial};
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::attention::{causal_mask_rect, scaled_dot_product_attention};
use labs_nn::nn::{
    self, Activation, AttentionMasks, DecoderMasks, Gpt2, Gpt2Config, Module, MultiheadAttention,
    Rng, Transformer, TransformerConfig, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer,
};
use labs_tensor::tensor::no_grad;
use labs_tensor::testing::host;
use labs_tensor::Tensor;

fn names(m: &dyn Module) -> Vec<String> {
    m.named_parameters().into_iter().map(|(n, _)| n).collect()
}

fn tensor(v: &[f32], shape: &[usize], device: &Device) -> Tensor {
    Tensor::from_slice(v, shape, device).unwrap()
}

/// softmax(q kᵀ / sqrt(d) + mask) v over `[B, H, L, D]` in float64; `hidden(b, h, i, j)`
/// says a key is masked out, `add(b, h, i, j)` what is added.
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: [usize; 5],
    hidden: impl Fn(usize, usize, usize, usize) -> bool,
    add: impl Fn(usize, usize, usize, usize) -> f64,
) -> Vec<f64> {
    let [b, h, l, s, d] = dims;
    let mut out = vec![0.0; b * h * l * d];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                let qi = ((bi * h + hi) * l + i) * d;
                let scores: Vec<f64> = (0..s)
                    .map(|j| {
                        if hidden(bi, hi, i, j) {
                            return f64::NEG_INFINITY;
                        }
                        let kj = ((bi * h + hi) * s + j) * d;
                        let dot: f64 = (0..d).map(|x| q[qi + x] as f64 * k[kj + x] as f64).sum();
                        dot / (d as f64).sqrt() + add(bi, hi, i, j)
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for x in 0..d {
                    out[qi + x] = (0..s)
                        .map(|j| e[j] / z * v[((bi * h + hi) * s + j) * d + x] as f64)
                        .sum();
                }
            }
        }
    }
    out
}

#[test]
fn sdpa_matches_a_host_reference_with_float_bool_and_causal_masks() {
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(1);
    let (b, h, l, s, d) = (2, 2, 3, 4, 5);
    let (q, k, v) = (
        rng.uniform(b * h * l * d, 1.0),
        rng.uniform(b * h * s * d, 1.0),
        rng.uniform(b * h * s * d, 1.0),
    );
    let qt = tensor(&q, &[b, h, l, d], &device);
    let kt = tensor(&k, &[b, h, s, d], &device);
    let vt = tensor(&v, &[b, h, s, d], &device);
    let dims = [b, h, l, s, d];
    let sdpa = |mask: Option<&Tensor>, causal: bool| {
        host(&scaled_dot_product_attention(&qt, &kt, &vt, mask, causal, 0.0, true).unwrap())
    };
    // No mask.
    let want = reference(&q, &k, &v, dims, |_, _, _, _| false, |_, _, _, _| 0.0);
    assert_close("plain", &sdpa(None, false), &want, 1e-5, 1e-5);
    // Causal: top-left aligned (key j > i hidden) on a rectangular [3, 4].
    let want = reference(&q, &k, &v, dims, |_, _, i, j| j > i, |_, _, _, _| 0.0);
    assert_close("causal", &sdpa(None, true), &want, 1e-5, 1e-5);
    let rect = causal_mask_rect(l, s, &device).unwrap();
    assert_close(
        "causal_mask_rect",
        &sdpa(Some(&rect), false),
        &want,
        1e-5,
        1e-5,
    );
    // A float mask [B, 1, L, S], added.
    let add = rng.uniform(b * l * s, 2.0);
    let addt = tensor(&add, &[b, 1, l, s], &device);
    let want = reference(
        &q,
        &k,
        &v,
        dims,
        |_, _, _, _| false,
        |bi, _, i, j| add[(bi * l + i) * s + j] as f64,
    );
    assert_close("float mask", &sdpa(Some(&addt), false), &want, 1e-5, 1e-5);
    // A uint8 mask [L, S]: 1 attends (F.scaled_dot_product_attention's bool mask);
    // combined with causal.
    let keep: Vec<u8> = (0..l * s).map(|x| (x % 3 != 1) as u8).collect();
    let keept = Tensor::from_slice(&keep, &[l, s], &device).unwrap();
    let want = reference(
        &q,
        &k,
        &v,
        dims,
        |_, _, i, j| keep[i * s + j] == 0 || j > i,
        |_, _, _, _| 0.0,
    );
    assert_close(
        "bool + causal",
        &sdpa(Some(&keept), true),
        &want,
        1e-5,
        1e-5,
    );
    // Bad shapes are errors that say what was expected.
    let err = scaled_dot_product_attention(&qt, &vt, &qt, None, false, 0.0, true).unwrap_err();
    assert!(err.to_string().contains("[B, H, L, Dh]"), "{err}");
    let wrong = tensor(&[0.0; 5], &[5], &device);
    let err =
        scaled_dot_product_attention(&qt, &kt, &vt, Some(&wrong), false, 0.0, true).unwrap_err();
    assert!(err.to_string().contains("mask"), "{err}");
}

#[test]
fn multihead_attention_masks_and_need_weights() {
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(2);
    let (b, l, e, h) = (2, 4, 8, 2);
    let mut mha = MultiheadAttention::new(e, h, 0.0, rng, &device).unwrap();
    mha.eval();
    let x = tensor(&rng.uniform(b * l * e, 1.0), &[b, l, e], &device);
    // A bool (uint8) attn_mask, 1 = not allowed, equals the float mask with -inf there.
    let hide: Vec<u8> = (0..l * l).map(|i| (i % l > i / l) as u8).collect();
    let hide_t = Tensor::from_slice(&hide, &[l, l], &device).unwrap();
    let float_t = nn::causal_mask(l, &device).unwrap();
    let by_bool = mha.attend(&x, &x, &x, Some(&hide_t)).unwrap();
    let by_float = mha.attend(&x, &x, &x, Some(&float_t)).unwrap();
    assert_close(
        "bool vs float mask",
        &host(&by_bool),
        &host(&by_float),
        1e-6,
        1e-6,
    );
    // is_causal with no mask is the causal mask.
    let causal = AttentionMasks {
        is_causal: true,
        ..Default::default()
    };
    let by_flag = mha.forward_qkv(&x, &x, &x, causal, false).unwrap().0;
    assert_close("is_causal", &host(&by_flag), &host(&by_float), 1e-6, 1e-6);
    // key_padding_mask [B, S] (1 = padding) equals the per-batch attn_mask [B*H, L, S]
    // hiding the same keys.
    let pad: Vec<u8> = vec![0, 0, 0, 1, 0, 1, 1, 0];
    let pad_t = Tensor::from_slice(&pad, &[b, l], &device).unwrap();
    let mut per_head = vec![0u8; b * h * l * l];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..l {
                for j in 0..l {
                    per_head[((bi * h + hi) * l + i) * l + j] = pad[bi * l + j];
                }
            }
        }
    }
    let per_head_t = Tensor::from_slice(&per_head, &[b * h, l, l], &device).unwrap();
    let padded = AttentionMasks {
        key_padding_mask: Some(&pad_t),
        ..Default::default()
    };
    let (by_pad, _) = mha.forward_qkv(&x, &x, &x, padded, false).unwrap();
    let by_3d = mha.attend(&x, &x, &x, Some(&per_head_t)).unwrap();
    assert_close(
        "key_padding_mask",
        &host(&by_pad),
        &host(&by_3d),
        1e-6,
        1e-6,
    );
    // need_weights: the same output, and weights [B, L, S] averaged over heads whose
    // rows sum to 1 and are 0 on padded keys.
    let (out, weights) = mha.forward_qkv(&x, &x, &x, padded, true).unwrap();
    assert_close(
        "need_weights output",
        &host(&out),
        &host(&by_pad),
        1e-6,
        1e-6,
    );
    let w = weights.expect("need_weights=true returns the weights");
    assert_eq!(w.shape(), [b, l, l]);
    let w = host(&w);
    for bi in 0..b {
        for i in 0..l {
            let row = &w[(bi * l + i) * l..(bi * l + i + 1) * l];
            assert!(
                (row.iter().sum::<f64>() - 1.0).abs() < 1e-5,
                "row sums to 1"
            );
            for j in 0..l {
                if pad[bi * l + j] == 1 {
                    assert_eq!(row[j], 0.0, "padded key {j} has weight");
                }
            }
        }
    }
    assert!(mha
        .forward_qkv(&x, &x, &x, AttentionMasks::default(), false)
        .unwrap()
        .1
        .is_none());
    // Wrong mask shapes are errors naming the expected shape.
    let bad = Tensor::from_slice(&[0u8; 3], &[1, 3], &device).unwrap();
    let err = mha.attend(&x, &x, &x, Some(&bad)).unwrap_err().to_string();
    assert!(err.contains("attn_mask must be [4, 4]"), "{err}");
    let bad_pad = AttentionMasks {
        key_padding_mask: Some(&bad),
        ..Default::default()
    };
    let err = mha
        .forward_qkv(&x, &x, &x, bad_pad, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("key_padding_mask must be [2, 4]"), "{err}");
}

fn small(d: usize, h: usize, ff: usize) -> TransformerConfig {
    TransformerConfig {
        dim_feedforward: ff,
        dropout: 0.0,
        ..TransformerConfig::new(d, h)
    }
}

#[test]
fn norm_first_and_gelu_layers_compose_as_pytorch_writes_them() {
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(3);
    let (b, l, d) = (2, 3, 8);
    let x = tensor(&rng.uniform(b * l * d, 1.0), &[b, l, d], &device);
    let mask = nn::causal_mask(l, &device).unwrap();
    for activation in [Activation::Relu, Activation::Gelu] {
        let c = TransformerConfig {
            norm_first: true,
            activation,
            ..small(d, 2, 16)
        };
        let layer = TransformerEncoderLayer::new(c, rng, &device).unwrap();
        let got = layer.forward_masked(&x, Some(&mask)).unwrap();
        // x + sa(norm1(x)), then + linear2(act(linear1(norm2(x)))), from the layer's
        // own parts and parameters.
        let sa = layer
            .self_attn
            .attend(
                &layer.norm1.forward(&x).unwrap(),
                &layer.norm1.forward(&x).unwrap(),
                &layer.norm1.forward(&x).unwrap(),
                Some(&mask),
            )
            .unwrap();
        let x1 = x.add(&sa).unwrap();
        let p: std::collections::HashMap<String, Tensor> =
            layer.named_parameters().into_iter().collect();
        let lin = |x: &Tensor, name: &str| {
            x.matmul(&p[&format!("{name}.weight")].transpose(0, 1).unwrap())
                .unwrap()
                .add(&p[&format!("{name}.bias")])
                .unwrap()
        };
        let hidden = lin(&layer.norm2.forward(&x1).unwrap(), "linear1");
        let hidden = match activation {
            Activation::Relu => hidden.relu().unwrap(),
            Activation::Gelu => hidden.gelu("none").unwrap(),
        };
        let want = x1.add(&lin(&hidden, "linear2")).unwrap();
        assert_close("pre-norm encoder", &host(&got), &host(&want), 1e-5, 1e-5);
        // Post-norm with the same parameters differs.
        let mut post = TransformerEncoderLayer::new(small(d, 2, 16), rng, &device).unwrap();
        post.config.activation = activation;
        post.load_state_dict(&layer.state_dict()).unwrap();
        let other = post.forward_masked(&x, Some(&mask)).unwrap();
        assert!(host(&other)
            .iter()
            .zip(host(&got))
            .any(|(a, b)| (a - b).abs() > 1e-3));
    }
}

/// `nn.TransformerEncoderLayer`'s count: attention 4E² + 4E, the feed-forward
/// 2EF + F + E, two norms 4E.
fn encoder_layer_count(e: usize, f: usize) -> usize {
    4 * e * e + 4 * e + 2 * e * f + f + e + 4 * e
}

/// `nn.TransformerDecoderLayer`'s: two attentions, the feed-forward, three norms.
fn decoder_layer_count(e: usize, f: usize) -> usize {
    2 * (4 * e * e + 4 * e) + 2 * e * f + f + e + 6 * e
}

/// `nn.Transformer`'s: the layers and the encoder's and decoder's final norms.
fn transformer_count(e: usize, f: usize, n_enc: usize, n_dec: usize) -> usize {
    n_enc * encoder_layer_count(e, f) + n_dec * decoder_layer_count(e, f) + 2 * 2 * e
}

#[test]
fn transformer_is_named_and_counted_as_pytorchs() {
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(4);
    // From the layer shapes: nn.Transformer() (d_model 512, ffn 2048, 6 + 6 layers)
    // has 44,140,544 parameters, nn.Transformer(d_model=256) 17,363,968, as
    // sum(p.numel() for p in model.parameters()) prints.
    assert_eq!(transformer_count(512, 2048, 6, 6), 44_140_544);
    assert_eq!(transformer_count(256, 2048, 6, 6), 17_363_968);
    let c = TransformerConfig {
        dropout: 0.1,
        ..TransformerConfig::new(256, 8)
    };
    let model = Transformer::new(c, 6, 6, rng, &device).unwrap();
    assert_eq!(model.num_parameters(), 17_363_968);
    let n = names(&model);
    assert_eq!(n.len(), 6 * 12 + 2 + 6 * 18 + 2);
    assert_eq!(n[0], "encoder.layers.0.self_attn.in_proj_weight");
    assert_eq!(n[6 * 12], "encoder.norm.weight");
    assert_eq!(n[6 * 12 + 1], "encoder.norm.bias");
    assert!(n.contains(&"decoder.layers.5.multihead_attn.out_proj.bias".to_string()));
    assert_eq!(
        n[n.len() - 2..],
        ["decoder.norm.weight", "decoder.norm.bias"]
    );
    // _reset_parameters: every matrix Xavier-uniform, so layers differ; norms stay 1.
    let p: std::collections::HashMap<String, Tensor> =
        model.named_parameters().into_iter().collect();
    let w0 = host(&p["encoder.layers.0.linear1.weight"]);
    let w1 = host(&p["encoder.layers.1.linear1.weight"]);
    assert_ne!(w0, w1);
    let bound = (6.0f64 / (256.0 + 2048.0)).sqrt();
    assert!(w0.iter().all(|v| v.abs() <= bound));
    assert!(host(&p["decoder.norm.weight"]).iter().all(|&v| v == 1.0));
    drop(model);

    // A stack of copies: nn.TransformerEncoder(layer, 3) starts with equal layers.
    let layer = TransformerEncoderLayer::new(small(8, 2, 16), rng, &device).unwrap();
    let first = host(&layer.self_attn.in_proj_weight);
    let enc = TransformerEncoder::new(layer, 3, None, &device).unwrap();
    assert_eq!(enc.num_parameters(), 3 * encoder_layer_count(8, 16));
    for l in &enc.layers {
        assert_eq!(host(&l.self_attn.in_proj_weight), first);
    }
    assert_eq!(names(&enc)[0], "layers.0.self_attn.in_proj_weight");
    let dlayer = TransformerDecoderLayer::new(small(8, 2, 16), rng, &device).unwrap();
    let norm = nn::LayerNorm::new(&[8], 1e-5, &device).unwrap();
    let dec = TransformerDecoder::new(dlayer, 2, Some(norm), &device).unwrap();
    assert_eq!(dec.num_parameters(), 2 * decoder_layer_count(8, 16) + 16);
    assert_eq!(names(&dec).last().unwrap(), "norm.bias");
    assert!(TransformerEncoder::new(
        TransformerEncoderLayer::new(small(8, 2, 16), rng, &device).unwrap(),
        0,
        None,
        &device
    )
    .is_err());
}

#[test]
fn gpt2_is_named_counted_tied_and_causal() {
    let _serial = serial();
    let device = test_device();
    // GPT-2 small from the shapes: 124,439,808 with the head tied to wte.
    assert_eq!(Gpt2Config::gpt2().num_parameters(), 124_439_808);
    let c = Gpt2Config {
        vocab: 13,
        n_positions: 8,
        d_model: 8,
        n_layer: 2,
        n_head: 2,
        dropout: 0.0,
    };
    let rng = &mut Rng::seeded(5);
    let model = Gpt2::new(c, rng, &device).unwrap();
    assert_eq!(model.num_parameters(), c.num_parameters());
    let n = names(&model);
    assert_eq!(
        n[..8],
        [
            "transformer.wte.weight",
            "transformer.wpe.weight",
            "transformer.h.0.ln_1.weight",
            "transformer.h.0.ln_1.bias",
            "transformer.h.0.attn.c_attn.weight",
            "transformer.h.0.attn.c_attn.bias",
            "transformer.h.0.attn.c_proj.weight",
            "transformer.h.0.attn.c_proj.bias",
        ]
    );
    assert_eq!(
        n[n.len() - 2..],
        ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    );
    let p: std::collections::HashMap<String, Tensor> =
        model.named_parameters().into_iter().collect();
    assert_eq!(p["transformer.h.1.attn.c_attn.weight"].shape(), [24, 8]);
    assert_eq!(p["transformer.h.1.mlp.c_fc.weight"].shape(), [32, 8]);
    assert!(model
        .lm_head_weight()
        .shares_storage(&p["transformer.wte.weight"]));
    // Logits [B, T, V]; position t depends on tokens 0..=t only.
    let tokens: Vec<i64> = vec![1, 4, 2, 7, 3, 3, 0, 12];
    let idx = Tensor::from_slice(&tokens, &[2, 4], &device).unwrap();
    let logits = model.forward(&idx).unwrap();
    assert_eq!(logits.shape(), [2, 4, 13]);
    let mut changed = tokens.clone();
    changed[2] = 9; // batch 0, position 2
    let logits2 = model
        .forward(&Tensor::from_slice(&changed, &[2, 4], &device).unwrap())
        .unwrap();
    let (a, b) = (host(&logits), host(&logits2));
    assert_eq!(
        a[..2 * 13],
        b[..2 * 13],
        "positions 0, 1 do not see position 2"
    );
    assert_ne!(a[2 * 13..4 * 13], b[2 * 13..4 * 13]);
    assert_eq!(a[4 * 13..], b[4 * 13..], "the other batch is untouched");
    // At initialisation the loss is about ln(vocab).
    let loss = model.loss(&idx, &idx).unwrap().item::<f32>().unwrap();
    assert!((loss - (13f32).ln()).abs() < 0.5, "loss {loss}");
    // Too long a sequence, and a wrong targets shape, are errors.
    let long = Tensor::from_slice(&[0i64; 9], &[1, 9], &device).unwrap();
    let err = model.forward(&long).unwrap_err().to_string();
    assert!(err.contains("block size is only 8"), "{err}");
    assert!(model.loss(&idx, &long).is_err());
}

/// A copy of `model`'s parameters with element `i` of `name` moved by `delta`.
fn nudged(model: &dyn Module, name: &str, i: usize, delta: f32) -> Vec<(String, Tensor)> {
    model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| {
            let mut v = p.to_vec::<f32>().unwrap();
            if n == name {
                v[i] += delta;
            }
            let t = Tensor::from_slice(&v, p.shape(), p.device()).unwrap();
            (n, t)
        })
        .collect()
}

/// Checks the gradients of some elements of some parameters against central
/// differences of `loss` (run under no_grad), restoring the parameters after.
fn check_parameter_grads(model: &dyn Module, picks: &[(&str, &[usize])], loss: &dyn Fn() -> f64) {
    let original = nudged(model, "", 0, 0.0);
    let grads: std::collections::HashMap<String, Vec<f32>> = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| {
            let g = p.grad().unwrap_or_else(|| panic!("{n} has no grad"));
            assert_eq!(g.shape(), p.shape(), "{n}");
            (n, g.to_vec::<f32>().unwrap())
        })
        .collect();
    let eps = 1e-2f32;
    for (name, indices) in picks {
        for &i in *indices {
            model.load_state_dict(&nudged(model, name, i, eps)).unwrap();
            let plus = loss();
            model.load_state_dict(&original).unwrap();
            model
                .load_state_dict(&nudged(model, name, i, -eps))
                .unwrap();
            let minus = loss();
            model.load_state_dict(&original).unwrap();
            let numeric = (plus - minus) / (2.0 * eps as f64);
            let analytic = grads[*name][i] as f64;
            assert!(
                (analytic - numeric).abs() < 1e-2 * (1.0 + numeric.abs()),
                "{name}[{i}]: backward {analytic}, finite differences {numeric}"
            );
        }
    }
}

#[test]
fn tiny_transformer_gradients_match_finite_differences() {
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(6);
    let (b, ls, lt, d) = (2, 3, 4, 8);
    for norm_first in [false, true] {
        let c = TransformerConfig {
            norm_first,
            activation: if norm_first {
                Activation::Gelu
            } else {
                Activation::Relu
            },
            ..small(d, 2, 16)
        };
        let model = Transformer::new(c, 1, 1, rng, &device).unwrap();
        let src = rng.uniform(b * ls * d, 1.0);
        let tgt = rng.uniform(b * lt * d, 1.0);
        let g = rng.uniform(b * lt * d, 1.0);
        let tgt_mask = nn::causal_mask(lt, &device).unwrap();
        let pad = Tensor::from_slice(&[0u8, 0, 1, 0, 0, 0], &[b, ls], &device).unwrap();
        let run = |s: &Tensor, t: &Tensor| -> Tensor {
            let masks = DecoderMasks {
                tgt: AttentionMasks::attn(Some(&tgt_mask)),
                memory: AttentionMasks {
                    key_padding_mask: Some(&pad),
                    ..Default::default()
                },
            };
            let src_masks = AttentionMasks {
                key_padding_mask: Some(&pad),
                ..Default::default()
            };
            let y = model.forward_with(s, t, src_masks, masks).unwrap();
            y.mul(&tensor(&g, y.shape(), &device))
                .unwrap()
                .sum_all()
                .unwrap()
        };
        let st = tensor(&src, &[b, ls, d], &device).requires_grad_(true);
        let tt = tensor(&tgt, &[b, lt, d], &device).requires_grad_(true);
        run(&st, &tt).backward().unwrap();
        let eval = |s: &[f32], t: &[f32]| -> f64 {
            let _off = no_grad();
            run(
                &tensor(s, &[b, ls, d], &device),
                &tensor(t, &[b, lt, d], &device),
            )
            .item::<f32>()
            .unwrap() as f64
        };
        // Small enough that no ReLU kink lies within a step of these inputs.
        let eps = 3e-3f32;
        for (which, base, grad) in [(0, &src, st.grad()), (1, &tgt, tt.grad())] {
            let grad = grad.expect("input grad").to_vec::<f32>().unwrap();
            for i in (0..base.len()).step_by(5) {
                let (mut plus, mut minus) = (base.clone(), base.clone());
                plus[i] += eps;
                minus[i] -= eps;
                let numeric = if which == 0 {
                    (eval(&plus, &tgt) - eval(&minus, &tgt)) / (2.0 * eps as f64)
                } else {
                    (eval(&src, &plus) - eval(&src, &minus)) / (2.0 * eps as f64)
                };
                assert!(
                    (grad[i] as f64 - numeric).abs() < 1e-2 * (1.0 + numeric.abs()),
                    "norm_first={norm_first} input {which}[{i}]: backward {}, numeric {numeric}",
                    grad[i]
                );
            }
        }
        // The padded source position gets no gradient through attention alone, but its
        // own residual path still carries one: just check parameters now.
        let loss = || eval(&src, &tgt);
        check_parameter_grads(
            &model,
            &[
                ("encoder.layers.0.self_attn.in_proj_weight", &[0, 77, 150]),
                ("encoder.layers.0.linear1.bias", &[3]),
                ("encoder.norm.weight", &[5]),
                ("decoder.layers.0.multihead_attn.in_proj_weight", &[10, 100]),
                ("decoder.layers.0.multihead_attn.out_proj.weight", &[7]),
                ("decoder.layers.0.norm3.bias", &[2]),
                ("decoder.norm.bias", &[1]),
            ],
            &loss,
        );
    }
}

#[test]
fn tiny_gpt2_gradients_match_finite_differences() {
    let _serial = serial();
    let device = test_device();
    let c = Gpt2Config {
        vocab: 11,
        n_positions: 6,
        d_model: 8,
        n_layer: 2,
        n_head: 2,
        dropout: 0.0,
    };
    let model = Gpt2::new(c, &mut Rng::seeded(7), &device).unwrap();
    let idx = Tensor::from_slice(&[1i64, 5, 2, 9, 0, 4, 4, 3, 10, 7], &[2, 5], &device).unwrap();
    let targets =
        Tensor::from_slice(&[5i64, 2, 9, 0, -100, 3, 10, 7, 1, 6], &[2, 5], &device).unwrap();
    model.loss(&idx, &targets).unwrap().backward().unwrap();
    let loss = || {
        let _off = no_grad();
        model.loss(&idx, &targets).unwrap().item::<f32>().unwrap() as f64
    };
    check_parameter_grads(
        &model,
        &[
            // wte gets the embedding's and the tied head's gradients.
            ("transformer.wte.weight", &[0, 9, 41, 87]),
            ("transformer.wpe.weight", &[3, 30]),
            ("transformer.h.0.attn.c_attn.weight", &[1, 70, 130, 190]),
            ("transformer.h.0.attn.c_attn.bias", &[4, 12, 20]),
            ("transformer.h.1.mlp.c_fc.weight", &[17]),
            ("transformer.h.1.mlp.c_proj.weight", &[40]),
            ("transformer.h.1.ln_2.weight", &[6]),
            ("transformer.ln_f.bias", &[0]),
        ],
        &loss,
    );
}

#[test]
fn memory_returns_to_baseline_after_a_model_and_its_graph_are_dropped() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let base = alloc.memory_allocated();
    {
        let c = Gpt2Config {
            vocab: 17,
            n_positions: 8,
            d_model: 16,
            n_layer: 2,
            n_head: 4,
            dropout: 0.1,
        };
        let model = Gpt2::new(c, &mut Rng::seeded(8), &device).unwrap();
        let idx = Tensor::from_slice(&[3i64; 16], &[2, 8], &device).unwrap();
        let loss = model.loss(&idx, &idx).unwrap();
        loss.backward().unwrap();
        // A second forward whose graph is dropped without backward.
        let _pending = model.loss(&idx, &idx).unwrap();
        let t = Transformer::new(small(8, 2, 16), 1, 1, &mut Rng::seeded(9), &device).unwrap();
        let x = tensor(&[0.5; 2 * 3 * 8], &[2, 3, 8], &device);
        let y = t.forward_seq2seq(&x, &x, None, None, None).unwrap();
        y.sum_all().unwrap().backward().unwrap();
        assert!(alloc.memory_allocated() > base);
    }
    assert_eq!(alloc.memory_allocated(), base, "everything freed");
}

#[test]
fn sdpa_dropout_applies_only_in_training() {
    let _serial = serial();
    let device = test_device();
    let rng = &mut Rng::seeded(10);
    let shape = [2, 2, 5, 4];
    let n: usize = shape.iter().product();
    let q = tensor(&rng.uniform(n, 1.0), &shape, &device);
    let k = tensor(&rng.uniform(n, 1.0), &shape, &device);
    let v = tensor(&rng.uniform(n, 1.0), &shape, &device);
    let run = |p: f32, training: bool| {
        host(&scaled_dot_product_attention(&q, &k, &v, None, true, p, training).unwrap())
    };
    let plain = run(0.0, true);
    // Not training: no dropout, whatever p.
    assert_eq!(run(0.5, false), plain);
    // p = 1 drops every weight.
    assert!(run(1.0, true).iter().all(|&x| x == 0.0));
    // The same generator state gives the same mask; the result differs from no dropout.
    device.manual_seed(3);
    let a = run(0.5, true);
    device.manual_seed(3);
    assert_eq!(run(0.5, true), a);
    assert_ne!(a, plain);
}

#[test]
fn a_tiny_gpt2_learns_a_repeating_sequence() {
    use labs_nn::optim::{AdamW, Optimizer};
    let _serial = serial();
    let device = test_device();
    let c = Gpt2Config {
        vocab: 7,
        n_positions: 12,
        d_model: 16,
        n_layer: 2,
        n_head: 2,
        dropout: 0.0,
    };
    let model = Gpt2::new(c, &mut Rng::seeded(11), &device).unwrap();
    let seq: Vec<i64> = (0..2 * 13).map(|i| (i * 3 % 7) as i64).collect();
    // Inputs are tokens 0..12 of each row, targets tokens 1..13.
    let (mut idx, mut tgt) = (Vec::new(), Vec::new());
    for row in seq.chunks(13) {
        idx.extend_from_slice(&row[..12]);
        tgt.extend_from_slice(&row[1..]);
    }
    let idx = Tensor::from_slice(&idx, &[2, 12], &device).unwrap();
    let tgt = Tensor::from_slice(&tgt, &[2, 12], &device).unwrap();
    let mut opt = AdamW::new(model.parameters(), 0.01);
    let first = model.loss(&idx, &tgt).unwrap().item::<f32>().unwrap();
    let mut last = first;
    for _ in 0..30 {
        opt.zero_grad(true).unwrap();
        let loss = model.loss(&idx, &tgt).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        last = loss.item::<f32>().unwrap();
    }
    assert!(last < first * 0.2, "loss {first} -> {last} did not fall");
}
