//! The stacks' per-layer checkpointing (`LayerCheckpoint`) gives the gradients of the
//! plain run bit for bit (dropout on, masks given, under autocast too), the attention
//! call counters count each path, and the allocator splits its allocated peak by
//! category at the moment of the peak. Runs on the simulated GPU by default and on the
//! GPU with `LABS_DEVICE=cuda`.

use labs_alloc::alloc::Category;
use labs_base::testing::serial;
use labs_device::testing::test_device;
use labs_device::Device;
use labs_nn::nn::{
    causal_mask, reset_sdpa_calls, sdpa_calls, sdpa_kernel, Gpt2, Gpt2Config, LayerCheckpoint,
    Module, Rng, SdpaBackend, SdpaCalls, Transformer, TransformerConfig,
};
use labs_tensor::tensor::autocast;
use labs_tensor::{DType, Tensor};

/// Every parameter's gradient as bits, in parameter order; the gradients are cleared.
fn grad_bits(m: &dyn Module) -> Vec<u32> {
    let mut out = Vec::new();
    for p in m.parameters() {
        let g = p.grad().expect("a gradient");
        out.extend(g.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()));
    }
    m.zero_grad();
    out
}

fn modes() -> [LayerCheckpoint; 2] {
    [
        LayerCheckpoint::Full,
        LayerCheckpoint::selective_matmul_and_attention(),
    ]
}

fn gpt2(device: &Device) -> Gpt2 {
    let c = Gpt2Config {
        vocab: 50,
        n_positions: 16,
        d_model: 16,
        n_layer: 2,
        n_head: 2,
        dropout: 0.1,
    };
    Gpt2::new(c, &mut Rng::seeded(3), device).unwrap()
}

/// GPT-2's loss gradients with `mode`, dropout on, optionally under bf16 autocast.
fn gpt2_grads(m: &mut Gpt2, mode: &LayerCheckpoint, amp: bool, device: &Device) -> Vec<u32> {
    m.checkpoint = mode.clone();
    let ids: Vec<i64> = (0..2 * 9).map(|i| (i * 7 % 50) as i64).collect();
    let idx = Tensor::from_slice(&ids[..16], &[2, 8], device).unwrap();
    let targets = Tensor::from_slice(&ids[2..], &[2, 8], device).unwrap();
    device.manual_seed(11);
    let loss = {
        let _amp = amp.then(|| autocast(DType::BF16).unwrap());
        m.loss(&idx, &targets).unwrap()
    };
    loss.backward().unwrap();
    grad_bits(m)
}

#[test]
fn checkpointed_gpt2_blocks_give_the_plain_gradients() {
    let _s = serial();
    let device = test_device();
    let mut m = gpt2(&device);
    for amp in [false, true] {
        let want = gpt2_grads(&mut m, &LayerCheckpoint::Off, amp, &device);
        for mode in modes() {
            let got = gpt2_grads(&mut m, &mode, amp, &device);
            assert!(
                got == want,
                "{mode:?} (bf16 autocast: {amp}): gradients differ"
            );
        }
    }
}

#[test]
fn checkpointed_transformer_layers_with_masks_give_the_plain_gradients() {
    let _s = serial();
    let device = test_device();
    let c = TransformerConfig {
        dim_feedforward: 32,
        dropout: 0.1,
        ..TransformerConfig::new(16, 2)
    };
    let mut m = Transformer::new(c, 2, 2, &mut Rng::seeded(5), &device).unwrap();
    let src = Tensor::randn(&[2, 6, 16], 1, &device).unwrap();
    let tgt = Tensor::randn(&[2, 5, 16], 2, &device).unwrap();
    let mask = causal_mask(5, &device).unwrap();
    let mut grads = |mode: LayerCheckpoint| {
        m.set_checkpoint(mode);
        device.manual_seed(4);
        let y = m
            .forward_seq2seq(&src, &tgt, None, Some(&mask), None)
            .unwrap();
        y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
        grad_bits(&m)
    };
    let want = grads(LayerCheckpoint::Off);
    for mode in modes() {
        let name = format!("{mode:?}");
        assert!(grads(mode) == want, "{name}: gradients differ");
    }
}

#[test]
fn attention_calls_are_counted_by_path() {
    let device = test_device();
    let q = Tensor::randn(&[1, 2, 4, 8], 9, &device).unwrap();
    let attend = |mask: Option<&Tensor>| {
        labs_nn::nn::scaled_dot_product_attention(&q, &q, &q, mask, false, 0.0, true).unwrap()
    };
    let mask = causal_mask(4, &device).unwrap();
    reset_sdpa_calls();
    attend(None);
    {
        let _fused = sdpa_kernel(SdpaBackend::Fused);
        attend(None);
        attend(None);
        // An additive mask: the fused kernel does not serve it.
        attend(Some(&mask));
    }
    assert_eq!(sdpa_calls(), SdpaCalls { fused: 2, math: 2 });
    reset_sdpa_calls();
    assert_eq!(sdpa_calls(), SdpaCalls::default());
}

#[test]
fn the_allocated_peak_is_split_by_category_at_its_moment() {
    let _s = serial();
    let device = test_device();
    let a = device.allocator().unwrap();
    a.reset_peak_stats();
    let now = |c: Category| -> u64 {
        a.memory_by_category()
            .into_iter()
            .find(|(k, _)| *k == c)
            .unwrap()
            .1
            .current
    };
    let base: Vec<u64> = Category::ALL.iter().map(|&c| now(c)).collect();
    let parameter = {
        let _p = Category::Parameter.scope();
        Tensor::zeros(&[1 << 20], DType::F32, &device).unwrap()
    };
    let temporary = {
        let _t = Category::Temporary.scope();
        Tensor::zeros(&[2 << 20], DType::F32, &device).unwrap()
    };
    drop(temporary);
    // Below the peak: the peak's split stays the one with the temporary.
    let activation = {
        let _a = Category::Activation.scope();
        Tensor::zeros(&[1 << 19], DType::F32, &device).unwrap()
    };
    let at_peak = a.memory_by_category_at_peak();
    assert_eq!(
        at_peak.iter().map(|(_, b)| b).sum::<u64>(),
        a.max_memory_allocated()
    );
    let grew = |c: Category| at_peak[c.index()].1 - base[c.index()];
    assert_eq!(grew(Category::Parameter), 4 << 20);
    assert_eq!(grew(Category::Temporary), 8 << 20);
    assert_eq!(grew(Category::Activation), 0);
    // A reset starts the split from now.
    a.reset_peak_stats();
    let at_reset = a.memory_by_category_at_peak();
    assert_eq!(
        at_reset[Category::Activation.index()].1,
        now(Category::Activation)
    );
    drop((parameter, activation));
}
