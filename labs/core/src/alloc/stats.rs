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
    /// Driver allocations of physical memory: `cuMemAlloc` of a fixed segment, or
    /// `cuMemCreate` of one mapping of an expandable segment (each `vm_map` creates the
    /// memory it maps, a run of 1 to 8 pages of 2 MiB). Equal to `num_maps` when all
    /// segments are expandable.
    pub device_allocs: u64,
    /// Driver frees of physical memory: `cuMemFree` of a fixed segment, or
    /// `cuMemRelease` of one mapping. Equal to `num_unmaps` when all segments are
    /// expandable.
    pub device_frees: u64,
    /// Mappings made in expandable segments: one `cuMemMap` + `cuMemSetAccess` each (and
    /// the `cuMemCreate` counted in `device_allocs`), of a run of 1 to 8 pages. Zero
    /// with fixed segments.
    pub num_maps: u64,
    /// Mappings undone in expandable segments: one `cuMemUnmap` each (and the
    /// `cuMemRelease` counted in `device_frees`).
    pub num_unmaps: u64,
    /// Times the allocator waited for all the device's work (`cuCtxSynchronize`),
    /// PyTorch's `num_sync_all_streams`: before unmapping memory that became idle since
    /// the last such wait (when reserved memory would otherwise pass its high-water
    /// mark, or in `empty_cache`). The implicit synchronisation of `cuMemFree` (fixed
    /// segments) is not counted.
    pub num_sync_all_streams: u64,
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
