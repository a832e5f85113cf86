//! Experiment 7 on a real model: the largest batch of a Transformer or a GPT-2 training
//! step (the training driver of `labs-train`, with its checkpointing, mixed precision and
//! accumulation) that fits a GPU of a given size, found on the dry-run device of that
//! size; on a GPU the answer is checked by real runs capped at the same capacity (the
//! batch found fits, one more does not) and the prediction by the measured peak
//! reserved, with the error in per cent.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use labs_core::format::{bytes, duration};
use labs_core::table::Table;
use labs_core::{Device, DeviceId};
use labs_train::{ModelKind, TrainConfig, TrainReport};

use crate::finder::{search, Search};

/// The dry run's answer: the batch and the run at that batch.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub capacity: u64,
    pub search: Search,
    /// The dry run at the batch found: its peaks are the prediction.
    pub report: TrainReport,
    pub took: Duration,
}

impl Prediction {
    /// Whether one sample more ran in the search ([`Search::one_more_fits`]).
    pub fn one_more_fits(&self) -> Option<bool> {
        self.search.one_more_fits()
    }
}

/// Real runs at the batch found and at one more, on a device capped at the capacity.
#[derive(Debug, Clone)]
pub struct Check {
    pub device: String,
    /// The run at the batch found (its `oom` set if it did not fit after all).
    pub report: TrainReport,
    pub one_more_fits: bool,
    pub took: Duration,
}

impl Check {
    /// The predicted peak reserved's error against the measured one, in per cent.
    pub fn reserved_error_percent(&self, p: &Prediction) -> f64 {
        let measured = self.report.peak_reserved.max(1) as f64;
        100.0 * (p.report.peak_reserved as f64 - measured) / measured
    }
}

fn at_batch(base: &TrainConfig, batch: usize) -> TrainConfig {
    TrainConfig {
        batch,
        ..base.clone()
    }
}

/// One run of `config` on `device` from an empty cache, the cache emptied after it.
fn trial(device: &Device, config: &TrainConfig) -> Result<TrainReport> {
    device.allocator()?.empty_cache()?;
    let report = labs_train::run(config, device)?;
    device.allocator()?.empty_cache()?;
    Ok(report)
}

/// The device a trial runs on, as a new process would find it: a new dry-run or
/// simulated device of the same size, or the GPU itself (the one device a process
/// cannot make anew; its cache is emptied before each trial). An emptied cache is not
/// a new one: the segments it made are gone, but where the next ones land in the
/// address space, and so which of two equal free blocks a best fit takes, depends on
/// them, and a batch on the edge of fitting can fit after one history and not after
/// another.
fn fresh(device: &Device) -> Result<Device> {
    Ok(match device.id() {
        DeviceId::Dry(_) => device.dry_twin(device.mem_info()?.total)?,
        DeviceId::Sim(_) => Device::new_sim(device.mem_info()?.total),
        _ => device.clone(),
    })
}

// ANCHOR: predict
/// The largest micro-batch (up to `max`) of `base` that trains on `target` capped at
/// `capacity` bytes, found on a dry-run twin of it of that size (which holds the
/// target's matrix-product workspace, as the target will).
pub fn predict(
    target: &Device,
    capacity: u64,
    base: &TrainConfig,
    max: usize,
) -> Result<Prediction> {
    let start = Instant::now();
    let dry = target.dry_twin(capacity)?;
    let search = search(1, max, |batch| {
        let config = at_batch(base, batch);
        // A batch whose sizes no device holds does not fit; nothing is allocated for it.
        if config.validate().is_err() {
            return Ok(false);
        }
        Ok::<_, anyhow::Error>(trial(&fresh(&dry)?, &config)?.oom.is_none())
    })?;
    if search.batch == 0 {
        bail!(
            "not even a batch of 1 fits in {}: the model and its optimizer state alone \
             need more",
            bytes(capacity)
        );
    }
    let report = trial(&fresh(&dry)?, &at_batch(base, search.batch))?;
    Ok(Prediction {
        capacity,
        search,
        report,
        took: start.elapsed(),
    })
}
// ANCHOR_END: predict

