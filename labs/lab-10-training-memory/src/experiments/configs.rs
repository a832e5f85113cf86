//! The configurations chapter 10 compares, as the flags `lab-10 train` and
//! `ci/pytorch-train.py` both take: the single list that `lab-10` (no subcommand) runs
//! and that `ci/train-compare.py` reads from `lab-10 configs`.
//!
//! Each configuration is a model (the tutorial's `nn.Transformer(d_model=256)`, or a
//! GPT-2) and one technique; its name is `<model>-<technique>`, the name of its picture
//! and its key in train-compare's JSON lines. The sizes depend on the [`Scale`]: the
//! chapter's on a GPU, smaller where the kernels run on the CPU.

use anyhow::Result;
use labs_core::Device;
use serde::Serialize;

use labs_train::{parse_flags, TrainConfig};

/// Which model a configuration trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Tutorial 004's `nn.Transformer(d_model=256)` with Adam (sections 1, 2 and 4).
    Tutorial,
    /// GPT-2 with AdamW (section 3).
    Gpt2,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Tutorial => "tutorial",
            Family::Gpt2 => "gpt2",
        }
    }
}

/// One technique: its name in file and configuration names, its label in the tables,
/// the flags that switch it on, and whether it splits the batch into 4 micro-batches.
struct Technique {
    name: &'static str,
    label: &'static str,
    flags: &'static str,
    accumulate: bool,
}

const fn technique(name: &'static str, label: &'static str, flags: &'static str) -> Technique {
    Technique {
        name,
        label,
        flags,
        accumulate: false,
    }
}

/// Micro-batches per step in the accumulation rows.
pub const ACCUM: usize = 4;

/// Section 2: the tutorial's model, the techniques one at a time.
const TUTORIAL_TECHNIQUES: &[Technique] = &[
    technique("none", "none", ""),
    Technique {
        name: "accum4",
        label: "accumulation",
        flags: "",
        accumulate: true,
    },
    technique("ckpt-layers", "checkpoint layers", "--checkpoint layers"),
    technique(
        "ckpt-selective",
        "checkpoint selective",
        "--checkpoint selective",
    ),
    technique("offload", "offload", "--offload"),
    // A share the host link carries while forward computes (section 6).
    technique("offload-20", "offload 20%", "--offload --offload-share 0.2"),
    technique("naive-attention", "naive attention", "--attention naive"),
    technique("bf16", "bf16 autocast", "--amp bf16"),
    technique("f16", "f16 autocast + GradScaler", "--amp f16"),
];

/// Section 3: GPT-2, float32 and bfloat16, with and without checkpointing.
const GPT2_TECHNIQUES: &[Technique] = &[
    technique("none", "f32", ""),
    technique(
        "ckpt-layers",
        "f32 + checkpoint layers",
        "--checkpoint layers",
    ),
    technique("bf16", "bf16", "--amp bf16"),
    technique(
        "bf16-ckpt-layers",
        "bf16 + checkpoint layers",
        "--amp bf16 --checkpoint layers",
    ),
    technique(
        "ckpt-selective",
        "checkpoint selective",
        "--checkpoint selective",
    ),
    technique("offload", "offload", "--offload"),
    technique(
        "offload-25",
        "offload 25%",
        "--offload --offload-share 0.25",
    ),
    technique("naive-attention", "naive attention", "--attention naive"),
];

/// How large the experiments are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// On a GPU: the tutorial's model at batch 64 and GPT-2 small (124 M parameters)
    /// at batch 8 x 1024.
    Full,
    /// On a GPU with `--quick`: the tutorial's model, and a GPT-2 of 4 blocks, d_model
    /// 256, at batch 8 x 256.
    Quick,
    /// On the simulated GPU, whose kernels run on the CPU: the tutorial's model and a
    /// GPT-2 scaled down (d_model 128, 2 layers; batch 16 x 50 and 4 x 128), 2 steps each
    /// (the peaks are reached by the second step; times mean nothing here).
    Sim,
    /// On the simulated GPU with `--quick`: tiny models, for smoke tests.
    Tiny,
}

impl Scale {
    /// The scale the experiments take on `device`.
    pub fn for_device(device: &Device, quick: bool) -> Scale {
        match (device.is_cuda(), quick) {
            (true, false) => Scale::Full,
            (true, true) => Scale::Quick,
            (false, false) => Scale::Sim,
            (false, true) => Scale::Tiny,
        }
    }

    /// The tutorial model's flags (batch and sequence left out), its batch and its
    /// sequence length.
    fn tutorial(self) -> (&'static str, usize, usize) {
        match self {
            Scale::Sim => (
                "--model transformer --d-model 128 --nhead 4 --layers 2 --ffn 512",
                16,
                50,
            ),
            Scale::Tiny => (
                "--model transformer --d-model 32 --nhead 2 --layers 1 --ffn 64",
                8,
                16,
            ),
            Scale::Full | Scale::Quick => (TUTORIAL_MODEL, TUTORIAL_BATCH, TUTORIAL_SEQ),
        }
    }

    /// GPT-2's flags (batch left out) and its batch.
    fn gpt2(self) -> (&'static str, usize, usize) {
        match self {
            Scale::Full => ("--model gpt2 --optimizer adamw", 8, 1024),
            Scale::Quick => (
                "--model gpt2 --optimizer adamw --layers 4 --d-model 256 --nhead 4",
                8,
                256,
            ),
            Scale::Sim => (
                "--model gpt2 --optimizer adamw --layers 2 --d-model 128 --nhead 4 --vocab 4096",
                4,
                128,
            ),
            Scale::Tiny => (
                "--model gpt2 --optimizer adamw --layers 1 --d-model 32 --nhead 2 --vocab 64",
                2,
                32,
            ),
        }
    }

