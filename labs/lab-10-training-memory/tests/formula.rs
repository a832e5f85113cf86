//! The activation formula against the dry run: where they must agree to the byte, they
//! do. After one forward pass and loss, the allocator's `activation` category is the
//! formula's terms, each allocation rounded to 512 bytes, plus what blocks hold beyond
//! that (none at these sizes, all in the small pool); one more layer adds exactly one
//! layer's terms.

use std::process::Command;

use lab_10::formula::{activation_after_forward, formula, Formula};
use labs_core::Device;
use labs_train::{AmpMode, AttentionMode, CheckpointMode, ModelKind, TrainConfig};

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-10", env!("CARGO_BIN_EXE_lab-10"))
}

/// A small model of either kind, every block in the small pool.
fn small(model: ModelKind, batch: usize, seq: usize, d_model: usize, nhead: usize) -> TrainConfig {
    TrainConfig {
        d_model,
        nhead,
        layers: 1,
        ffn: if model == ModelKind::Gpt2 {
            4 * d_model
        } else {
            3 * d_model
        },
        vocab: 96,
        batch,
        seq,
        steps: 2,
        warmup: 0,
        ..TrainConfig::defaults(model)
    }
}

/// Activation bytes after one forward pass and loss, on a fresh dry device.
fn after_forward(c: &TrainConfig) -> u64 {
    let (bytes, unsplit) = activation_after_forward(c, &Device::new_dry(1 << 32)).unwrap();
    assert_eq!(unsplit, 0, "{c:?}: a block larger than its rounded request");
    bytes
}

fn label(c: &TrainConfig) -> String {
    format!(
        "{:?} b {} s {} h {} a {} dropout {} {:?} {:?} {:?}",
        c.model, c.batch, c.seq, c.d_model, c.nhead, c.dropout, c.attention, c.amp, c.checkpoint
    )
}

/// Every combination the formula covers, on a few shapes (odd ones included, where the
/// 512-byte rounding shows).
fn configurations() -> Vec<TrainConfig> {
    let mut out = Vec::new();
    for model in [ModelKind::Transformer, ModelKind::Gpt2] {
        for (batch, seq, d_model, nhead) in [(2, 16, 32, 2), (3, 21, 24, 3)] {
            for dropout in [0.0, 0.1] {
                for attention in [AttentionMode::Fused, AttentionMode::Naive] {
                    for amp in [AmpMode::None, AmpMode::Bf16] {
                        for checkpoint in [CheckpointMode::None, CheckpointMode::Layers] {
                            out.push(TrainConfig {
                                dropout,
                                attention,
                                amp,
                                checkpoint,
                                ..small(model, batch, seq, d_model, nhead)
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn the_terms_are_what_the_forward_pass_keeps() {
    for c in configurations() {
        let f = formula(&c).unwrap();
        assert_eq!(
            after_forward(&c) as i64,
            f.rounded_bytes(&c),
            "{}",
            label(&c)
        );
    }
}

#[test]
fn one_more_layer_keeps_one_layer_s_terms() {
    for c in configurations() {
        let two = TrainConfig {
            layers: 2,
            ..c.clone()
        };
        let f: Formula = formula(&c).unwrap();
        let per_layer: i64 = f.per_layer.iter().map(|t| t.rounded(&c)).sum();
        assert_eq!(
            after_forward(&two) as i64 - after_forward(&c) as i64,
            per_layer,
            "{}",
            label(&c)
        );
    }
}

/// The formula's shape, as the chapter writes it: GPT-2's block in float32 and under
/// autocast (Korthikanti et al.'s 34·s·b·h less the two dropout masks, with the two
/// layer-norm inputs kept in float32), and only the input with every layer
/// checkpointed.
#[test]
fn gpt2_s_block_collected() {
    let g = TrainConfig::gpt2();
    let text = |c: &TrainConfig| formula(c).unwrap().per_layer_text();
    assert_eq!(text(&g), "64·s·b·h + 4·a·s·b + 16·s·b");
    let bf16 = TrainConfig {
        amp: AmpMode::Bf16,
        ..g.clone()
    };
    assert_eq!(text(&bf16), "36·s·b·h + 4·a·s·b + 16·s·b");
    let math = TrainConfig {
        attention: AttentionMode::Naive,
        dropout: 0.1,
        ..bf16.clone()
    };
    assert_eq!(text(&math), "40·s·b·h + 7·a·s²·b + 16·s·b");
    let checkpointed = TrainConfig {
        checkpoint: CheckpointMode::Layers,
        ..bf16
    };
    assert_eq!(text(&checkpointed), "4·s·b·h");
}

#[test]
fn what_the_formula_does_not_cover_is_refused() {
    for flags in [
        &["--checkpoint", "selective"][..],
        &["--model", "gpt2", "--checkpoint", "selective"][..],
    ] {
        let out = Command::new(binary())
            .args(["formula", "--device", "sim"])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains("selective"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn one_configuration_prints_its_terms_and_the_dry_run() {
    let out = Command::new(binary())
        .args([
            "formula", "--device", "sim", "--model", "gpt2", "--layers", "2",
        ])
        .args([
            "--d-model",
            "32",
            "--nhead",
            "2",
            "--vocab",
            "64",
            "--batch",
            "2",
            "--seq",
            "16",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("ln_1 input"), "{text}");
    assert!(text.contains("log-softmax of the logits"), "{text}");
    let row = text
        .lines()
        .rfind(|l| l.starts_with("| flags"))
        .expect("a comparison row");
    assert!(!row.contains("not in the terms"), "{row}");
}
