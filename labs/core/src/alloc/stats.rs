//! The allocator's statistics: plain counters updated under the allocator's lock, named
//! so that PyTorch's `memory_stats()` keys map onto them one for one.

/// A quantity with its current value and the highest it has been.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
}

impl Stat {
    #[inline]
    pub fn add(&mut self, n: u64) {
        self.current += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }
    #[inline]
    pub fn sub(&mut self, n: u64) {
        self.current -= n;
    }
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

// ANCHOR: stats
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes the program asked for (`requested_bytes`).
    pub requested: Stat,
    /// Bytes in blocks handed out, after rounding (`allocated_bytes`).
    pub allocated: Stat,
    /// Bytes held from the driver (`reserved_bytes`).
    pub reserved: Stat,
    /// Blocks handed out and not yet freed (`allocation`).
    pub allocations: Stat,
    /// Segments (`segment`).
    pub segments: Stat,
    /// Driver allocations: `cuMemAlloc`s and page mappings.
    pub device_allocs: u64,
    /// Driver frees: `cuMemFree`s and page unmappings.
    pub device_frees: u64,
    /// Allocations that had to release cached memory and try again.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
    /// Frees that waited for another stream's work (`record_stream`).
    pub num_deferred_frees: u64,
}
// ANCHOR_END: stats

impl Stats {
    /// Starts the peaks again from the current values.
    pub fn reset_peaks(&mut self) {
        self.requested.reset_peak();
        self.allocated.reset_peak();
        self.reserved.reset_peak();
        self.allocations.reset_peak();
        self.segments.reset_peak();
    }
}
