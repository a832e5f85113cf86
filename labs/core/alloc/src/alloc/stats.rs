//! The allocator's statistics: plain counters updated under the allocator's lock, named
//! so that PyTorch's `memory_stats()` keys map onto them one for one.

use std::collections::BTreeMap;

use super::size::Pool;

/// A quantity with its current value, the highest it has been, and the running totals
/// of its increases and decreases (PyTorch's `current`, `peak`, `allocated`, `freed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    /// Sum of all increases since the allocator was made.
    pub allocated: u64,
    /// Sum of all decreases since the allocator was made.
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }
    #[inline]
    pub fn sub(&mut self, n: u64) {
        self.current -= n;
        self.freed += n;
    }
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// A [`Stat`] for all blocks and one for each pool. The aggregate is kept on its own
/// rather than summed when read, because the peak of a sum is not the sum of peaks.
///
/// It dereferences to the aggregate, so that `stats.allocated.current` reads as before
/// the split by pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStat {
    pub all: Stat,
    /// By pool, indexed by `Pool as usize`: an index rather than a branch on the hot
    /// path.
    pub pools: [Stat; 2],
}

impl PoolStat {
    #[inline]
    pub fn add(&mut self, pool: Pool, n: u64) {
        self.all.add(n);
        self.pools[pool as usize].add(n);
    }
    #[inline]
    pub fn sub(&mut self, pool: Pool, n: u64) {
        self.all.sub(n);
        self.pools[pool as usize].sub(n);
    }
    pub fn pool(&self, pool: Pool) -> &Stat {
        &self.pools[pool as usize]
    }
    /// The small pool's figures (blocks of at most 1 MiB).
    pub fn small(&self) -> &Stat {
        self.pool(Pool::Small)
    }
    /// The large pool's figures.
    pub fn large(&self) -> &Stat {
        self.pool(Pool::Large)
    }
    pub fn reset_peak(&mut self) {
        self.all.reset_peak();
        for p in &mut self.pools {
            p.reset_peak();
        }
    }
}

impl std::ops::Deref for PoolStat {
    type Target = Stat;
    fn deref(&self) -> &Stat {
        &self.all
    }
}

/// Calls of one kind and the wall time they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DriverTime {
    pub calls: u64,
    pub ns: u64,
}

/// The allocator's driver calls by kind, timed on the host (each is synchronous).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DriverTimes {
    /// `cuMemAddressReserve` of an expandable segment, or `cuMemAlloc` of a fixed one.
    pub segment_alloc: DriverTime,
    /// `cuMemAddressFree` or `cuMemFree`.
    pub segment_free: DriverTime,
    /// `cuMemCreate`.
    pub create: DriverTime,
    /// `cuMemMap`.
    pub map: DriverTime,
    /// `cuMemSetAccess`.
    pub access: DriverTime,
    /// `cuMemUnmap`.
    pub unmap: DriverTime,
    /// `cuMemRelease`.
    pub release: DriverTime,
    /// Waits before unmapping: a device or a stream synchronisation.
    pub synchronize: DriverTime,
}

impl DriverTimes {
    /// What was spent since `before` (an earlier copy of these figures).
    pub fn since(&self, before: &DriverTimes) -> DriverTimes {
        let d = |a: DriverTime, b: DriverTime| DriverTime {
            calls: a.calls - b.calls,
            ns: a.ns - b.ns,
        };
        DriverTimes {
            segment_alloc: d(self.segment_alloc, before.segment_alloc),
            segment_free: d(self.segment_free, before.segment_free),
            create: d(self.create, before.create),
            map: d(self.map, before.map),
            access: d(self.access, before.access),
            unmap: d(self.unmap, before.unmap),
            release: d(self.release, before.release),
            synchronize: d(self.synchronize, before.synchronize),
        }
    }

    /// The calls that take or give back memory or change its mappings: segments
    /// reserved or freed, physical memory created or released, pages mapped, given
    /// access or unmapped (synchronisations left out). A training loop that repeats
    /// one step makes none of them once its working set is cached.
    pub fn memory_calls(&self) -> u64 {
        [
            self.segment_alloc,
            self.segment_free,
            self.create,
            self.map,
            self.access,
            self.unmap,
            self.release,
        ]
        .iter()
        .map(|t| t.calls)
        .sum()
    }

    /// All the time spent in driver calls.
    pub fn total_ns(&self) -> u64 {
        [
            self.segment_alloc,
            self.segment_free,
            self.create,
            self.map,
            self.access,
            self.unmap,
            self.release,
            self.synchronize,
        ]
        .iter()
        .map(|t| t.ns)
        .sum()
    }
}

impl DriverTime {
    /// Runs `call`, counting it and its time here.
    #[inline]
    pub(crate) fn time<T>(&mut self, call: impl FnOnce() -> T) -> T {
        let start = labs_base::clock::Instant::now();
        let out = call();
        self.calls += 1;
        self.ns += start.elapsed().as_nanos() as u64;
        out
    }
}

