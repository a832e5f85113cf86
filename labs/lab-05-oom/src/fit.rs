//! Experiment 7: knowing before running. The batch-size finder of experiment 5 run on
//! the dry-run device, the simulated GPU with its work taken out: every op allocates
//! exactly what it would on a GPU of the given capacity, no kernel runs, so the whole
//! search takes a fraction of a second. On a GPU the prediction is then checked by a
//! real run capped at the same capacity: the predicted peak reserved against the
//! measured one, and one sample more, which must not fit.

use std::time::{Duration, Instant};

use labs_core::format::{bytes, duration};
use labs_core::table::Table;
use labs_core::{Device, Result};

use crate::finder::{find_for_training, Search};
use crate::model::{train_run, MlpSpec};

/// The prediction: the batch found on the dry run and its peaks there.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub capacity: u64,
    pub search: Search,
    pub max_allocated: u64,
    pub max_reserved: u64,
    pub took: Duration,
}

impl Prediction {
    /// Whether one sample more ran in the search ([`Search::one_more_fits`]).
    pub fn one_more_fits(&self) -> Option<bool> {
        self.search.one_more_fits()
    }
}

/// A real run at the predicted batch, and one sample more.
#[derive(Debug, Clone)]
pub struct Check {
    pub device: String,
    pub max_allocated: u64,
    pub max_reserved: u64,
    pub one_more_fits: bool,
    pub took: Duration,
}

/// The peaks of one run of `batch` on `device`'s allocator, from a clean cache.
fn peaks(device: &Device, spec: MlpSpec, batch: usize, steps: usize) -> Result<(u64, u64)> {
    let alloc = device.allocator()?;
    alloc.empty_cache()?;
    alloc.reset_peak_memory_stats();
    train_run(device, spec, batch, steps)?;
    let p = (alloc.max_memory_allocated(), alloc.max_memory_reserved());
    alloc.empty_cache()?;
    Ok(p)
}

// ANCHOR: predict
/// The largest batch (up to `max`) for `steps` training steps on `target` capped at
/// `capacity` bytes, found on a dry-run twin of it of that size (which holds the
/// target's matrix-product workspace, as the target will).
pub fn predict(
    target: &Device,
    capacity: u64,
    spec: MlpSpec,
    steps: usize,
    max: usize,
) -> Result<Prediction> {
    let start = Instant::now();
    let dry = target.dry_twin(capacity)?;
    let search = find_for_training(&dry, spec, steps, max)?;
    if search.batch == 0 {
        return Err(labs_core::Error::InvalidArgument(format!(
            "not even a batch of 1 fits in {}: the model and its optimizer state alone \
             need more",
            bytes(capacity)
        )));
    }
    let (max_allocated, max_reserved) = peaks(&dry, spec, search.batch, steps)?;
    Ok(Prediction {
        capacity,
        search,
        max_allocated,
        max_reserved,
        took: start.elapsed(),
    })
}
// ANCHOR_END: predict

// ANCHOR: check
/// Runs the predicted batch for real on `device`, its allocator capped at the
/// prediction's capacity, then one sample more.
pub fn check(device: &Device, p: &Prediction, spec: MlpSpec, steps: usize) -> Result<Check> {
    let start = Instant::now();
    // The dry twin lent the products' workspace before anything else; so does this
    // run, rather than at its first product, where the block lands elsewhere and the
    // peaks reserved differ (by 14 MiB on an H100 before it did).
    device.ensure_gemm_workspace()?;
    let alloc = device.allocator()?;
    let total = device.mem_info()?.total;
    alloc.set_memory_fraction((p.capacity as f64 / total as f64).min(1.0))?;
    let measured = peaks(device, spec, p.search.batch, steps);
    let one_more = peaks(device, spec, p.search.batch + 1, steps);
    alloc.empty_cache()?;
    alloc.set_memory_fraction(1.0)?;
    let (max_allocated, max_reserved) = measured?;
    let one_more_fits = match one_more {
        Ok(_) => true,
        Err(e) if e.is_out_of_memory() => false,
        Err(e) => return Err(e),
    };
    // ANCHOR_END: check
    Ok(Check {
        device: device.to_string(),
        max_allocated,
        max_reserved,
        one_more_fits,
        took: start.elapsed(),
    })
}

pub fn print(spec: MlpSpec, steps: usize, p: &Prediction, check: Option<&Check>) {
    println!(
        "7. The largest batch that fits a GPU of {}, found on the dry-run device",
        bytes(p.capacity)
    );
    println!(
        "(an nn::Mlp {:?} with Adam, {} parameters, {steps} training steps a trial)\n",
        spec.sizes(),
        spec.parameters()
    );
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
    t.row([
        "dry run (predicted)".to_string(),
        crate::mib(p.max_allocated),
        crate::mib(p.max_reserved),
        match p.one_more_fits() {
            Some(true) => "fits",
            Some(false) => "does not fit",
            None => "not tried",
        }
        .to_string(),
        duration(p.took),
    ]);
    if let Some(c) = check {
        t.row([
            format!("{} (measured)", c.device),
            crate::mib(c.max_allocated),
            crate::mib(c.max_reserved),
            if c.one_more_fits {
                "fits"
            } else {
                "does not fit"
            }
            .to_string(),
            duration(c.took),
        ]);
    }
    println!("{t}");
    if check.is_none() {
        println!("(no GPU in use: the prediction is checked by a real run on a GPU only)");
    }
}
