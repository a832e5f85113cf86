//! Trace replay: feeds a real program's allocations and frees, in order, to an
//! allocator, and reports what it reserved. Traces are CSV (`action,addr,size,stream`),
//! gzip'd or plain, as converted from `torch.cuda.memory._snapshot()`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use labs_base::clock::Instant;

use super::{Allocation, Allocator};
use crate::error::{Error, Result};
use crate::snapshot::{read_trace_file, TraceAction};
pub use crate::snapshot::{CsvEvent as TraceEvent, TraceLimits};

#[derive(Debug, Clone)]
pub struct Trace {
    /// The file name without `.trace.csv[.gz]`.
    pub name: String,
    /// Every line of the file, validated. Replay feeds the `alloc` and `free_requested`
    /// events; the other actions are the recording allocator's own decisions.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// The peak of the live sum of requested sizes: what a perfect allocator reserves.
    /// Sums are of u128, so that no trace can wrap them.
    pub fn peak_requested(&self) -> u64 {
        let mut live: HashMap<u64, u64> = HashMap::new();
        let (mut current, mut peak) = (0u128, 0u128);
        for e in &self.events {
            match e.action {
                TraceAction::Alloc => {
                    current += e.size as u128;
                    peak = peak.max(current);
                    if let Some(old) = live.insert(e.addr, e.size) {
                        current -= old as u128;
                    }
                }
                TraceAction::FreeRequested => {
                    if let Some(size) = live.remove(&e.addr) {
                        current -= size as u128;
                    }
                }
                _ => {}
            }
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }
}

/// Reads a trace file with the default limits; gzip is recognised by its magic number,
/// not the name. Errors name the file once.
pub fn read_trace(path: &Path) -> Result<Trace> {
    read_trace_with(path, TraceLimits::default())
}

/// [`read_trace`] with explicit limits on the file's size and its lines.
pub fn read_trace_with(path: &Path, limits: TraceLimits) -> Result<Trace> {
    let events =
        read_trace_file(path, limits).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = name
        .trim_end_matches(".gz")
        .trim_end_matches(".csv")
        .trim_end_matches(".trace")
        .to_string();
    Ok(Trace { name, events })
}

/// What a replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    pub trace: String,
    pub conf: String,
    /// Allocations and frees fed to the allocator.
    pub ops: u64,
    pub peak_requested: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Driver allocations of physical memory ([`crate::alloc::Stats::device_allocs`]).
    pub device_allocs: u64,
    /// Page mappings and unmappings of expandable segments ([`crate::alloc::Stats::num_maps`],
    /// [`crate::alloc::Stats::num_unmaps`]).
    pub num_maps: u64,
    pub num_unmaps: u64,
    /// Device-wide synchronisations the allocator did ([`crate::alloc::Stats::num_sync_all_streams`]).
    pub num_sync_all_streams: u64,
    /// Mappings moved rather than made ([`crate::alloc::Stats::num_remaps`]).
    pub num_remaps: u64,
    /// The driver calls the replay made, by kind, with their time.
    pub driver: super::DriverTimes,
    /// The calls that take, give back or remap memory
    /// ([`DriverTimes::memory_calls`](super::DriverTimes::memory_calls)) in each quarter
    /// of the trace's operations, in order. A trace of a few training steps warms up in
    /// its first quarter; the last is its steadiest.
    pub driver_calls_per_quarter: [u64; 4],
    /// Frees of addresses not live at that point (never allocated, or freed twice):
    /// skipped when the replay is lenient, an error otherwise.
    pub unknown_frees: u64,
    pub elapsed: Duration,
}

impl ReplayReport {
    pub fn ns_per_op(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e9 / self.ops.max(1) as f64
    }
    /// The memory calls of the trace's last quarter: what the loop it recorded costs
    /// once warm.
    pub fn steady_driver_calls(&self) -> u64 {
        self.driver_calls_per_quarter[3]
    }
    /// Peak reserved over peak requested: 1.0 is a perfect allocator.
    pub fn fragmentation(&self) -> f64 {
        self.peak_reserved as f64 / self.peak_requested.max(1) as f64
    }
}