// ANCHOR: stats
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes the program asked for (`requested_bytes`).
    pub requested: PoolStat,
    /// Bytes in blocks handed out, after rounding (`allocated_bytes`).
    pub allocated: PoolStat,
    /// Bytes held from the driver (`reserved_bytes`): with expandable segments, the
    /// mapped bytes, not the reserved address space.
    pub reserved: PoolStat,
    /// Blocks handed out and not yet freed (`allocation`).
    pub allocations: PoolStat,
    /// Segments (`segment`).
    pub segments: PoolStat,
    /// Blocks allocated or freed but still awaiting other streams' work (`active`): the
    /// blocks the cache cannot hand out.
    pub active: PoolStat,
    /// Bytes of the `active` blocks (`active_bytes`).
    pub active_bytes: PoolStat,
    /// Free blocks that share a fixed segment with other blocks (`inactive_split`):
    /// cached memory that `empty_cache` cannot return while its neighbours live.
    /// Expandable segments are left out, as in PyTorch.
    pub inactive_split: PoolStat,
    /// Bytes of the `inactive_split` blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: PoolStat,
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
    /// Times the allocator waited for one stream's work instead (`cuStreamSynchronize`):
    /// before unmapping memory idle since the last wait, when every stream owning such
    /// memory is known (allocations made through `malloc` with a stream, not replayed
    /// by handle), only those streams are waited for, as PyTorch's expandable segments
    /// do. Work on other streams (a prefetcher's copies) goes on.
    pub num_stream_syncs: u64,
    /// Mappings moved rather than made: idle physical memory unmapped and mapped where
    /// it is needed, without a `cuMemRelease` and a `cuMemCreate`. Counted in
    /// `num_maps` and `num_unmaps`, not in `device_allocs` or `device_frees`.
    pub num_remaps: u64,
    /// Time spent in each kind of driver call the allocator makes (not a PyTorch
    /// statistic): where the cost of expandable segments goes on a given GPU.
    pub driver: DriverTimes,
    /// Allocations that had to release cached memory and try again.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
    /// Frees that waited for another stream's work (`record_stream`).
    pub num_deferred_frees: u64,
    /// Requests served by a parked block: a small block freed earlier and handed back
    /// whole for a request of its size, without searching the free set. Not a PyTorch
    /// statistic; it shows how much of a program the fastest path serves.
    pub num_parked_hits: u64,
    /// Bytes allocated (after rounding) by what they hold, indexed by
    /// [`Category::index`](super::Category::index): the split of `allocated` a training
    /// step is read by (not a PyTorch statistic; its memory profiler gives the same
    /// split after the fact).
    pub by_category: [Stat; super::Category::COUNT],
    /// The `current` of each category at the moment `allocated` last set its peak
    /// (since the last peak reset): what the peak was made of. A category's own
    /// `peak` may fall at another moment; this split sums to `allocated.all.peak`.
    pub by_category_at_peak: [u64; super::Category::COUNT],
}
// ANCHOR_END: stats

impl Stats {
    /// Starts the peaks again from the current values.
    pub fn reset_peaks(&mut self) {
        for s in self.pool_stats_mut() {
            s.reset_peak();
        }
        for s in &mut self.by_category {
            s.reset_peak();
        }
        self.note_category_peak();
    }

    /// Copies the categories' current values as the split of the allocated peak.
    #[inline]
    pub(crate) fn note_category_peak(&mut self) {
        for (at, s) in self.by_category_at_peak.iter_mut().zip(&self.by_category) {
            *at = s.current;
        }
    }

    fn pool_stats_mut(&mut self) -> [&mut PoolStat; 9] {
        [
            &mut self.requested,
            &mut self.allocated,
            &mut self.reserved,
            &mut self.allocations,
            &mut self.segments,
            &mut self.active,
            &mut self.active_bytes,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
        ]
    }

    /// The statistics under PyTorch's names, in the order of their keys.
    pub fn named(&self) -> [(&'static str, &PoolStat); 9] {
        [
            ("allocated_bytes", &self.allocated),
            ("reserved_bytes", &self.reserved),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested),
            ("allocation", &self.allocations),
            ("segment", &self.segments),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
        ]
    }

