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
    /// Driver allocations of physical memory: `cuMemAlloc` for fixed segments,
    /// `cuMemCreate` of one page for expandable segments (each `vm_map` creates the
    /// page it maps).
    pub device_allocs: u64,
    /// Driver frees of physical memory: `cuMemFree`, or `cuMemRelease` of one page.
    pub device_frees: u64,
    /// Pages mapped into an expandable segment (`cuMemMap` + `cuMemSetAccess`, one
    /// page per call). Zero with fixed segments.
    pub num_maps: u64,
    /// Pages unmapped from an expandable segment (`cuMemUnmap`, one page per call).
    pub num_unmaps: u64,
    /// Times the allocator waited for all the device's work (`cudaDeviceSynchronize`),
    /// PyTorch's `num_sync_all_streams`: before unmapping pages, and before releasing
    /// cached memory.
    pub num_sync_all_streams: u64,
    /// Allocations that had to release cached memory and try again.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
    /// Frees that waited for another stream's work (`record_stream`).
    pub num_deferred_frees: u64,
}

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
