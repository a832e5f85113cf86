//! What a training run is: the model and its sizes, the batch, and the memory
//! techniques in use. [`TrainConfig`] is what the command line fills in and what other
//! labs and tests build directly; [`TrainConfig::validate`] refuses what cannot run,
//! with the flag's name in the message.

use anyhow::{bail, Result};
use serde::Serialize;

/// The model trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// `nn.Transformer` (encoder-decoder), regressing random targets with MSE.
    Transformer,
    /// A GPT-2 language model on random tokens, cross-entropy on the next token.
    Gpt2,
}

/// `--checkpoint`: how each layer (block) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointMode {
    None,
    /// Every layer in a checkpoint: its activations recomputed in backward.
    Layers,
    /// Every layer in a selective checkpoint: matmul and attention outputs kept.
    Selective,
}

/// `--attention`: the scaled-dot-product-attention backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AttentionMode {
    Naive,
    Fused,
}

/// `--amp`: autocast's dtype, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AmpMode {
    None,
    Bf16,
    /// Float16, with a gradient scaler.
    F16,
}

/// `--optimizer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Adam,
    Adamw,
    Sgd,
}

/// A training run, every flag of `lab-10 train`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainConfig {
    pub model: ModelKind,
    pub d_model: usize,
    pub nhead: usize,
    /// Encoder and decoder layers each (transformer), blocks (gpt2).
    pub layers: usize,
    /// The feed-forward width: `dim_feedforward` (transformer); 4 d_model (gpt2).
    pub ffn: usize,
    /// The vocabulary (gpt2; unused by the transformer).
    pub vocab: usize,
    /// The token table and the head have `vocab` rounded up to a multiple of this
    /// (nanoGPT's and llm.c's 50,304 for GPT-2's 50,257 with 64): products whose width is
    /// a multiple of 64 run on the GPU's fast paths. The extra rows are never a token or
    /// a target. 1: the vocabulary as it is.
    pub vocab_multiple: usize,
    pub dropout: f32,
    /// The micro-batch.
    pub batch: usize,
    pub seq: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Micro-batches per optimizer step.
    pub accum: usize,
    pub checkpoint: CheckpointMode,
    pub offload: bool,
    /// The share of the saved bytes offloaded (`OffloadOptions::share`; 1: all).
    pub offload_share: f64,
    /// Saved tensors smaller than this stay on the device when offloading
    /// (`OffloadOptions::min_bytes`); not a flag.
    pub offload_min_bytes: usize,
    /// Bytes of tensors being copied to the host that the offload may hold beside the
    /// newest before the compute stream waits for the oldest copy
    /// (`OffloadOptions::max_in_flight_bytes`; ours only: PyTorch's `save_on_cpu`
    /// copies on the compute stream).
    pub offload_in_flight: usize,
    pub attention: AttentionMode,
    /// `--fused-classifier` (gpt2): `Some(rows)` computes the LM head and its
    /// cross-entropy as one `linear_cross_entropy` over chunks of that many positions
    /// (`--classifier-chunk`), never holding the whole logits; `None`: the logits, then
    /// `cross_entropy`. Left out of the JSON when off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fused_classifier: Option<usize>,
    pub amp: AmpMode,
    pub optimizer: OptimizerKind,
    pub lr: f64,
    pub seed: u64,
    /// Steps left out of `step_ms` (with none left, `step_ms` is null).
    pub warmup: usize,
    /// Record the bytes of every allocation category over the last optimizer step (the
    /// report's `timeline`, drawn by `--timeline FILE`). Off by default: it adds a
    /// sample per allocator event to the step it records.
    pub timeline: bool,
    /// `--graph`: after the warm-up steps, the step (every micro-batch's forward and
    /// backward, the optimizer step) is captured once as a CUDA graph and replayed,
    /// with fresh data copied into the captured inputs; its memory is the graph's
    /// private pool. Left out of the JSON when off.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub graph: bool,
}

/// The bytes of copies to the host the offload may hold beside the newest, by
/// default. The library holds none (the newest alone); here, 32 MiB lets forward run
/// past two copies saved close together (an attention's output, then the next layer's
/// input) instead of waiting for the first, so that more of the copy time hides behind
/// compute at the same allocated peak (the offload rows of `lab-10`'s tables show it);
/// the dry run shows no peak it raises.
pub const OFFLOAD_IN_FLIGHT_BYTES: usize = 32 << 20;

