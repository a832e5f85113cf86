//! Memory over the trace: allocated and reserved bytes after each event, and the life
//! of every allocation as an interval of events (what PyTorch's memory_viz draws as
//! its "Active Memory Timeline").
//!
//! Points are numbered by event: point 0 is before the first event of the device,
//! point k after its k-th event. A trace kept in a ring buffer may start after
//! allocations were made; the snapshot's final state fills in what the trace does not
//! show, so that the timeline ends where the snapshot is.

use std::collections::HashMap;

use super::model::{BlockState, Frame, Snapshot, TraceAction, TraceEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelinePoint {
    /// 0 before the first event, k after the k-th.
    pub event: usize,
    pub time_us: i64,
    /// Bytes of live allocations, as the trace records them (requested sizes).
    pub allocated: u64,
    /// Bytes held in segments.
    pub reserved: u64,
}

/// One allocation's life: live at points `start..end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    pub addr: u64,
    pub size: u64,
    pub start: usize,
    pub end: usize,
    /// The innermost Python frame of the allocation, when the trace has frames.
    pub origin: Option<String>,
}

fn device_events(s: &Snapshot, device: i64) -> Vec<&TraceEvent> {
    s.trace.iter().filter(|e| e.device == device).collect()
}

/// Where an allocation was made, in words a reader of the training script recognises:
/// `file:line function` of the innermost Python frame; without one (the backward pass
/// runs in C++ threads) the first C++ function above the allocator's own.
fn origin(frames: &[Frame]) -> Option<String> {
    if let Some(f) = frames.iter().find(|f| f.filename.ends_with(".py")) {
        let file = f.filename.rsplit('/').next().unwrap_or(&f.filename);
        return Some(format!("{}:{} {}", file, f.line, f.name));
    }
    if frames
        .iter()
        .any(|f| crate::runtime::is_runtime_symbol(&f.name))
    {
        return rust_origin(frames);
    }
    const MACHINERY: [&str; 5] = [
        "c10::",
        "torch::unwind",
        "torch::CapturedTraceback",
        "torch::cuda::",
        "at::detail::",
    ];
    let f = frames
        .iter()
        .find(|f| !MACHINERY.iter().any(|m| f.name.starts_with(m)))?;
    let name = f.name.replace("(anonymous namespace)", "{anon}");
    let name = name.split('(').next().unwrap_or(&name);
    let parts: Vec<&str> = name.rsplitn(3, "::").collect();
    let short = match parts.as_slice() {
        [last, parent, ..] => format!("{parent}::{last}"),
        _ => name.to_string(),
    };
    Some(format!("{short} (C++)"))
}

/// The first frame of a Rust backtrace (one of our snapshots) outside this library and
/// the standard library, as `Type::function`, with its file and line when the binary
/// kept them.
fn rust_origin(frames: &[Frame]) -> Option<String> {
    const MACHINERY: [&str; 4] = ["core::", "alloc::", "std::", "<"];
    let f = frames.iter().find(|f| {
        !crate::runtime::is_runtime_symbol(&f.name)
            && !MACHINERY.iter().any(|m| f.name.starts_with(m))
    })?;
    let path: Vec<&str> = f
        .name
        .split("::")
        .filter(|p| !p.starts_with('{') && !p.starts_with('<'))
        .collect();
    let short = path[path.len().saturating_sub(2)..].join("::");
    Some(if f.filename.is_empty() {
        short
    } else {
        let file = f.filename.rsplit('/').next().unwrap_or(&f.filename);
        format!("{}:{} {}", file, f.line, short)
    })
}

