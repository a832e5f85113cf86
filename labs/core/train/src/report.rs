//! What a run reports: [`TrainReport`], printed as one JSON object (`--json`, the
//! fields `ci/pytorch-train.py` prints for PyTorch) or as tables.

use std::collections::BTreeMap;

use labs_core::autograd::{CopyTimes, OffloadStats};
use labs_core::format::bytes;
use labs_core::table::Table;
use serde::Serialize;

use super::config::{AmpMode, CheckpointMode, ModelKind, TrainConfig};
use super::step::amp_name;

/// What the offload hooks did (`OffloadStats`), and how long their copies took.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OffloadReport {
    /// Saved tensors copied to pinned host memory, and their bytes.
    pub offloaded: usize,
    pub offloaded_bytes: u64,
    /// Saved tensors left on the device (parameters, tensors under the threshold).
    pub kept_on_device: usize,
    /// Tensors that could have gone but stayed to hold `--offload-share`, and their
    /// bytes.
    pub kept_for_share: usize,
    pub kept_for_share_bytes: u64,
    /// What the share is kept on, summed over forward passes: the bytes of the
    /// distinct storages sent, and of those that could have gone (equal without
    /// `--offload-share`).
    pub share_sent_bytes: u64,
    pub share_could_bytes: u64,
    /// Bytes copied to the host: below `offloaded_bytes` where views of one storage
    /// shared one copy.
    pub copied_out_bytes: u64,
    /// Tensors whose copy back a prefetch had started before backward needed them.
    pub prefetched: usize,
    /// Tensors copied back only when backward needed them.
    pub fetched_on_demand: usize,
    /// Milliseconds the copies kept the copy stream busy in the median timed step:
    /// out to the host, back to the device, and both (null on the dry-run device or
    /// with no timed step). Against the step time without offload, this tells how much
    /// of the copying compute hid.
    pub copy_out_ms: Option<f64>,
    pub copy_back_ms: Option<f64>,
    pub copy_ms: Option<f64>,
}

impl OffloadReport {
    /// The hooks' counts, and the copy times of the timed steps.
    pub fn new(s: OffloadStats, copy_times: &[CopyTimes]) -> OffloadReport {
        let median =
            |f: fn(&CopyTimes) -> f64| super::measure::median(copy_times.iter().map(f).collect());
        OffloadReport {
            offloaded: s.offloaded,
            offloaded_bytes: s.offloaded_bytes,
            kept_on_device: s.kept_on_device,
            kept_for_share: s.kept_for_share,
            kept_for_share_bytes: s.kept_for_share_bytes,
            share_sent_bytes: s.share_sent_bytes,
            share_could_bytes: s.share_could_bytes,
            copied_out_bytes: s.copied_out_bytes,
            prefetched: s.prefetched,
            fetched_on_demand: s.fetched_on_demand,
            copy_out_ms: median(|t| t.out_ms),
            copy_back_ms: median(|t| t.back_ms),
            copy_ms: median(CopyTimes::total_ms),
        }
    }
}

/// One rank's figures in a data-parallel run (PyTorch's twin reports the same under
/// `ranks`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankFigures {
    pub rank: usize,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub step_ms: Option<f64>,
}

