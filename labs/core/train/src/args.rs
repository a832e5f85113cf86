//! `lab-10 train`'s flags as a clap [`TrainArgs`], in the library so that the
//! experiments describe each configuration as the flags a reader (and
//! `ci/pytorch-train.py`, which takes the same ones) would type: one meaning per flag.

use anyhow::{Context, Result};
use clap::{Args, Parser};

use super::config::{
    AmpMode, AttentionMode, CheckpointMode, ModelKind, OptimizerKind, TrainConfig,
    CLASSIFIER_CHUNK_ROWS,
};
use super::step::DataParallel;

#[derive(Args)]
pub struct TrainArgs {
    /// The model.
    #[arg(long, value_enum, default_value = "transformer")]
    pub model: ModelKind,
    /// Model width (default: transformer 512, gpt2 768).
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Attention heads (default: transformer 8, gpt2 12).
    #[arg(long)]
    pub nhead: Option<usize>,
    /// Encoder and decoder layers each (transformer, default 6), blocks (gpt2,
    /// default 12).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Feed-forward width (transformer, default 2048; gpt2 takes only 4 x d_model).
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Vocabulary (gpt2, default 50257).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Round the token table and the head up to a multiple of N rows (gpt2; nanoGPT's
    /// 50,304 is 64): the extra rows are never a token or a target, and the head's
    /// products run on the GPU's fast paths.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vocab_multiple: usize,
    /// Dropout (default: transformer 0.1, gpt2 0.0).
    #[arg(long)]
    pub dropout: Option<f32>,
    /// The micro-batch.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Sequence length (default: transformer 100, gpt2 1024).
    #[arg(long)]
    pub seq: Option<usize>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub accum: usize,
    /// Activation checkpointing: none, every layer (layers), or every layer keeping
    /// matmul and attention outputs (selective).
    #[arg(long, value_enum, default_value = "none")]
    pub checkpoint: CheckpointMode,
    /// Offload saved activations to pinned host memory during forward.
    #[arg(long)]
    pub offload: bool,
    /// With --offload, the share of the saved bytes sent to the host (0 < share <= 1),
    /// spread evenly through forward; the rest stays on the device. A share that the
    /// host link carries in the compute's time keeps the copies hidden.
    #[arg(long, requires = "offload", value_parser = parse_share, default_value_t = 1.0)]
    pub offload_share: f64,
    /// With --offload, the bytes of tensors being copied out that may be held beside
    /// the newest before compute waits for the oldest copy (default 32MiB; 0 holds the
    /// newest alone): more lets forward run on past copies saved close together, at
    /// the cost of the memory held. Ours only: PyTorch's save_on_cpu copies on the
    /// compute stream.
    #[arg(long, requires = "offload", value_name = "SIZE", value_parser = labs_core::format::parse_bytes)]
    pub offload_in_flight: Option<u64>,
    /// The attention kernel: naive (math) or fused.
    #[arg(long, value_enum, default_value = "fused")]
    pub attention: AttentionMode,
    /// GPT-2's LM head and its cross-entropy as one fused op over chunks of positions
    /// (Liger-Kernel's and llm.c's classifier): never the whole logits.
    #[arg(long)]
    pub fused_classifier: bool,
    /// With --fused-classifier, the positions per chunk (default 2048): fewer hold less
    /// memory and take longer.
    #[arg(long, requires = "fused_classifier", value_name = "ROWS", value_parser = parse_rows)]
    pub classifier_chunk: Option<usize>,
    /// After the warm-up steps, capture the step (forward, backward, optimizer) once as
    /// a CUDA graph and replay it, fresh data copied into its inputs: no launch
    /// overhead, and the step's memory in the graph's private pool. Adam and AdamW
    /// become capturable (their step counts on the device).
    #[arg(long)]
    pub graph: bool,
    /// Mixed precision: none, bf16, or f16 (with a gradient scaler).
    #[arg(long, value_enum, default_value = "none")]
    pub amp: AmpMode,
    /// The optimizer.
    #[arg(long, value_enum, default_value = "adam")]
    pub optimizer: OptimizerKind,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Seed of the model's initial values and of the data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Steps left out of the step time.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Time every kernel launch with events and print the kernel families by GPU time
    /// to stderr: where a step's time goes.
    #[arg(long)]
    pub profile: bool,
    /// Data-parallel training on N devices, one rank each (as `torchrun
    /// --nproc_per_node N`): on GPUs, N processes started through `dist::launch`; on
    /// the simulated or dry-run device, N threads over N simulated devices.
    #[arg(long, value_name = "N")]
    pub nproc: Option<usize>,
    /// Data-parallel with DistributedDataParallel, even on one rank (implied by
    /// --nproc, and when WORLD_SIZE is set by a launcher).
    #[arg(long)]
    pub ddp: bool,
    /// Data-parallel with ZeRO stage 1 instead of DDP: the optimizer's state sharded
    /// across the ranks, the gradients reduce-scattered.
    #[arg(long)]
    pub zero1: bool,
    /// Data-parallel with ZeRO stage 2: the gradients too are reduce-scattered, bucket
    /// by bucket during backward, and each rank keeps only its shard of them.
    #[arg(long, conflicts_with = "zero1")]
    pub zero2: bool,
    /// Data-parallel with ZeRO stage 3 (FSDP): the parameters too are sharded, each
    /// layer's gathered for its forward and again for its backward, then freed.
    #[arg(long, conflicts_with_all = ["zero1", "zero2"])]
    pub zero3: bool,
    /// Draw where the memory goes over the last step, by allocation category (stacked
    /// areas, the cache on top), into this SVG file.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<std::path::PathBuf>,
    /// Record the allocator's history over the whole run, from before the model is
    /// built, and write a memory snapshot (JSON: segments, blocks, the trace with
    /// each allocation's category) to FILE at the end, for `lab-03 summary`, `plot`
    /// and `compare`. With --nproc, one file per rank: FILE.rank0, FILE.rank1, ….
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<std::path::PathBuf>,
    /// With --snapshot, record each allocation's call site too: a backtrace per
    /// allocation and free, which slows the run (and its step times) noticeably.
    #[arg(long, requires = "snapshot")]
    pub snapshot_stacks: bool,
}

impl TrainArgs {
    /// Whether the flags ask for a data-parallel run (`--nproc`, `--ddp`, `--zero1`,
    /// `--zero2`, `--zero3`).
    pub fn data_parallel(&self) -> bool {
        self.nproc.is_some() || self.ddp || self.zero1 || self.zero2 || self.zero3
    }