// ANCHOR: replay
/// Replays `trace` through `allocator` and frees what is still live at the end. A free
/// of an address that is not live is an error: the trace is damaged or not one program's.
pub fn replay(trace: &Trace, allocator: &Allocator) -> Result<ReplayReport> {
    replay_with(trace, allocator, false)
}

/// [`replay`]; `lenient` skips (and counts) frees of addresses that are not live.
pub fn replay_with(trace: &Trace, allocator: &Allocator, lenient: bool) -> Result<ReplayReport> {
    allocator.reset_peak_stats();
    let before = allocator.stats();
    let mut live: HashMap<u64, Allocation> = HashMap::with_capacity(4096);
    let mut streams: HashMap<u64, u64> = HashMap::new();
    let (mut ops, mut unknown_frees) = (0u64, 0u64);
    // The operations, for the quarters' ends: the driver calls so far are read there,
    // three times in the whole replay.
    let total_ops = (trace.events.iter())
        .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::FreeRequested))
        .count() as u64;
    let quarter_end = |q: u64| (total_ops * q).div_ceil(4);
    let mut calls_at = [before.driver.memory_calls(); 5];
    let mut quarter = 1u64;
    let start = Instant::now();
    for e in &trace.events {
        while quarter < 4 && ops >= quarter_end(quarter) {
            calls_at[quarter as usize] = allocator.stats().driver.memory_calls();
            quarter += 1;
        }
        match e.action {
            TraceAction::Alloc => {
                // Trace stream handles are the recording process's; any distinct keys do.
                let next = streams.len() as u64;
                let stream = if e.stream == 0 {
                    0
                } else {
                    *streams.entry(e.stream).or_insert(next + 1)
                };
                let block = allocator.malloc_on(e.size, stream).map_err(|err| {
                    Error::InvalidArgument(format!(
                        "{}, line {}: allocating {} bytes: {err}",
                        trace.name, e.line, e.size
                    ))
                })?;
                if let Some(old) = live.insert(e.addr, block) {
                    return Err(Error::InvalidArgument(format!(
                        "{}, line {}: alloc at {:#x}, which is already live (allocated as {} bytes)",
                        trace.name,
                        e.line,
                        e.addr,
                        old.requested()
                    )));
                }
            }
            TraceAction::FreeRequested => match live.remove(&e.addr) {
                Some(block) => allocator.free(block)?,
                None if lenient => {
                    unknown_frees += 1;
                    continue;
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "{}, line {}: free of {:#x}, which is not allocated (freed twice, or \
                         never allocated); --lenient skips such frees",
                        trace.name, e.line, e.addr
                    )))
                }
            },
            _ => continue,
        }
        ops += 1;
    }
    let elapsed = start.elapsed();
    let stats = allocator.stats();
    for at in &mut calls_at[quarter as usize..] {
        *at = stats.driver.memory_calls();
    }
    let driver_calls_per_quarter = std::array::from_fn(|q| calls_at[q + 1] - calls_at[q]);
    for (_, block) in live {
        allocator.free(block)?;
    }
    Ok(ReplayReport {
        trace: trace.name.clone(),
        conf: allocator.config().to_conf_string(),
        ops,
        peak_requested: stats.requested.peak,
        peak_allocated: stats.allocated.peak,
        peak_reserved: stats.reserved.peak,
        device_allocs: stats.device_allocs - before.device_allocs,
        num_maps: stats.num_maps - before.num_maps,
        num_unmaps: stats.num_unmaps - before.num_unmaps,
        num_sync_all_streams: stats.num_sync_all_streams - before.num_sync_all_streams,
        num_remaps: stats.num_remaps - before.num_remaps,
        driver: stats.driver.since(&before.driver),
        driver_calls_per_quarter,
        unknown_frees,
        elapsed,
    })
}
// ANCHOR_END: replay
