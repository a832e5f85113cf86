//! One snapshot's trace read for a comparison: the allocation sequence (allocs and the
//! frees that end them, by size, since addresses differ from run to run), the segment
//! events placed in it, the totals over it, and the blocks live at its peak.
//!
//! Everything here comes from the trace, which both formats record the same way (an
//! `alloc`'s size is the requested size, in PyTorch's and in ours), so that two
//! snapshots are measured alike whatever wrote them.

use std::collections::HashMap;

use crate::alloc::{origin_of, round_size};
use crate::snapshot::{Frame, Snapshot, TraceAction, TraceEvent};
use serde::Serialize;

/// A step of the allocation sequence: a request, or the free of one (by the size its
/// alloc requested, which both formats agree on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "size", rename_all = "snake_case")]
pub enum Step {
    Alloc(u64),
    Free(u64),
}

/// A segment event (`segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`)
/// and where it falls in the allocation sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentEvent {
    /// Its index among the device's trace events.
    pub event: usize,
    /// Steps of the allocation sequence before it.
    pub position: usize,
    pub action: String,
    pub size: u64,
}

/// The figures of one trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub trace_events: usize,
    pub allocs: usize,
    pub frees: usize,
    /// Segment events by action (`segment_alloc`, …), those the trace has.
    pub segment_events: Vec<(String, usize)>,
    /// Peak of the live requested bytes.
    pub peak_requested: u64,
    /// Peak of the live bytes, each request rounded as the allocator rounds it (to
    /// 512 bytes): the allocated peak, less the slack of blocks handed out unsplit.
    pub peak_allocated: u64,
    /// Peak of the bytes reserved: the reservation when the trace began plus the
    /// running sum of its segment events.
    pub peak_reserved: u64,
    /// Bytes reserved when the trace began (the end state's segments less the trace's
    /// net segment events): 0 when the recording started on an empty cache.
    pub reserved_at_start: u64,
    /// Segments and bytes reserved in the end state.
    pub final_segments: usize,
    pub final_reserved: u64,
}

/// A block live at the peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveBlock {
    pub requested: u64,
    /// Its category (and the op that saved it) in our snapshots, else its call site.
    pub label: Option<String>,
}

/// One device's trace, read.
pub struct Trace<'a> {
    pub events: Vec<&'a TraceEvent>,
    /// The allocation sequence, with each step's event index.
    pub steps: Vec<(usize, Step)>,
    pub segments: Vec<SegmentEvent>,
    /// For each free event's index, the index of the alloc it ends.
    pub alloc_of_free: HashMap<usize, usize>,
    pub totals: Totals,
    /// The index of the event at which the allocated peak is first reached.
    pub peak_event: Option<usize>,
}

fn is_segment(a: &TraceAction) -> bool {
    matches!(
        a,
        TraceAction::SegmentAlloc
            | TraceAction::SegmentFree
            | TraceAction::SegmentMap
            | TraceAction::SegmentUnmap
    )
}

/// Bytes a request occupies, rounded as PyTorch's allocator and ours round by default.
pub fn rounded(size: u64) -> u64 {
    round_size(size, 0)
}