    /// How the ranks of a data-parallel run share the work: DDP unless a ZeRO stage is
    /// asked for.
    pub fn how(&self) -> DataParallel {
        if self.zero3 {
            DataParallel::Zero3
        } else if self.zero2 {
            DataParallel::Zero2
        } else if self.zero1 {
            DataParallel::Zero1
        } else {
            DataParallel::Ddp
        }
    }

    pub fn config(&self) -> TrainConfig {
        let d = TrainConfig::defaults(self.model);
        let d_model = self.d_model.unwrap_or(d.d_model);
        let ffn = match self.model {
            ModelKind::Transformer => d.ffn,
            // Saturated: `validate` refuses a width whose products overflow.
            ModelKind::Gpt2 => d_model.saturating_mul(4),
        };
        TrainConfig {
            model: self.model,
            d_model,
            nhead: self.nhead.unwrap_or(d.nhead),
            layers: self.layers.unwrap_or(d.layers),
            ffn: self.ffn.unwrap_or(ffn),
            vocab: self.vocab.unwrap_or(d.vocab),
            vocab_multiple: self.vocab_multiple,
            dropout: self.dropout.unwrap_or(d.dropout),
            batch: self.batch,
            seq: self.seq.unwrap_or(d.seq),
            steps: self.steps,
            accum: self.accum,
            checkpoint: self.checkpoint,
            offload: self.offload,
            offload_share: self.offload_share,
            offload_min_bytes: d.offload_min_bytes,
            offload_in_flight: self
                .offload_in_flight
                .map_or(d.offload_in_flight, |b| b as usize),
            attention: self.attention,
            fused_classifier: self
                .fused_classifier
                .then(|| self.classifier_chunk.unwrap_or(CLASSIFIER_CHUNK_ROWS)),
            amp: self.amp,
            optimizer: self.optimizer,
            lr: self.lr,
            seed: self.seed,
            warmup: self.warmup,
            timeline: self.timeline.is_some(),
            graph: self.graph,
        }
    }
}

/// A parser of [`TrainArgs`] alone, for flags held as text.
#[derive(Parser)]
#[command(name = "train", no_binary_name = true, args_override_self = true)]
struct FlagsOnly {
    #[command(flatten)]
    args: TrainArgs,
}

/// `flags` (as `lab-10 train` takes them, split at white space) as [`TrainArgs`],
/// their configuration validated: for a caller that also needs the flags beyond the
/// configuration (data parallelism, the outputs asked for).
pub fn parse_train_args(flags: &str) -> Result<TrainArgs> {
    let parsed = FlagsOnly::try_parse_from(flags.split_whitespace())
        .with_context(|| format!("the flags {flags:?}"))?;
    parsed.args.config().validate()?;
    Ok(parsed.args)
}

/// The configuration that `flags` (as `lab-10 train` takes them, split at white space)
/// describe, validated.
pub fn parse_flags(flags: &str) -> Result<TrainConfig> {
    Ok(parse_train_args(flags)?.config())
}

/// A share in (0, 1], for `--offload-share`.
fn parse_share(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number (a share such as 0.25)"))?;
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!(
            "{s} is not a share: give a number above 0 and at most 1"
        ));
    }
    Ok(v)
}

/// A count of rows of at least 1, for `--classifier-chunk`.
fn parse_rows(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 rows: give at least 1".to_string()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("{s:?} is not a number of rows (such as 1024)")),
    }
}
