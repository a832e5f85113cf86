//! Reference solutions to the exercises in `starter.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::Reading;

pub fn outside_growth(readings: &[Reading]) -> Vec<(usize, u64)> {
    // NVML's line holds the allocator's reserved memory; what is beyond it is outside
    // the allocator (context, kernels, libraries, direct cudaMalloc).
    let mut previous: Option<u64> = None;
    let mut grew = Vec::new();
    for (i, r) in readings.iter().enumerate() {
        let Some(process) = r.process else { continue };
        let outside = process.saturating_sub(r.reserved);
        if let Some(before) = previous {
            if outside > before {
                grew.push((i, outside - before));
            }
        }
        previous = Some(outside);
    }
    grew
}

pub struct PeakSampler {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

struct Shared {
    peak: AtomicU64,
    latest: AtomicU64,
    reads: AtomicU64,
    stop: AtomicBool,
}

impl PeakSampler {
    pub fn start(
        interval: Duration,
        mut read: impl FnMut() -> u64 + Send + 'static,
    ) -> PeakSampler {
        let first = read();
        let shared = Arc::new(Shared {
            peak: AtomicU64::new(first),
            latest: AtomicU64::new(first),
            reads: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Acquire) {
                std::thread::park_timeout(interval);
                if s.stop.load(Ordering::Acquire) {
                    break;
                }
                let v = read();
                s.reads.fetch_add(1, Ordering::Relaxed);
                s.latest.store(v, Ordering::Release);
                s.peak.fetch_max(v, Ordering::AcqRel);
            }
        });
        PeakSampler { shared, thread }
    }

    pub fn take_peak(&self) -> u64 {
        // The swap ends one window and starts the next at once: a value the sampler
        // stores in between lands in one window or the other, never in neither.
        let latest = self.shared.latest.load(Ordering::Acquire);
        let peak = self.shared.peak.swap(latest, Ordering::AcqRel);
        // The next window holds the latest value, should one have come after the load.
        let latest = self.shared.latest.load(Ordering::Acquire);
        self.shared.peak.fetch_max(latest, Ordering::AcqRel);
        peak
    }

    pub fn stop(self) -> u64 {
        self.shared.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
        self.shared.reads.load(Ordering::Relaxed)
    }
}