/// The positions per chunk of `--fused-classifier` unless `--classifier-chunk` says: a
/// quarter of a batch of 8 x 1024. Smaller chunks hold less, but the softmax kernels
/// (a warp per row) then have too few rows to keep the GPU busy: the step takes longer.
pub const CLASSIFIER_CHUNK_ROWS: usize = 2048;

/// The largest `--vocab-multiple`: padding beyond it buys nothing.
pub const MAX_VOCAB_MULTIPLE: usize = 1 << 16;

impl TrainConfig {
    /// `nn.Transformer`'s defaults: d_model 512, 8 heads, 6 + 6 layers, feed-forward
    /// 2048, dropout 0.1; a batch of 1 sequence of 100.
    pub fn transformer() -> TrainConfig {
        TrainConfig {
            model: ModelKind::Transformer,
            d_model: 512,
            nhead: 8,
            layers: 6,
            ffn: 2048,
            vocab: 50257,
            vocab_multiple: 1,
            dropout: 0.1,
            batch: 1,
            seq: 100,
            steps: 5,
            accum: 1,
            checkpoint: CheckpointMode::None,
            offload: false,
            offload_share: 1.0,
            offload_min_bytes: labs_core::autograd::OffloadOptions::default().min_bytes,
            offload_in_flight: OFFLOAD_IN_FLIGHT_BYTES,
            timeline: false,
            graph: false,
            attention: AttentionMode::Fused,
            fused_classifier: None,
            amp: AmpMode::None,
            optimizer: OptimizerKind::Adam,
            lr: 1e-3,
            seed: 0,
            warmup: 1,
        }
    }

    /// GPT-2 small's sizes: d_model 768, 12 heads, 12 blocks, vocabulary 50257,
    /// dropout 0; a batch of 1 sequence of 1024.
    pub fn gpt2() -> TrainConfig {
        TrainConfig {
            model: ModelKind::Gpt2,
            d_model: 768,
            nhead: 12,
            layers: 12,
            ffn: 4 * 768,
            dropout: 0.0,
            seq: 1024,
            ..TrainConfig::transformer()
        }
    }

    /// The defaults of `model`.
    pub fn defaults(model: ModelKind) -> TrainConfig {
        match model {
            ModelKind::Transformer => TrainConfig::transformer(),
            ModelKind::Gpt2 => TrainConfig::gpt2(),
        }
    }

    /// The rows of GPT-2's token table and head: `vocab` rounded up to a multiple of
    /// `vocab_multiple`.
    pub fn padded_vocab(&self) -> usize {
        let m = self.vocab_multiple.max(1);
        self.vocab.div_ceil(m).saturating_mul(m)
    }

    /// GPT-2's position table: `max(seq, 1024)` rows.
    pub fn gpt2_positions(&self) -> usize {
        self.seq.max(1024)
    }

