//! Trace replay: feeds a real program's allocations and frees, in order, to an
//! allocator, and reports what it reserved. Traces are CSV (`action,addr,size,stream`),
//! gzip'd or plain, as converted from `torch.cuda.memory._snapshot()`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Allocation, Allocator, Config};
use crate::device::{Backend, DeviceId};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Alloc,
    Free,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// Line in the file, for error messages.
    pub line: u32,
}

#[derive(Debug, Clone)]
pub struct Trace {
    /// The file name without `.trace.csv[.gz]`.
    pub name: String,
    /// The `alloc` and `free_requested` events; other actions are the recording
    /// allocator's own decisions and are left out.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// The peak of the live sum of requested sizes: what a perfect allocator reserves.
    pub fn peak_requested(&self) -> u64 {
        let mut live: HashMap<u64, u64> = HashMap::new();
        let (mut current, mut peak) = (0u64, 0u64);
        for e in &self.events {
            match e.action {
                Action::Alloc => {
                    current += e.size;
                    peak = peak.max(current);
                    if let Some(old) = live.insert(e.addr, e.size) {
                        current -= old;
                    }
                }
                Action::Free => {
                    if let Some(size) = live.remove(&e.addr) {
                        current -= size;
                    }
                }
            }
        }
        peak
    }
}

/// Reads a trace file; gzip is recognised by its magic number, not the name.
pub fn read_trace(path: &Path) -> Result<Trace> {
    let shown = path.display().to_string();
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::InvalidArgument(format!("{shown}: {e}")))?;
    let mut magic = [0u8; 2];
    let n = file
        .read(&mut magic)
        .map_err(|e| Error::InvalidArgument(format!("{shown}: {e}")))?;
    let file =
        std::fs::File::open(path).map_err(|e| Error::InvalidArgument(format!("{shown}: {e}")))?;
    let reader: Box<dyn BufRead> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let name = name
        .trim_end_matches(".gz")
        .trim_end_matches(".csv")
        .trim_end_matches(".trace")
        .to_string();
    let events = parse_trace(&shown, reader)?;
    Ok(Trace { name, events })
}

/// Parses CSV text; `source` names it in errors, which give the line.
pub fn parse_trace(source: &str, reader: impl BufRead) -> Result<Vec<TraceEvent>> {
    let mut events = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let number = index + 1;
        let err = |what: String| Error::InvalidArgument(format!("{source}, line {number}: {what}"));
        let line = line.map_err(|e| err(format!("unreadable ({e})")))?;
        let line = line.trim();
        if number == 1 {
            if line != "action,addr,size,stream" {
                return Err(err(format!(
                    "expected the header `action,addr,size,stream`, found `{line}`"
                )));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != 4 {
            return Err(err(format!(
                "expected 4 fields, found {} in `{line}`",
                fields.len()
            )));
        }
        let action = match fields[0] {
            "alloc" => Action::Alloc,
            "free_requested" => Action::Free,
            "free_completed" | "segment_alloc" | "segment_free" | "segment_map"
            | "segment_unmap" | "snapshot" | "oom" => continue,
            other => return Err(err(format!("unknown action `{other}`"))),
        };
        let number_field = |i: usize, name: &str| -> Result<u64> {
            let t = fields[i].trim();
            let parsed = match t.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse(),
            };
            parsed.map_err(|_| err(format!("{name} `{t}` is not a non-negative integer")))
        };
        events.push(TraceEvent {
            action,
            addr: number_field(1, "addr")?,
            size: number_field(2, "size")?,
            stream: number_field(3, "stream")?,
            line: number as u32,
        });
    }
    Ok(events)
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
    /// Frees of addresses the trace never allocated (skipped).
    pub unknown_frees: u64,
    pub elapsed: Duration,
}

impl ReplayReport {
    pub fn ns_per_op(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e9 / self.ops.max(1) as f64
    }
    /// Peak reserved over peak requested: 1.0 is a perfect allocator.
    pub fn fragmentation(&self) -> f64 {
        self.peak_reserved as f64 / self.peak_requested.max(1) as f64
    }
}

// ANCHOR: replay
/// Replays `trace` through `allocator` and frees what is still live at the end.
pub fn replay(trace: &Trace, allocator: &Allocator) -> Result<ReplayReport> {
    allocator.reset_peak_stats();
    let before = allocator.stats();
    let mut live: HashMap<u64, Allocation> = HashMap::with_capacity(4096);
    let mut streams: HashMap<u64, u64> = HashMap::new();
    let (mut ops, mut unknown_frees) = (0u64, 0u64);
    let start = Instant::now();
    for e in &trace.events {
        match e.action {
            Action::Alloc => {
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
            Action::Free => match live.remove(&e.addr) {
                Some(block) => allocator.free(block)?,
                None => {
                    unknown_frees += 1;
                    continue;
                }
            },
        }
        ops += 1;
    }
    let elapsed = start.elapsed();
    let stats = allocator.stats();
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
        unknown_frees,
        elapsed,
    })
}
// ANCHOR_END: replay

/// A simulated GPU of `capacity` bytes for one replay, outside the device registry so
/// that replays do not share memory.
pub fn sim_backend(capacity: u64) -> Arc<dyn Backend> {
    Arc::new(crate::sim::SimBackend::new(DeviceId::Sim(0), capacity))
}

/// Replays `trace` with `conf` on a fresh simulated GPU of `capacity` bytes.
pub fn replay_on_sim(trace: &Trace, conf: Config, capacity: u64) -> Result<ReplayReport> {
    let allocator = Allocator::new(sim_backend(capacity), conf)?;
    replay(trace, &allocator)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for (text, needle) in [
            ("nope\n", "line 1: expected the header"),
            (
                "action,addr,size,stream\nalloc,1,2\n",
                "line 2: expected 4 fields",
            ),
            (
                "action,addr,size,stream\nalloc,1,2,0\nalloc,x,2,0\n",
                "line 3: addr `x`",
            ),
            (
                "action,addr,size,stream\nalloc,1,-5,0\n",
                "line 2: size `-5`",
            ),
            (
                "action,addr,size,stream\nmalloc,1,5,0\n",
                "line 2: unknown action `malloc`",
            ),
        ] {
            let e = parse_trace("t.csv", text.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
        let ok = parse_trace("t.csv", "action,addr,size,stream\nalloc,16,100,0\nsegment_alloc,0,2097152,0\nfree_requested,16,100,0\n".as_bytes()).unwrap();
        assert_eq!(ok.len(), 2);
    }
}