/// A run's figures. Bytes are the allocator's, over the whole run from just after the
/// model and optimizer were made (parameters allocated, no optimizer state yet).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainReport {
    pub model: ModelKind,
    /// The effective configuration: every flag, defaults filled in.
    pub config: TrainConfig,
    /// The device's name (`sim:0`, `cuda:0`, `dry:0`).
    pub device: String,
    /// The device allocator's configuration, in `LABS_ALLOC_CONF`'s syntax
    /// (`expandable_segments:False` for PyTorch's defaults).
    pub allocator: String,
    /// Parameter elements.
    pub params: usize,
    /// `max_memory_allocated`, bytes.
    pub peak_allocated: u64,
    /// `max_memory_reserved`, bytes.
    pub peak_reserved: u64,
    /// Allocated bytes by category at the moment of the allocated peak.
    pub by_category: BTreeMap<String, u64>,
    /// The matrix products' workspace the device's allocator lent to cuBLAS (32 MiB on
    /// an H100, none on the simulated GPU): part of the peaks, in `other`.
    pub gemm_workspace_bytes: u64,
    /// The median time of the steps after the warm-up ones, ms; null on the dry-run
    /// device, or when no step is left after the warm-up.
    pub step_ms: Option<f64>,
    /// One mean loss per optimizer step done; null on the dry-run device.
    pub losses: Option<Vec<f64>>,
    /// Attention calls served by the fused kernel and by the math path (a checkpointed
    /// layer's recomputation counts its calls again).
    pub attention_fused_calls: u64,
    pub attention_math_calls: u64,
    /// Steps the gradient scaler skipped (float16 only, else null).
    pub skipped_steps: Option<usize>,
    /// What activation offload did (with `--offload`, else null).
    pub offload: Option<OffloadReport>,
    /// Out-of-memory errors during the run.
    pub num_ooms: u64,
    /// The out-of-memory error that ended the run, if one did.
    pub oom: Option<String>,
    /// The ranks of a data-parallel run (1 without one); the figures above are rank
    /// 0's.
    pub world_size: usize,
    /// `ddp`, `zero1` or `zero2` in a data-parallel run, else null.
    pub data_parallel: Option<String>,
    /// The job's throughput: samples (sequences) of every rank per second of rank 0's
    /// median step; null when `step_ms` is.
    pub samples_per_s: Option<f64>,
    /// The model's FLOPs in one optimizer step of a rank (6 per parameter per token,
    /// and the attention's products: [`crate::flops`]).
    pub model_flops_per_step: f64,
    /// The GPU's dense peak for the run's matrix products, FLOP/s, where the table of
    /// [`crate::flops::peak_flops`] knows the GPU, else null.
    pub peak_flops: Option<f64>,
    /// Model FLOP utilisation: the FLOPs of a step over its median time and the peak;
    /// null without either.
    pub mfu: Option<f64>,
    /// Every rank's peaks and median step in a data-parallel run, else null.
    pub ranks: Option<Vec<RankFigures>>,
    /// The allocator's driver calls that took, gave back or mapped memory in each
    /// step (segments, physical memory, maps, access, unmaps), rank 0's.
    pub driver_calls_per_step: Vec<u64>,
    /// The most of them in any step after the third: what a steady training loop
    /// still pays the driver per step (0 once the working set is cached); null when the
    /// run had three steps or fewer.
    pub steady_driver_calls_per_step: Option<u64>,
    /// `--graph`: the captured step and what its private pool holds at the end, else
    /// null.
    pub graph: Option<GraphReport>,
    /// Bytes per category after each allocator event of the last step, when the
    /// configuration asked for it (not in the JSON: `--timeline FILE` draws it).
    #[serde(skip)]
    pub timeline: Vec<labs_core::alloc::CategorySample>,
}

/// A step captured as a graph (`--graph`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphReport {
    /// The work items the capture recorded (kernels, copies, fills; none on a dry run).
    pub nodes: usize,
    /// Bytes the graph's private pool reserves at the end of the run: the step's own
    /// memory, kept between replays.
    pub pool_reserved: u64,
    /// Bytes of it in blocks still allocated (the tensors the step leaves alive: its
    /// loss, the gradients it made before the optimizer dropped them are not).
    pub pool_allocated: u64,
}

impl TrainReport {
    /// The figures every run has; the rest empty.
    pub fn new(
        config: &TrainConfig,
        device: &labs_core::Device,
        params: usize,
        memory: super::measure::Memory,
        oom: Option<String>,
    ) -> TrainReport {
        TrainReport {
            model: config.model,
            config: config.clone(),
            device: device.to_string(),
            allocator: device
                .allocator()
                .map(|a| a.config().to_conf_string())
                .unwrap_or_default(),
            params,
            peak_allocated: memory.peak_allocated,
            peak_reserved: memory.peak_reserved,
            by_category: memory.by_category,
            gemm_workspace_bytes: device.gemm_workspace_bytes().unwrap_or(0) as u64,
            step_ms: None,
            losses: None,
            attention_fused_calls: 0,
            attention_math_calls: 0,
            skipped_steps: None,
            offload: None,
            num_ooms: memory.num_ooms,
            oom,
            world_size: 1,
            data_parallel: None,
            samples_per_s: None,
            model_flops_per_step: crate::flops::model_flops_per_step(config, params),
            peak_flops: device
                .properties()
                .ok()
                .and_then(|p| crate::flops::peak_flops(&p.name, config.amp)),
            mfu: None,
            ranks: None,
            driver_calls_per_step: Vec::new(),
            steady_driver_calls_per_step: None,
            graph: None,
            timeline: Vec::new(),
        }
    }