    /// Flags every configuration of this scale adds (fewer steps off the GPU).
    fn common(self) -> &'static str {
        match self {
            Scale::Full | Scale::Quick => "",
            Scale::Sim | Scale::Tiny => "--steps 2 --warmup 1",
        }
    }

    /// What section 3's heading says the GPT-2 is.
    pub fn gpt2_description(self) -> &'static str {
        match self {
            Scale::Full => "GPT-2 small (124 M parameters), batch 8 x 1024, AdamW",
            Scale::Quick => {
                "a scaled-down GPT-2 (4 blocks, d_model 256, 4 heads, vocabulary 50257), \
                 batch 8 x 256, AdamW, in place of GPT-2 small"
            }
            Scale::Sim => {
                "a scaled-down GPT-2 (2 blocks, d_model 128, 4 heads, vocabulary 4096), \
                 batch 4 x 128, AdamW, in place of GPT-2 small"
            }
            Scale::Tiny => {
                "a tiny GPT-2 (1 block, d_model 32, vocabulary 64), batch 2 x 32, AdamW, in \
                 place of GPT-2 small"
            }
        }
    }
}

/// The tutorial's model: `nn.Transformer(d_model=256)`, its other sizes the defaults.
pub const TUTORIAL_MODEL: &str = "--model transformer --d-model 256";
/// The tutorial's batch: 64 sequences of 100 (batch first here).
pub const TUTORIAL_BATCH: usize = 64;
pub const TUTORIAL_SEQ: usize = 100;

/// One configuration of the chapter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Configuration {
    /// `<model>-<technique>`: the picture's file name and train-compare's key.
    pub name: String,
    pub family: Family,
    /// The technique, as the tables label it.
    pub label: String,
    /// The flags both drivers take.
    pub flags: String,
}

impl Configuration {
    fn new(scale: Scale, family: Family, t: &Technique) -> Configuration {
        let (model, batch, seq) = match family {
            Family::Tutorial => scale.tutorial(),
            Family::Gpt2 => scale.gpt2(),
        };
        let batch = match t.accumulate {
            true => format!("--batch {} --accum {ACCUM}", batch / ACCUM),
            false => format!("--batch {batch}"),
        };
        let seq = format!("--seq {seq}");
        let flags = join(&[model, &batch, &seq, t.flags, scale.common()]);
        Configuration {
            name: format!("{}-{}", family.name(), t.name),
            family,
            label: t.label.to_string(),
            flags,
        }
    }

    /// The run these flags describe.
    pub fn train_config(&self) -> Result<TrainConfig> {
        parse_flags(&self.flags)
    }

    /// Whether attention runs the fused kernel (the path whose peak must not exceed
    /// PyTorch's).
    pub fn fused(&self) -> bool {
        !self.flags.contains("--attention naive")
    }
}

/// Every configuration of sections 2 and 3 at `scale`, tutorial first.
pub fn configurations(scale: Scale) -> Vec<Configuration> {
    let tutorial = TUTORIAL_TECHNIQUES
        .iter()
        .map(|t| Configuration::new(scale, Family::Tutorial, t));
    let gpt2 = GPT2_TECHNIQUES
        .iter()
        .map(|t| Configuration::new(scale, Family::Gpt2, t));
    tutorial.chain(gpt2).collect()
}

/// Section 1's extra runs (ours only): the tutorial's own shapes. Its model is not
/// `batch_first`, so its `(64, 100, 256)` input is 64 positions of 100 sequences, and its
/// micro-batches of 16 are 16 positions of the same 100 sequences.
pub fn tutorial_shapes(scale: Scale) -> Vec<Configuration> {
    let (model, batch, seq) = scale.tutorial();
    [
        ("tutorial-shape-b64", "one step", batch, 1),
        (
            "tutorial-shape-accum4",
            "4 accumulated",
            batch / ACCUM,
            ACCUM,
        ),
    ]
    .into_iter()
    .map(|(name, label, positions, accum)| {
        // `seq` sequences of `positions` each: the tutorial's dimension 0 is time.
        let shape = format!("--batch {seq} --seq {positions} --accum {accum}");
        Configuration {
            name: name.to_string(),
            family: Family::Tutorial,
            label: label.to_string(),
            flags: join(&[model, &shape, scale.common()]),
        }
    })
    .collect()
}

/// The non-empty flag groups, space-separated.
fn join(groups: &[&str]) -> String {
    let kept: Vec<&str> = groups.iter().copied().filter(|g| !g.is_empty()).collect();
    kept.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_parses_and_names_are_unique() {
        for scale in [Scale::Full, Scale::Quick, Scale::Sim, Scale::Tiny] {
            let all: Vec<_> = configurations(scale)
                .into_iter()
                .chain(tutorial_shapes(scale))
                .collect();
            let mut names: Vec<_> = all.iter().map(|c| c.name.clone()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), all.len(), "{scale:?}");
            for c in &all {
                c.train_config().unwrap();
            }
        }
    }

    #[test]
    fn the_chapter_s_sizes() {
        let all = configurations(Scale::Full);
        let none = all[0].train_config().unwrap();
        assert_eq!(
            (none.d_model, none.batch, none.seq, none.accum),
            (256, 64, 100, 1)
        );
        let accum = all[1].train_config().unwrap();
        assert_eq!((accum.batch, accum.accum), (16, 4));
        let gpt2 = all.iter().find(|c| c.name == "gpt2-none").unwrap();
        let g = gpt2.train_config().unwrap();
        assert_eq!((g.d_model, g.layers, g.batch, g.seq), (768, 12, 8, 1024));
        let shape = tutorial_shapes(Scale::Full)[0].train_config().unwrap();
        assert_eq!((shape.batch, shape.seq), (100, 64));
    }
}