    /// PyTorch's `memory_stats()`: `NAME.{all,small_pool,large_pool}.{current,peak,
    /// allocated,freed}` for each statistic, plus the event counters.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (name, ps) in self.named() {
            for (pool, s) in [
                ("all", &ps.all),
                ("small_pool", ps.small()),
                ("large_pool", ps.large()),
            ] {
                for (field, v) in [
                    ("current", s.current),
                    ("peak", s.peak),
                    ("allocated", s.allocated),
                    ("freed", s.freed),
                ] {
                    m.insert(format!("{name}.{pool}.{field}"), v);
                }
            }
        }
        for (name, v) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_device_alloc", self.device_allocs),
            ("num_device_free", self.device_frees),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_stream_syncs", self.num_stream_syncs),
            ("num_remaps", self.num_remaps),
            ("num_parked_hits", self.num_parked_hits),
        ] {
            m.insert(name.to_string(), v);
        }
        for c in super::Category::ALL {
            let s = &self.by_category[c.index()];
            for (field, v) in [
                ("current", s.current),
                ("peak", s.peak),
                ("allocated", s.allocated),
                ("freed", s.freed),
            ] {
                m.insert(format!("allocated_bytes.category.{}.{field}", c.name()), v);
            }
        }
        m
    }

    /// Allocated bytes by category, one line each: what a training step's memory holds.
    pub fn category_summary(&self) -> String {
        let mut out = format!("{:<16} {:>12} {:>12}\n", "category", "current", "peak");
        for c in super::Category::ALL {
            let s = &self.by_category[c.index()];
            out += &format!(
                "{:<16} {:>12} {:>12}\n",
                c.name(),
                crate::format::bytes(s.current),
                crate::format::bytes(s.peak)
            );
        }
        out
    }

    /// PyTorch's `memory_summary()` table for these statistics.
    pub fn summary(&self, device: &str) -> String {
        let rule = format!("|{}|\n", "-".repeat(75));
        let double = format!("|{}|\n", "=".repeat(75));
        let mut out = String::new();
        out += &double;
        out += &format!(
            "|{:^75}|\n",
            format!("Caching allocator memory summary, {device}")
        );
        out += &rule;
        out += &format!(
            "|{:^37}|{:^37}|\n",
            format!("OOMs: {}", self.num_ooms),
            format!("Allocation retries: {}", self.num_alloc_retries)
        );
        out += &double;
        out += "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n";
        let rows: [(&str, &PoolStat, bool); 9] = [
            ("Allocated memory", &self.allocated, true),
            ("Active memory", &self.active_bytes, true),
            ("Requested memory", &self.requested, true),
            ("GPU reserved memory", &self.reserved, true),
            ("Non-releasable memory", &self.inactive_split_bytes, true),
            ("Allocations", &self.allocations, false),
            ("Active allocs", &self.active, false),
            ("GPU reserved segments", &self.segments, false),
            ("Non-releasable allocs", &self.inactive_split, false),
        ];
        for (name, ps, bytes) in rows {
            out += &rule;
            for (label, s) in [
                (name, &ps.all),
                ("      from large pool", ps.large()),
                ("      from small pool", ps.small()),
            ] {
                let f = |v: u64, scale: u64| {
                    if bytes {
                        format_size(v, scale)
                    } else {
                        format_count(v, scale)
                    }
                };
                out += &format!(
                    "| {label:<21} | {} | {} | {} | {} |\n",
                    f(s.current, s.peak),
                    f(s.peak, s.peak),
                    f(s.allocated, s.allocated),
                    f(s.freed, s.freed)
                );
            }
        }
        out += &rule;
        out += &format!(
            "| {:<21} | {:>49} |\n",
            "Device allocs/frees",
            format!("{} / {}", self.device_allocs, self.device_frees)
        );
        out += &format!(
            "| {:<21} | {:>49} |\n",
            "Device synchronises", self.num_sync_all_streams
        );
        out += &format!(
            "| {:<21} | {:>49} |\n",
            "Stream synchronises", self.num_stream_syncs
        );
        out += &format!("| {:<21} | {:>49} |\n", "Mappings moved", self.num_remaps);
        out += &format!(
            "| {:<21} | {:>49} |\n",
            "Parked-block reuses", self.num_parked_hits
        );
        out += &double;
        out
    }
}

/// A byte figure in the unit its row's scale calls for, as PyTorch prints it: the unit
/// steps up while the scale is at least 768 of the next, so that a column's figures
/// stay comparable.
fn format_size(mut v: u64, mut scale: u64) -> String {
    let mut unit = "B  ";
    for next in ["KiB", "MiB", "GiB", "TiB", "PiB"] {
        if scale < 768 * 1024 {
            break;
        }
        unit = next;
        v /= 1024;
        scale /= 1024;
    }
    format!("{v:6} {unit}")
}

/// A count with PyTorch's K/M suffixes, stepping up at 750 thousand of the scale.
fn format_count(mut v: u64, mut scale: u64) -> String {
    let mut unit = " ";
    for next in ["K", "M"] {
        if scale < 750 * 1000 {
            break;
        }
        unit = next;
        v /= 1000;
        scale /= 1000;
    }
    format!("{v:7} {unit} ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_step_up_where_pytorch_steps_up() {
        assert_eq!(format_size(767 * 1024, 767 * 1024), "785408 B  ");
        assert_eq!(format_size(768 * 1024, 768 * 1024), "   768 KiB");
        // A figure follows its column's scale, not its own size.
        assert_eq!(format_size(512, 3 << 20), "     0 KiB");
        assert_eq!(format_size(5 << 30, 5 << 30), "  5120 MiB");
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
    }

    #[test]
    fn pools_add_up_and_totals_survive_a_peak_reset() {
        let mut s = PoolStat::default();
        s.add(Pool::Small, 10);
        s.add(Pool::Large, 100);
        s.sub(Pool::Small, 10);
        assert_eq!(
            (s.current, s.peak, s.allocated, s.freed),
            (100, 110, 110, 10)
        );
        assert_eq!((s.small().peak, s.large().current), (10, 100));
        s.reset_peak();
        assert_eq!((s.peak, s.small().peak, s.allocated), (100, 0, 110));
    }
}