// ANCHOR: check
/// Runs the batch found on `device`, its allocator capped at the prediction's capacity
/// (`set_per_process_memory_fraction`), then one sample more.
pub fn check(device: &Device, p: &Prediction, base: &TrainConfig) -> Result<Check> {
    let start = Instant::now();
    let alloc = device.allocator()?;
    let total = device.mem_info()?.total;
    alloc.set_memory_fraction((p.capacity as f64 / total as f64).min(1.0))?;
    let capped = |d: Device| -> Result<Device> {
        d.allocator()?
            .set_memory_fraction((p.capacity as f64 / total as f64).min(1.0))?;
        Ok(d)
    };
    let measured = capped(fresh(device)?).and_then(|d| trial(&d, &at_batch(base, p.search.batch)));
    let one_more =
        capped(fresh(device)?).and_then(|d| trial(&d, &at_batch(base, p.search.batch + 1)));
    alloc.set_memory_fraction(1.0)?;
    let report = measured?;
    Ok(Check {
        device: device.to_string(),
        report,
        one_more_fits: one_more?.oom.is_none(),
        took: start.elapsed(),
    })
}
// ANCHOR_END: check

fn describe(c: &TrainConfig) -> String {
    let model = match c.model {
        ModelKind::Transformer => format!(
            "nn.Transformer d_model {} ({} heads, {}+{} layers, ffn {})",
            c.d_model, c.nhead, c.layers, c.layers, c.ffn
        ),
        ModelKind::Gpt2 => format!(
            "GPT-2 d_model {} ({} heads, {} blocks, vocabulary {})",
            c.d_model, c.nhead, c.layers, c.vocab
        ),
    };
    let checkpoint = format!("{:?}", c.checkpoint).to_lowercase();
    format!(
        "{model}, sequence {}, {} micro-batch(es) a step, checkpoint {checkpoint}, amp {}, \
         {:?} with {} steps a trial",
        c.seq,
        c.accum,
        labs_train::step::amp_name(c.amp),
        c.optimizer,
        c.steps
    )
}

pub fn print(base: &TrainConfig, p: &Prediction, check: Option<&Check>) {
    println!(
        "7. The largest batch that fits a GPU of {}, found on the dry-run device",
        bytes(p.capacity)
    );
    println!("({}, {} parameters)\n", describe(base), p.report.params);
    println!(
        "The dry run: {} trials in {}; largest batch {}",
        p.search.trials.len(),
        duration(p.took),
        p.search.batch
    );
    let mut t = Table::new(
        "Predicted and measured peaks at that batch",
        &[
            "run",
            "max allocated MiB",
            "max reserved MiB",
            "batch + 1",
            "took",
        ],
    );
    let fits = |f: bool| if f { "fits" } else { "does not fit" };
    t.row([
        "dry run (predicted)".to_string(),
        crate::mib(p.report.peak_allocated),
        crate::mib(p.report.peak_reserved),
        p.one_more_fits().map_or("not tried", fits).to_string(),
        duration(p.took),
    ]);
    if let Some(c) = check {
        t.row([
            format!("{} (measured)", c.device),
            crate::mib(c.report.peak_allocated),
            crate::mib(c.report.peak_reserved),
            fits(c.one_more_fits).to_string(),
            duration(c.took),
        ]);
    }
    println!("{t}");
    match check {
        Some(c) if c.report.oom.is_some() => {
            println!(
                "The batch found did NOT fit on {}: the prediction was wrong.",
                c.device
            )
        }
        Some(c) => println!(
            "Predicted peak reserved against measured: {:+.2}% (the target: within 1%)",
            c.reserved_error_percent(p)
        ),
        None => println!("(no GPU in use: the prediction is checked by a real run on a GPU only)"),
    }
}
