//! The allocator's memory history (PyTorch's `_record_memory_history`): a ring buffer
//! of what happened (allocations, frees, segments mapped and unmapped, out-of-memory
//! failures), each with a time, a stream and, when asked for, the Rust backtrace of the
//! call that caused it.
//!
//! Off by default, and then it costs the allocator one predictable branch per call.
//! Backtraces are captured unresolved (a few microseconds each) and resolved to
//! function names only when a snapshot is taken.

use labs_base::clock::{since_epoch, Instant};
use std::backtrace::Backtrace;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::snapshot::{Frame, TraceAction};

/// One entry of the history.
#[derive(Debug, Clone)]
pub struct HistoryEvent {
    /// PyTorch's name for what happened: `alloc` (the size is the requested size),
    /// `free_requested`, `free_completed` (later than `free_requested` only when other
    /// streams were still using the block), `segment_alloc` / `segment_free` (a fixed
    /// segment from or to the driver), `segment_map` / `segment_unmap` (pages of an
    /// expandable segment), `oom` (the size is the request).
    pub action: TraceAction,
    pub addr: u64,
    pub size: u64,
    /// The stream's handle (the trace's stream id).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
    /// Where the call came from, when backtraces are recorded.
    pub backtrace: Option<Arc<Backtrace>>,
    /// Of an `alloc`: what the block held, as last set while it was live and this
    /// event was still in the ring (a block changes category when its role does).
    pub category: Option<super::Category>,
    /// Of an `alloc`: the autograd op that saved the block for backward, if one did.
    pub saved_by: Option<String>,
}

impl HistoryEvent {
    /// The backtrace as frames, innermost first, without the allocator's own frames.
    pub fn frames(&self) -> Vec<Frame> {
        self.backtrace.as_deref().map(frames_of).unwrap_or_default()
    }
}

pub(crate) struct History {
    events: VecDeque<HistoryEvent>,
    max_entries: usize,
    backtraces: bool,
    /// Where each live block was allocated, for snapshots and the leak guard.
    alloc_sites: HashMap<u64, Arc<Backtrace>>,
    /// The autograd op that saved each live block for backward (`MmBackward`, …).
    saved_by: HashMap<u64, String>,
    /// The number (counted from the first event ever recorded) of each live block's
    /// `alloc` event, so that a later change of category or a save reaches it.
    alloc_events: HashMap<u64, u64>,
    started: Instant,
    started_us: i64,
    /// Entries pushed out of the ring buffer.
    pub dropped: u64,
}

impl History {
    pub fn new(max_entries: usize, backtraces: bool) -> History {
        let started_us = since_epoch().as_micros() as i64;
        History {
            events: VecDeque::with_capacity(max_entries.min(1 << 16)),
            max_entries,
            backtraces,
            alloc_sites: HashMap::new(),
            saved_by: HashMap::new(),
            alloc_events: HashMap::new(),
            started: Instant::now(),
            started_us,
            dropped: 0,
        }
    }

    /// Records an event. Called with the allocator's lock held, so a backtrace is
    /// captured without resolving symbols.
    #[cold]
    pub fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: u64) {
        let backtrace = match (self.backtraces, &action) {
            (true, TraceAction::Alloc | TraceAction::FreeRequested | TraceAction::Oom) => {
                Some(Arc::new(Backtrace::force_capture()))
            }
            _ => None,
        };
        match action {
            TraceAction::FreeRequested => {
                self.saved_by.remove(&addr);
                self.alloc_events.remove(&addr);
            }
            TraceAction::Alloc => {
                let number = self.dropped + self.events.len() as u64;
                // The push below may drop the oldest entry; numbers are unaffected.
                self.alloc_events.insert(addr, number);
            }
            _ => {}
        }
        if self.backtraces {
            match action {
                TraceAction::Alloc => {
                    if let Some(bt) = &backtrace {
                        self.alloc_sites.insert(addr, bt.clone());
                    }
                }
                TraceAction::FreeRequested => {
                    self.alloc_sites.remove(&addr);
                }
                _ => {}
            }
        }
        if self.events.len() == self.max_entries {
            self.events.pop_front();
            self.dropped += 1;
        }
        let time_us = self.started_us + self.started.elapsed().as_micros() as i64;
        self.events.push_back(HistoryEvent {
            action,
            addr,
            size,
            stream,
            time_us,
            backtrace,
            category: None,
            saved_by: None,
        });
    }

    /// The `alloc` event of the live block at `addr`, while still in the ring.
    fn alloc_event(&mut self, addr: u64) -> Option<&mut HistoryEvent> {
        let number = *self.alloc_events.get(&addr)?;
        let index = number.checked_sub(self.dropped)?;
        self.events.get_mut(usize::try_from(index).ok()?)
    }

    /// Notes that the live block at `addr` now holds `category`.
    pub fn categorise(&mut self, addr: u64, category: super::Category) {
        if let Some(e) = self.alloc_event(addr) {
            e.category = Some(category);
        }
    }

    pub fn events(&self) -> Vec<HistoryEvent> {
        self.events.iter().cloned().collect()
    }

    /// Notes that the autograd op `op` saved the live block at `addr` for backward.
    pub fn note_saved(&mut self, addr: u64, op: String) {
        if let Some(e) = self.alloc_event(addr) {
            e.saved_by = Some(op.clone());
        }
        self.saved_by.insert(addr, op);
    }

    /// The autograd op that saved the live block at `addr`, if any did while recording.
    pub fn saved_by(&self, addr: u64) -> Option<&str> {
        self.saved_by.get(&addr).map(String::as_str)
    }

    /// Where the live block at `addr` was allocated, if recorded.
    pub fn alloc_site(&self, addr: u64) -> Option<Arc<Backtrace>> {
        self.alloc_sites.get(&addr).cloned()
    }
}