    /// Refuses sizes and combinations that cannot run: zero sizes, and sizes whose
    /// memory overflows or exceeds [`labs_core::cli::MAX_SIZED_BYTES`] (checked before
    /// anything is allocated in proportion to them), with the flag's name in the message.
    pub fn validate(&self) -> Result<()> {
        for (flag, v) in [
            ("--d-model", self.d_model),
            ("--nhead", self.nhead),
            ("--layers", self.layers),
            ("--ffn", self.ffn),
            ("--batch", self.batch),
            ("--seq", self.seq),
            ("--steps", self.steps),
            ("--accum", self.accum),
        ] {
            if v == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        if self.model == ModelKind::Gpt2 && self.vocab == 0 {
            bail!("--vocab must be at least 1");
        }
        if self.vocab_multiple == 0 {
            bail!("--vocab-multiple must be at least 1");
        }
        if self.vocab_multiple > MAX_VOCAB_MULTIPLE {
            bail!(
                "--vocab-multiple {}: at most {MAX_VOCAB_MULTIPLE}",
                self.vocab_multiple
            );
        }
        self.check_sizes()?;
        if !self.d_model.is_multiple_of(self.nhead) {
            bail!(
                "--d-model {} must be divisible by --nhead {}",
                self.d_model,
                self.nhead
            );
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("--dropout {} must be in [0, 1)", self.dropout);
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr {} must be a positive number", self.lr);
        }
        if self.graph {
            self.validate_graph()?;
        }
        match self.fused_classifier {
            Some(_) if self.model != ModelKind::Gpt2 => {
                bail!("--fused-classifier applies to --model gpt2 (the transformer has no classifier)")
            }
            Some(0) => bail!("--classifier-chunk must be at least 1"),
            _ => {}
        }
        if self.model == ModelKind::Gpt2 && Some(self.ffn) != self.d_model.checked_mul(4) {
            bail!(
                "--ffn {}: GPT-2's feed-forward width is 4 x d_model = {}; it takes no other",
                self.ffn,
                4 * self.d_model
            );
        }
        Ok(())
    }

    /// The sizes' products, in checked arithmetic: the parameters (with their gradients
    /// and optimizer state), the inputs and the largest activations.
    fn check_sizes(&self) -> Result<()> {
        let (d, ffn, seq, batch) = (
            ("--d-model", self.d_model),
            ("--ffn", self.ffn),
            ("--seq", self.seq),
            ("--batch", self.batch),
        );
        let micro = self.steps.checked_mul(self.accum);
        if micro.is_none_or(|m| m > MAX_MICRO_BATCHES) {
            bail!(
                "--steps {} x --accum {}: at most {MAX_MICRO_BATCHES} micro-batches in a run",
                self.steps,
                self.accum
            );
        }
        if self.layers > MAX_LAYERS {
            bail!("--layers {}: at most {MAX_LAYERS} layers", self.layers);
        }
        // Each parameter costs itself, its gradient and (Adam) two moments.
        const PER_PARAMETER: u64 = 4 * 4;
        let square = bounded("a d_model x d_model weight", &[d, d], PER_PARAMETER)?;
        let block = match self.model {
            ModelKind::Transformer => {
                // An encoder and a decoder layer: three attentions, two feed-forwards.
                let ff = bounded("a feed-forward weight", &[ffn, d], PER_PARAMETER)?;
                12 * square + 4 * ff
            }
            ModelKind::Gpt2 => {
                let vocab = ("--vocab", self.padded_vocab());
                bounded("the token embedding", &[vocab, d], PER_PARAMETER)?;
                let positions = ("--seq", self.gpt2_positions());
                bounded("the position embedding", &[positions, d], PER_PARAMETER)?;
                bounded("the logits", &[batch, seq, vocab], 4)?;
                12 * square
            }
        };
        bounded(
            "the layers' parameters",
            &[("--layers", self.layers)],
            block,
        )?;
        bounded("a micro-batch's activations", &[batch, seq, d], 4)?;
        bounded(
            "a micro-batch's feed-forward activations",
            &[batch, seq, ffn],
            4,
        )?;
        bounded(
            "a micro-batch's attention scores",
            &[batch, ("--nhead", self.nhead), seq, seq],
            4,
        )?;
        Ok(())
    }
}

/// The most micro-batches a run may train (`--steps` x `--accum`).
pub const MAX_MICRO_BATCHES: usize = 1_000_000;

/// The most layers (`--layers`) a model may have.
pub const MAX_LAYERS: usize = 10_000;

/// [`labs_core::cli::sized`], as this crate's error.
fn bounded(what: &str, factors: &[(&str, usize)], each: u64) -> Result<u64> {
    Ok(labs_core::cli::sized(what, factors, each)?)
}

impl TrainConfig {
    /// What `--graph` cannot capture, each refused with its reason: a replay repeats
    /// the captured work exactly, and a capture forbids waiting on the host.
    fn validate_graph(&self) -> Result<()> {
        if self.warmup == 0 {
            bail!("--graph needs --warmup 1 or more: the steps before the capture run eagerly, making the optimizer's state");
        }
        if self.dropout > 0.0 {
            bail!(
                "--graph with --dropout {}: a replay would draw the same dropout mask at every step (the generator's offset is fixed in the graph); use --dropout 0",
                self.dropout
            );
        }
        if self.offload {
            bail!("--graph and --offload: the offload's copies wait on events across streams, which a capture of one stream forbids");
        }
        if self.amp == AmpMode::F16 {
            bail!("--graph and --amp f16: the gradient scaler reads its overflow flag on the host every step; use --amp bf16");
        }
        Ok(())
    }
}
