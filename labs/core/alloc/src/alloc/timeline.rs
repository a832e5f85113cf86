//! The category timeline: after every change of the allocator's state, the bytes held
//! in each allocation category and the bytes reserved, so that a training step can be
//! drawn as stacked areas (parameters, gradients, optimizer state, inputs, activations,
//! temporaries, cached-but-free) over its events. PyTorch's memory profiler draws the
//! same picture (`MemoryProfileTimeline`), from a profile taken after the fact; here
//! the allocator knows each block's category as it goes, so one sample per event is a
//! copy of counters it already keeps.
//!
//! Off by default: then it costs the allocator one predictable branch per call.

use labs_base::clock::Instant;

use super::category::Category;
use super::stats::Stats;

// ANCHOR: sample
/// The allocator's memory right after one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CategorySample {
    /// Microseconds since recording started.
    pub time_us: u64,
    /// Bytes allocated in each category, indexed by [`Category::index`].
    pub bytes: [u64; Category::COUNT],
    /// Bytes reserved from the device (the cached-but-free memory is `reserved` minus
    /// the sum of `bytes`).
    pub reserved: u64,
}
// ANCHOR_END: sample

impl CategorySample {
    /// Bytes allocated in all categories together.
    pub fn allocated(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// Bytes reserved but held by no allocation: the cache.
    pub fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated())
    }

    pub fn of(&self, category: Category) -> u64 {
        self.bytes[category.index()]
    }
}

/// The samples of one recording; past `max_samples` it stops and counts what it let go
/// (the beginning of a step matters as much as its end, so no ring buffer).
pub(crate) struct CategoryTimeline {
    samples: Vec<CategorySample>,
    max_samples: usize,
    started: Instant,
    pub dropped: u64,
}

impl CategoryTimeline {
    pub fn new(max_samples: usize) -> CategoryTimeline {
        CategoryTimeline {
            samples: Vec::with_capacity(max_samples.min(1 << 16)),
            max_samples,
            started: Instant::now(),
            dropped: 0,
        }
    }

    /// Records the state `stats` describes, unless it equals the last sample's (an
    /// event that moved no byte between categories, as a recategorisation to the same
    /// category, adds nothing to the picture).
    #[cold]
    pub fn push(&mut self, stats: &Stats) {
        let mut bytes = [0u64; Category::COUNT];
        for (b, s) in bytes.iter_mut().zip(&stats.by_category) {
            *b = s.current;
        }
        let reserved = stats.reserved.all.current;
        if let Some(last) = self.samples.last() {
            if last.bytes == bytes && last.reserved == reserved {
                return;
            }
        }
        if self.samples.len() >= self.max_samples {
            self.dropped += 1;
            return;
        }
        self.samples.push(CategorySample {
            time_us: self.started.elapsed().as_micros() as u64,
            bytes,
            reserved,
        });
    }

    pub fn samples(&self) -> &[CategorySample] {
        &self.samples
    }
}