/// Every allocation of `device` with the points at which it was live. Allocations
/// made before the trace began start at 0; those still live at the end run to the
/// last point.
pub fn live_intervals(s: &Snapshot, device: i64) -> Vec<Interval> {
    let events = device_events(s, device);
    let last = events.len() + 1;
    let mut open: HashMap<u64, Interval> = HashMap::new();
    let mut done = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let k = i + 1;
        match e.action {
            TraceAction::Alloc => {
                let fresh = Interval {
                    addr: e.addr,
                    size: e.size,
                    start: k,
                    end: last,
                    origin: origin(&e.frames),
                };
                // A second alloc at a live address means the trace lost the free.
                if let Some(mut old) = open.insert(e.addr, fresh) {
                    old.end = k;
                    done.push(old);
                }
            }
            TraceAction::FreeCompleted => match open.remove(&e.addr) {
                Some(mut iv) => {
                    iv.end = k;
                    done.push(iv);
                }
                None => done.push(Interval {
                    addr: e.addr,
                    size: e.size,
                    start: 0,
                    end: k,
                    origin: origin(&e.frames),
                }),
            },
            _ => {}
        }
    }
    for seg in s.segments.iter().filter(|g| g.device == device) {
        for b in &seg.blocks {
            let live = matches!(
                b.state,
                BlockState::ActiveAllocated | BlockState::ActivePendingFree
            );
            if live && !open.contains_key(&b.address) {
                done.push(Interval {
                    addr: b.address,
                    size: b.requested_size,
                    start: 0,
                    end: last,
                    origin: origin(&b.frames),
                });
            }
        }
    }
    done.extend(open.into_values());
    done.sort_by_key(|iv| (iv.start, iv.addr));
    done
}

/// Sum of the live intervals at each of `points` points.
fn live_totals(intervals: &[Interval], points: usize) -> Vec<u64> {
    let mut delta = vec![0i128; points + 1];
    for iv in intervals {
        delta[iv.start.min(points)] += iv.size as i128;
        delta[iv.end.min(points)] -= iv.size as i128;
    }
    let mut acc = 0i128;
    delta[..points]
        .iter()
        .map(|d| {
            acc += d;
            acc.max(0) as u64
        })
        .collect()
}

/// Allocated and reserved bytes of `device` at every point of the trace.
pub fn memory_timeline(s: &Snapshot, device: i64) -> Vec<TimelinePoint> {
    let events = device_events(s, device);
    let points = events.len() + 1;
    let allocated = live_totals(&live_intervals(s, device), points);

    let change = |e: &TraceEvent| -> i128 {
        match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => e.size as i128,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => -(e.size as i128),
            _ => 0,
        }
    };
    let final_reserved: i128 = s
        .segments
        .iter()
        .filter(|g| g.device == device)
        .map(|g| g.total_size as i128)
        .sum();
    let net: i128 = events.iter().map(|e| change(e)).sum();
    let mut reserved = (final_reserved - net).max(0);

    let first_time = events.first().map_or(0, |e| e.time_us);
    let mut out = Vec::with_capacity(points);
    out.push(TimelinePoint {
        event: 0,
        time_us: first_time,
        allocated: allocated[0],
        reserved: reserved as u64,
    });
    for (i, e) in events.iter().enumerate() {
        reserved = (reserved + change(e)).max(0);
        out.push(TimelinePoint {
            event: i + 1,
            time_us: e.time_us,
            allocated: allocated[i + 1],
            reserved: reserved as u64,
        });
    }
    out
}

/// The largest allocations as bands to stack, and everything else summed.
#[derive(Debug, Clone)]
pub struct Bands {
    pub points: usize,
    /// The `top` largest allocations, in the order they were made (bottom band
    /// first).
    pub bands: Vec<Interval>,
    /// Bytes of all other live allocations at each point.
    pub others: Vec<u64>,
    /// Bytes of all live allocations at each point.
    pub total: Vec<u64>,
}

impl Bands {
    /// The bytes band `i` holds at each point.
    pub fn values(&self, i: usize) -> Vec<u64> {
        let b = &self.bands[i];
        (0..self.points)
            .map(|k| {
                if (b.start..b.end).contains(&k) {
                    b.size
                } else {
                    0
                }
            })
            .collect()
    }
}

/// Picks the `top` largest of `device`'s allocations to draw one by one.
pub fn stacked_bands(s: &Snapshot, device: i64, top: usize) -> Bands {
    let points = device_events(s, device).len() + 1;
    let intervals = live_intervals(s, device);
    let total = live_totals(&intervals, points);
    let mut by_size: Vec<&Interval> = intervals.iter().collect();
    by_size.sort_by_key(|iv| (std::cmp::Reverse(iv.size), iv.start, iv.addr));
    let mut bands: Vec<Interval> = by_size.into_iter().take(top).cloned().collect();
    bands.sort_by_key(|iv| (iv.start, iv.addr));
    let top_total = live_totals(&bands, points);
    let others = total
        .iter()
        .zip(&top_total)
        .map(|(t, b)| t.saturating_sub(*b))
        .collect();
    Bands {
        points,
        bands,
        others,
        total,
    }
}
