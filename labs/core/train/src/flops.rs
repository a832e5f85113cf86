//! Model FLOP utilisation: the arithmetic a training step's model needs, over what the
//! GPU could have done in the step's time at its peak.
//!
//! The FLOPs are the model's, not the hardware's (PaLM's and nanoGPT's estimate): per
//! token, 6 per parameter of a matrix product (a multiply and an add forward, twice that
//! backward; GPT-2's position table is looked up, not multiplied, and is left out) and,
//! for each attention, 12 · d_model · seq for its two products with the scores. A
//! checkpointed layer's recomputation is work the model did not ask for, so it is not
//! counted: checkpointing lowers the MFU of the same step time.

use crate::config::{AmpMode, ModelKind, TrainConfig};

/// The model FLOPs of one optimizer step on one rank: every micro-batch's forward and
/// backward.
pub fn model_flops_per_step(config: &TrainConfig, params: usize) -> f64 {
    let tokens = (config.batch * config.seq * config.accum) as f64;
    // GPT-2: one self-attention per block; the Transformer: the encoder's self-attention
    // and the decoder's self- and cross-attention, per layer.
    let attentions = match config.model {
        ModelKind::Gpt2 => config.layers,
        ModelKind::Transformer => 3 * config.layers,
    } as f64;
    let looked_up = match config.model {
        ModelKind::Gpt2 => config.gpt2_positions() * config.d_model,
        ModelKind::Transformer => 0,
    };
    let multiplied = params.saturating_sub(looked_up) as f64;
    let per_token =
        6.0 * multiplied + 12.0 * attentions * config.d_model as f64 * config.seq as f64;
    per_token * tokens
}

/// The dense peak of the products a run's matrices take, in FLOP/s, for the GPUs whose
/// data sheets the table knows (bfloat16 and float16 on tensor cores; float32 without
/// TF32, PyTorch's default for matrix products): `None` for any other device.
pub fn peak_flops(device_name: &str, amp: AmpMode) -> Option<f64> {
    // (name contains, half-precision peak, float32 peak), FLOP/s, without sparsity.
    const PEAKS: &[(&str, f64, f64)] = &[
        ("H100 PCIe", 756.5e12, 51.2e12),
        ("H100", 989.4e12, 66.9e12),
        ("H200", 989.4e12, 66.9e12),
        ("A100", 312.0e12, 19.5e12),
    ];
    let &(_, half, single) = PEAKS
        .iter()
        .find(|(name, _, _)| device_name.contains(name))?;
    Some(match amp {
        AmpMode::None => single,
        AmpMode::Bf16 | AmpMode::F16 => half,
    })
}

/// The fraction of the peak a step of `step_ms` reached.
pub fn mfu(flops_per_step: f64, step_ms: f64, peak: f64) -> f64 {
    flops_per_step / (step_ms / 1e3) / peak
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2 small's parameters, as `Gpt2Config::gpt2()` makes them.
    const GPT2_SMALL: usize = 124_439_808;

    #[test]
    fn gpt2_small_costs_what_its_products_do() {
        let c = TrainConfig {
            batch: 8,
            ..TrainConfig::gpt2()
        };
        let (l, d, s, v) = (
            c.layers as f64,
            c.d_model as f64,
            c.seq as f64,
            c.vocab as f64,
        );
        // Each block: the QKV, output and two MLP products, 12 d^2 weights; the head
        // d x vocab (the token table, tied); biases and norms are a rounding error.
        let products = 12.0 * l * d * d + d * v;
        let by_hand = (6.0 * products + 12.0 * l * d * s) * 8.0 * s;
        let counted = model_flops_per_step(&c, GPT2_SMALL);
        assert!(
            (counted / by_hand - 1.0).abs() < 2e-3,
            "{counted:e} against {by_hand:e}"
        );
    }

    #[test]
    fn the_flops_grow_with_the_tokens_and_the_transformer_has_three_attentions() {
        let c = TrainConfig::gpt2();
        let one = model_flops_per_step(&c, GPT2_SMALL);
        let more = TrainConfig {
            batch: 3,
            accum: 2,
            ..c.clone()
        };
        assert_eq!(model_flops_per_step(&more, GPT2_SMALL), 6.0 * one);
        let t = TrainConfig::transformer();
        let tokens = (t.batch * t.seq) as f64;
        let attention = model_flops_per_step(&t, 1000) - 6.0 * 1000.0 * tokens;
        let per_attention = 12.0 * (t.d_model * t.seq) as f64 * tokens;
        assert_eq!(attention, 3.0 * t.layers as f64 * per_attention);
    }

    #[test]
    fn known_gpus_have_a_peak_and_others_none() {
        let h100 = peak_flops("NVIDIA H100 80GB HBM3", AmpMode::Bf16).unwrap();
        assert_eq!(h100, 989.4e12);
        assert_eq!(
            peak_flops("NVIDIA H100 80GB HBM3", AmpMode::None),
            Some(66.9e12)
        );
        assert_eq!(peak_flops("NVIDIA H200", AmpMode::F16), Some(989.4e12));
        assert!(peak_flops("NVIDIA H100 PCIe", AmpMode::Bf16).unwrap() < h100);
        assert_eq!(peak_flops("sim", AmpMode::Bf16), None);
        assert_eq!(peak_flops("NVIDIA GeForce RTX 4090", AmpMode::Bf16), None);
    }

    #[test]
    fn a_step_at_the_peak_is_all_of_it() {
        assert_eq!(mfu(989.4e12, 1000.0, 989.4e12), 1.0);
        assert_eq!(mfu(989.4e12, 4000.0, 989.4e12), 0.25);
    }
}