impl<'a> Trace<'a> {
    /// Reads `snapshot`'s trace of `device`.
    pub fn read(snapshot: &'a Snapshot, device: i64) -> Trace<'a> {
        let events: Vec<&TraceEvent> = (snapshot.trace.iter())
            .filter(|e| e.device == device)
            .collect();
        let mut steps = Vec::new();
        let mut segments = Vec::new();
        let mut alloc_of_free = HashMap::new();
        let mut live: HashMap<u64, (usize, u64)> = HashMap::new();
        let (mut requested, mut allocated) = (0u128, 0u128);
        let (mut peak_requested, mut peak_allocated) = (0u128, 0u128);
        let mut peak_event = None;
        let (mut reserved, mut lowest, mut highest) = (0i128, 0i128, 0i128);
        let mut counts: Vec<(String, usize)> = Vec::new();
        let (mut allocs, mut frees) = (0, 0);
        for (i, e) in events.iter().enumerate() {
            match &e.action {
                TraceAction::Alloc => {
                    allocs += 1;
                    if let Some((_, old)) = live.insert(e.addr, (i, e.size)) {
                        requested -= old as u128;
                        allocated -= rounded(old) as u128;
                    }
                    requested += e.size as u128;
                    allocated += rounded(e.size) as u128;
                    peak_requested = peak_requested.max(requested);
                    if allocated > peak_allocated {
                        peak_allocated = allocated;
                        peak_event = Some(i);
                    }
                    steps.push((i, Step::Alloc(e.size)));
                }
                TraceAction::FreeRequested => {
                    frees += 1;
                    let size = match live.remove(&e.addr) {
                        Some((at, size)) => {
                            alloc_of_free.insert(i, at);
                            requested -= size as u128;
                            allocated -= rounded(size) as u128;
                            size
                        }
                        None => e.size,
                    };
                    steps.push((i, Step::Free(size)));
                }
                a if is_segment(a) => {
                    let grows = matches!(a, TraceAction::SegmentAlloc | TraceAction::SegmentMap);
                    reserved += if grows {
                        e.size as i128
                    } else {
                        -(e.size as i128)
                    };
                    lowest = lowest.min(reserved);
                    highest = highest.max(reserved);
                    match counts.iter_mut().find(|(n, _)| n == a.as_str()) {
                        Some((_, c)) => *c += 1,
                        None => counts.push((a.as_str().to_string(), 1)),
                    }
                    segments.push(SegmentEvent {
                        event: i,
                        position: steps.len(),
                        action: a.as_str().to_string(),
                        size: e.size,
                    });
                }
                _ => {}
            }
        }
        let final_segments: Vec<_> = (snapshot.segments.iter())
            .filter(|s| s.device == device)
            .collect();
        let final_reserved: u64 = final_segments.iter().map(|s| s.total_size).sum();
        // What was reserved before the trace: the end state less the trace's net, and
        // never less than what the trace frees below its start.
        let at_start = (final_reserved as i128 - reserved).max(-lowest).max(0);
        let clamp = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let totals = Totals {
            trace_events: events.len(),
            allocs,
            frees,
            segment_events: counts,
            peak_requested: clamp(peak_requested),
            peak_allocated: clamp(peak_allocated),
            peak_reserved: clamp((at_start + highest) as u128),
            reserved_at_start: clamp(at_start as u128),
            final_segments: final_segments.len(),
            final_reserved,
        };
        Trace {
            events,
            steps,
            segments,
            alloc_of_free,
            totals,
            peak_event,
        }
    }

    /// The blocks live just after the allocated peak was first reached.
    pub fn live_at_peak(&self) -> Vec<LiveBlock> {
        let Some(peak) = self.peak_event else {
            return Vec::new();
        };
        let mut live: HashMap<u64, usize> = HashMap::new();
        for (i, e) in self.events[..=peak].iter().enumerate() {
            match e.action {
                TraceAction::Alloc => {
                    live.insert(e.addr, i);
                }
                TraceAction::FreeRequested => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        let mut at: Vec<usize> = live.into_values().collect();
        at.sort_unstable();
        at.into_iter()
            .map(|i| LiveBlock {
                requested: self.events[i].size,
                label: label(self.events[i]),
            })
            .collect()
    }

    /// What the event at `i` concerns: its own label, or for a free its alloc's.
    pub fn label_of(&self, i: usize) -> Option<String> {
        let at = self.alloc_of_free.get(&i).copied().unwrap_or(i);
        match self.events[at].action {
            TraceAction::Alloc => label(self.events[at]),
            _ => None,
        }
    }
}

/// An alloc's category (with the op that saved the block) where our snapshots record
/// it, else its call site: the first frame of the program (not of PyTorch or of our
/// runtime), else the innermost frame.
pub fn label(e: &TraceEvent) -> Option<String> {
    if let Some(c) = &e.category {
        return Some(match &e.saved_by {
            Some(op) => format!("{c} ({op})"),
            None => c.clone(),
        });
    }
    call_site(&e.frames)
}

fn call_site(frames: &[Frame]) -> Option<String> {
    if frames.iter().any(|f| f.filename.ends_with(".rs")) {
        let origin = origin_of(frames);
        return origin.at.or(origin.op);
    }
    let library = |f: &Frame| {
        ["/torch/", "site-packages/", "dist-packages/", "/lib/python"]
            .iter()
            .any(|p| f.filename.contains(p))
    };
    // The program's Python, else any Python, else the first frame with a file (C++
    // frames of the unwinder itself have none), else the innermost.
    let python = |f: &&Frame| f.filename.ends_with(".py");
    let f = (frames.iter().filter(python).find(|f| !library(f)))
        .or_else(|| frames.iter().find(python))
        .or_else(|| {
            frames
                .iter()
                .find(|f| !f.filename.is_empty() && f.filename != "??")
        })
        .or_else(|| frames.first())?;
    if f.filename.is_empty() {
        return Some(f.name.clone());
    }
    let file = f.filename.rsplit('/').next().unwrap_or(&f.filename);
    Some(format!("{file}:{} {}", f.line, f.name))
}