    /// The title of the run's timeline picture: the model, the batch and the
    /// techniques in use, and where it ran (`device_name`, the GPU's own name).
    pub fn timeline_title(&self, device_name: &str) -> String {
        let c = &self.config;
        let mut title = format!(
            "{:?} d_model {} batch {}x{}",
            c.model, c.d_model, c.batch, c.seq
        )
        .to_lowercase();
        for (on, what) in [
            (c.accum > 1, format!("accum {}", c.accum)),
            (
                c.checkpoint != CheckpointMode::None,
                format!("checkpoint {:?}", c.checkpoint).to_lowercase(),
            ),
            (
                c.offload,
                match share_label(c) {
                    Some(share) => format!("offload {share}"),
                    None => "offload".to_string(),
                },
            ),
            (c.amp != AmpMode::None, format!("amp {}", amp_name(c.amp))),
            (true, format!("{:?} attention", c.attention).to_lowercase()),
            (
                c.fused_classifier.is_some(),
                classifier_label(c).unwrap_or_default(),
            ),
            (c.graph, "captured as a graph".to_string()),
        ] {
            if on {
                title.push_str(", ");
                title.push_str(&what);
            }
        }
        format!(
            "One training step: {title} ({}, {device_name})",
            self.device
        )
    }

    /// One line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serialises")
    }

    /// The run as two tables: the figures, then the peak by category.
    pub fn tables(&self) -> String {
        let c = &self.config;
        let model = match c.model {
            ModelKind::Transformer => format!(
                "Transformer d_model {} nhead {} layers {}+{} ffn {} dropout {}",
                c.d_model, c.nhead, c.layers, c.layers, c.ffn, c.dropout
            ),
            ModelKind::Gpt2 => format!(
                "GPT-2 d_model {} nhead {} blocks {} vocab {} dropout {}",
                c.d_model, c.nhead, c.layers, c.vocab, c.dropout
            ),
        };
        let mut t = Table::new(
            format!(
                "Training on {} ({}): {model}",
                self.device,
                allocator_words(&self.allocator)
            ),
            &["quantity", "value"],
        );
        t.row(["parameters".to_string(), self.params.to_string()]);
        t.row([
            "batch".to_string(),
            format!(
                "{} x {} tokens, {} micro-batch(es) per step, {} steps",
                c.batch, c.seq, c.accum, c.steps
            ),
        ]);
        let mut techniques = format!(
            "checkpoint {:?}, offload {}, attention {:?}, amp {}, {:?} lr {}",
            c.checkpoint,
            share_label(c).unwrap_or_else(|| c.offload.to_string()),
            c.attention,
            amp_name(c.amp),
            c.optimizer,
            c.lr
        )
        .to_lowercase();
        if let Some(label) = classifier_label(c) {
            techniques.push_str(", ");
            techniques.push_str(&label);
        }
        if c.graph {
            techniques.push_str(", captured as a graph");
        }
        t.row(["techniques".to_string(), techniques]);
        t.row(["peak allocated".to_string(), bytes(self.peak_allocated)]);
        t.row(["peak reserved".to_string(), bytes(self.peak_reserved)]);
        t.row([
            "step time (median)".to_string(),
            self.step_ms
                .map_or("-".to_string(), |ms| format!("{ms:.2} ms")),
        ]);
        t.row([
            "loss (first, last)".to_string(),
            match self.losses.as_deref() {
                Some([first, .., last]) => format!("{first:.4}, {last:.4}"),
                Some([only]) => format!("{only:.4}"),
                _ => "-".to_string(),
            },
        ]);
        t.row([
            "attention calls".to_string(),
            format!(
                "{} fused, {} math",
                self.attention_fused_calls, self.attention_math_calls
            ),
        ]);
        if let Some(n) = self.skipped_steps {
            t.row(["skipped steps (f16)".to_string(), n.to_string()]);
        }
        if let Some(g) = &self.graph {
            t.row([
                "graph".to_string(),
                format!(
                    "{} nodes; its pool reserves {} ({} allocated)",
                    g.nodes,
                    bytes(g.pool_reserved),
                    bytes(g.pool_allocated)
                ),
            ]);
        }
        if let Some(o) = &self.offload {
            t.row([
                "offloaded".to_string(),
                format!(
                    "{} in {} tensors, {} copied ({} prefetched, {} on demand)",
                    bytes(o.offloaded_bytes),
                    o.offloaded,
                    bytes(o.copied_out_bytes),
                    o.prefetched,
                    o.fetched_on_demand
                ),
            ]);
            if o.kept_for_share > 0 {
                t.row([
                    "kept for the share".to_string(),
                    format!(
                        "{} in {} tensors",
                        bytes(o.kept_for_share_bytes),
                        o.kept_for_share
                    ),
                ]);
                t.row([
                    "share sent, by storage".to_string(),
                    format!(
                        "{} of {} ({:.1}%)",
                        bytes(o.share_sent_bytes),
                        bytes(o.share_could_bytes),
                        100.0 * o.share_sent_bytes as f64 / o.share_could_bytes.max(1) as f64
                    ),
                ]);
            }
            if let (Some(out), Some(back), true) = (o.copy_out_ms, o.copy_back_ms, o.offloaded > 0)
            {
                t.row([
                    "offload copies".to_string(),
                    format!("{out:.2} ms out, {back:.2} ms back per step (copy stream busy)"),
                ]);
            }
        }
        if self.oom.is_some() {
            t.row(["out of memory", "yes: the report follows"]);
        }
        if let Some(how) = &self.data_parallel {
            t.row([
                "data parallel".to_string(),
                format!(
                    "{how} over {} ranks (figures above: rank 0's)",
                    self.world_size
                ),
            ]);
        }
        if let Some(s) = self.samples_per_s {
            t.row(["throughput".to_string(), format!("{s:.1} samples/s")]);
        }
        if let (Some(mfu), Some(peak)) = (self.mfu, self.peak_flops) {
            t.row([
                "model FLOP utilisation".to_string(),
                format!(
                    "{:.1}% of {:.1} TFLOP/s ({:.2} TFLOP a step)",
                    100.0 * mfu,
                    peak / 1e12,
                    self.model_flops_per_step / 1e12
                ),
            ]);
        }
        let mut ranks = String::new();
        if let Some(every) = &self.ranks {
            let mut r = Table::new(
                "Every rank",
                &["rank", "peak allocated", "peak reserved", "step time"],
            );
            for f in every {
                r.row([
                    f.rank.to_string(),
                    bytes(f.peak_allocated),
                    bytes(f.peak_reserved),
                    f.step_ms
                        .map_or("-".to_string(), |ms| format!("{ms:.2} ms")),
                ]);
            }
            ranks = format!("\n{r}");
        }
        let mut categories = Table::new(
            "The allocated peak by category",
            &["category", "bytes", "share"],
        );
        for (name, &n) in &self.by_category {
            let share = 100.0 * n as f64 / self.peak_allocated.max(1) as f64;
            categories.row([name.clone(), bytes(n), format!("{share:.1}%")]);
        }
        format!("{t}\n{categories}{ranks}")
    }
}

/// `--offload-share` as a percentage, when offloading less than everything.
fn share_label(c: &TrainConfig) -> Option<String> {
    (c.offload && c.offload_share < 1.0).then(|| format!("{:.0}%", 100.0 * c.offload_share))
}

/// `--fused-classifier` and its chunk, when on.
fn classifier_label(c: &TrainConfig) -> Option<String> {
    c.fused_classifier
        .map(|rows| format!("fused classifier ({rows} rows a chunk)"))
}

/// The allocator of a report, in the words of a lab's header (`cli::allocator_line`).
fn allocator_words(conf: &str) -> String {
    match labs_core::alloc::Config::parse(conf) {
        Ok(c) => c.describe(),
        Err(_) => format!("allocator: {conf}"),
    }
}
