//! Experiment 5: an automatic batch-size finder, as PyTorch Lightning's
//! `BatchSizeFinder` in its `binsearch` mode: double the batch until a run fails with
//! out-of-memory, then search between the last batch that ran and the first that did
//! not. Each trial is a whole run (a fresh model and Adam, a few steps), and after each
//! the cache is emptied, so that every trial starts from the same allocator state and
//! the search leaves the allocator as it found it.

use labs_core::table::Table;
use labs_core::{Device, Result};

use crate::model::{train_run, MlpSpec};

/// What the search found, and every trial in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// The largest batch that ran (0 if not even the first did).
    pub batch: usize,
    /// `(batch, ran)` for each trial.
    pub trials: Vec<(usize, bool)>,
}

impl Search {
    /// Whether one sample more than the batch found ran (the binary search ends having
    /// tried it, unless the largest batch tried fitted).
    pub fn one_more_fits(&self) -> Option<bool> {
        let next = self.batch + 1;
        self.trials
            .iter()
            .find(|(b, _)| *b == next)
            .map(|(_, ran)| *ran)
    }
}

// ANCHOR: finder
/// The largest batch in `1..=max` for which `trial` succeeds, starting the doubling at
/// `start`. Only out-of-memory counts as "does not fit"; any other error ends the
/// search. `trial` must leave nothing allocated; `clean` runs after each trial.
pub fn find_batch_size(
    start: usize,
    max: usize,
    mut trial: impl FnMut(usize) -> Result<()>,
    mut clean: impl FnMut() -> Result<()>,
) -> Result<Search> {
    search(start, max, |batch| {
        let ran = match trial(batch) {
            Ok(()) => true,
            Err(e) if e.is_out_of_memory() => false,
            Err(e) => return Err(e),
        };
        clean()?;
        Ok(ran)
    })
}

/// The search itself, over any test of whether a batch fits (`fits` returns `false`
/// for a batch that does not, an error to end the search): double until a batch does
/// not fit, then a binary search between the last that did and the first that did not.
pub fn search<E>(
    start: usize,
    max: usize,
    mut fits: impl FnMut(usize) -> std::result::Result<bool, E>,
) -> std::result::Result<Search, E> {
    let mut trials = Vec::new();
    let mut fits = |batch: usize, trials: &mut Vec<(usize, bool)>| {
        let ran = fits(batch)?;
        trials.push((batch, ran));
        Ok(ran)
    };
    let (mut good, mut bad) = (0usize, None);
    if max == 0 {
        // No batch to try: nothing fits.
        return Ok(Search { batch: 0, trials });
    }
    let mut batch = start.clamp(1, max);
    loop {
        if fits(batch, &mut trials)? {
            good = batch;
            if batch == max {
                break;
            }
            batch = batch.saturating_mul(2).min(max);
        } else {
            bad = Some(batch);
            break;
        }
    }
    if let Some(mut bad) = bad {
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if fits(mid, &mut trials)? {
                good = mid;
            } else {
                bad = mid;
            }
        }
    }
    Ok(Search {
        batch: good,
        trials,
    })
}
// ANCHOR_END: finder

/// The finder on a training run of `steps` steps, on `device`'s own allocator.
pub fn find_for_training(
    device: &Device,
    spec: MlpSpec,
    steps: usize,
    max: usize,
) -> Result<Search> {
    let alloc = device.allocator()?;
    find_batch_size(
        1,
        max,
        |batch| train_run(device, spec, batch, steps),
        || alloc.empty_cache().map(|_| ()),
    )
}

/// The experiment: the finder under the same budget as experiment 4.
#[derive(Debug, Clone)]
pub struct Found {
    pub search: Search,
    pub limit: u64,
    /// `memory_allocated` and `memory_reserved` before and after the search.
    pub before: (u64, u64),
    pub after: (u64, u64),
}

pub fn run(device: &Device, spec: MlpSpec) -> Result<Found> {
    let (budget, max) = crate::recovery::budget(device);
    let alloc = device.allocator()?;
    alloc.empty_cache()?;
    let before = (alloc.memory_allocated(), alloc.memory_reserved());
    let limit = before.1 + budget;
    let total = device.mem_info()?.total;
    alloc.set_memory_fraction(limit as f64 / total as f64)?;
    let search = find_for_training(device, spec, 2, max * 4);
    alloc.set_memory_fraction(1.0)?;
    let after = (alloc.memory_allocated(), alloc.memory_reserved());
    Ok(Found {
        search: search?,
        limit,
        before,
        after,
    })
}

pub fn print(device: &Device, spec: MlpSpec, f: &Found) {
    println!(
        "5. A batch-size finder (double until out of memory, then binary search), on {device}"
    );
    println!(
        "(each trial: a fresh nn::Mlp {:?} with Adam, 2 steps; the device's allocator \
         capped at {} MiB with set_memory_fraction)\n",
        spec.sizes(),
        crate::mib(f.limit)
    );
    let mut t = Table::new("The trials, in order", &["trial", "batch", "result"]);
    for (i, (batch, ran)) in f.search.trials.iter().enumerate() {
        t.row([
            (i + 1).to_string(),
            batch.to_string(),
            if *ran { "ran" } else { "out of memory" }.to_string(),
        ]);
    }
    println!("{t}");
    println!(
        "Largest batch that fits: {}. Allocator before the search: {} MiB allocated, {} MiB \
         reserved; after: {} MiB allocated, {} MiB reserved.\n",
        f.search.batch,
        crate::mib(f.before.0),
        crate::mib(f.before.1),
        crate::mib(f.after.0),
        crate::mib(f.after.1)
    );
}