/// The frames of a backtrace, innermost first, from the caller of the allocator
/// outwards: the capture itself, the allocator and the standard library's start-up
/// code are left out.
pub fn frames_of(bt: &Backtrace) -> Vec<Frame> {
    let text = bt.to_string();
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(at) = t.strip_prefix("at ") {
            // "at path/to/file.rs:LINE:COL"
            if let Some(f) = frames.last_mut() {
                let mut parts = at.rsplitn(3, ':');
                let _col = parts.next();
                let line = parts.next().and_then(|l| l.parse().ok()).unwrap_or(0);
                f.filename = workspace_relative(parts.next().unwrap_or(at));
                f.line = line;
            }
        } else if let Some((n, name)) = t.split_once(": ") {
            if n.chars().all(|c| c.is_ascii_digit()) {
                frames.push(Frame {
                    name: name.to_string(),
                    filename: String::new(),
                    line: 0,
                });
            }
        }
    }
    // The modules of the allocator itself (not replay, which is a caller).
    const ALLOCATOR: [&str; 8] = [
        "labs_alloc::alloc::allocator::",
        "labs_alloc::alloc::caching::",
        "labs_alloc::alloc::deferred::",
        "labs_alloc::alloc::fit::",
        "labs_alloc::alloc::oom::",
        "labs_alloc::alloc::pages::",
        "labs_alloc::alloc::parked::",
        "labs_alloc::alloc::history::History",
    ];
    // Release builds keep line tables only: an inlined frame then has its bare name
    // ("malloc"), and its file tells where it belongs.
    let is_internal = |f: &Frame| {
        f.name.starts_with("std::backtrace")
            || ALLOCATOR.iter().any(|m| f.name.contains(m))
            || (!f.name.contains("::")
                && (f.filename.contains("library/std/src/backtrace")
                    || (f.filename.starts_with("labs/core/alloc/src/alloc/")
                        && !f.filename.ends_with("replay.rs"))))
    };
    // A bare name with no file: an inlined frame whose line tables the linker or the
    // build left out (it happens to the allocator's own frames in some builds).
    let unknown = |f: &Frame| !f.name.contains("::") && f.filename.is_empty();
    // Skip the capture and the allocator's frames at the top, through the last one
    // known to be the allocator's among them; stop at the runtime's start-up code.
    let top = (frames.iter())
        .position(|f| !is_internal(f) && !unknown(f))
        .unwrap_or(frames.len());
    let first = frames[..top]
        .iter()
        .rposition(is_internal)
        .map_or(0, |i| i + 1);
    frames
        .into_iter()
        .skip(first)
        .take_while(|f| {
            !f.name.starts_with("std::rt::")
                && !f
                    .name
                    .starts_with("std::sys::backtrace::__rust_begin_short_backtrace")
                && (f.name != "main" || !f.filename.is_empty())
                && !f.name.starts_with("__libc_start")
        })
        .collect()
}

/// A source path as readers know it: our files from `labs/`, dependencies from their
/// crate's folder; where the project was built is nobody's business.
fn workspace_relative(path: &str) -> String {
    // The standard library prints a path under the working directory as "./...".
    let absolute;
    let path = match (path.strip_prefix("./"), std::env::current_dir()) {
        (Some(rest), Ok(cwd)) => {
            absolute = cwd.join(rest).to_string_lossy().into_owned();
            absolute.as_str()
        }
        _ => path,
    };
    if let Some(i) = path.rfind("/labs/") {
        return path[i + 1..].to_string();
    }
    if let Some(i) = path.find("/registry/src/") {
        let rest = &path[i + "/registry/src/".len()..];
        return rest.split_once('/').map_or(rest, |(_, r)| r).to_string();
    }
    path.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_entries() {
        let mut h = History::new(3, false);
        for i in 0..5 {
            h.record(TraceAction::Alloc, i * 512, 512, 0);
        }
        let addrs: Vec<u64> = h.events().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, [1024, 1536, 2048]);
        assert_eq!(h.dropped, 2);
        let times: Vec<i64> = h.events().iter().map(|e| e.time_us).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn paths_are_shown_from_the_workspace() {
        assert_eq!(
            workspace_relative("/home/x/project/labs/lab-03/src/demo.rs"),
            "labs/lab-03/src/demo.rs"
        );
        assert_eq!(
            workspace_relative("/h/.cargo/registry/src/index.crates.io-1/half-2.4/src/lib.rs"),
            "half-2.4/src/lib.rs"
        );
    }
}
