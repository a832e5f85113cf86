//! The leak guard: a baseline taken before a training loop's iteration, and a report
//! of the blocks allocated since that are still alive after it, with their sizes and,
//! when the memory history records backtraces, where each one was made.
//!
//! A loop that frees what each iteration makes ends every iteration with nothing new
//! alive; a block that outlives its iteration is either state kept on purpose (an
//! optimizer's moments, made once) or a leak (a loss kept in a list, made every time).
//! Checking at the end of each iteration and starting again tells the two apart: the
//! first shows up once, the second every time.

use std::fmt;

use super::{Allocator, LiveBlock};
use crate::format::bytes;

// ANCHOR: leak_guard
pub struct LeakGuard<'a> {
    allocator: &'a Allocator,
    /// Allocations handed out before the baseline.
    baseline: u64,
    allocated_at_baseline: u64,
}

impl<'a> LeakGuard<'a> {
    /// Takes a baseline now.
    pub fn new(allocator: &'a Allocator) -> Self {
        LeakGuard {
            allocator,
            baseline: allocator.allocations_so_far(),
            allocated_at_baseline: allocator.memory_allocated(),
        }
    }

    /// The blocks allocated since the baseline and still alive.
    pub fn check(&self) -> LeakReport {
        let blocks: Vec<LiveBlock> = self
            .allocator
            .live_blocks()
            .into_iter()
            .filter(|b| b.serial > self.baseline)
            .collect();
        LeakReport {
            blocks,
            allocated_at_baseline: self.allocated_at_baseline,
            allocated_now: self.allocator.memory_allocated(),
        }
    }

    /// [`check`](Self::check), then a new baseline: call it at the end of each
    /// iteration.
    pub fn end_iteration(&mut self) -> LeakReport {
        let report = self.check();
        *self = LeakGuard::new(self.allocator);
        report
    }
}
// ANCHOR_END: leak_guard

/// What a [`LeakGuard`] found.
#[derive(Debug, Clone)]
pub struct LeakReport {
    /// Blocks allocated since the baseline and still alive, oldest first.
    pub blocks: Vec<LiveBlock>,
    pub allocated_at_baseline: u64,
    pub allocated_now: u64,
}

impl LeakReport {
    pub fn is_clean(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Bytes held by the surviving blocks.
    pub fn bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.size).sum()
    }
}

/// How many frames of each backtrace a report prints.
const FRAMES_SHOWN: usize = 4;

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return write!(
                f,
                "no block outlived the iteration (allocated: {})",
                bytes(self.allocated_now)
            );
        }
        writeln!(
            f,
            "{} block(s), {}, outlived the iteration (allocated: {} -> {}):",
            self.blocks.len(),
            bytes(self.bytes()),
            bytes(self.allocated_at_baseline),
            bytes(self.allocated_now)
        )?;
        for b in &self.blocks {
            writeln!(
                f,
                "  {:>10} (asked for {} B) at {:#x}, allocation #{}",
                bytes(b.size),
                b.requested,
                b.addr,
                b.serial
            )?;
            match &b.backtrace {
                Some(bt) => {
                    let frames = super::frames_of(bt);
                    writeln!(f, "      {}", super::origin_of(&frames))?;
                    for fr in frames.iter().take(FRAMES_SHOWN) {
                        if fr.filename.is_empty() {
                            writeln!(f, "      at {}", fr.name)?;
                        } else {
                            writeln!(f, "      at {} ({}:{})", fr.name, fr.filename, fr.line)?;
                        }
                    }
                }
                None => writeln!(
                    f,
                    "      (record the history with backtraces to see where it was made)"
                )?,
            }
        }
        Ok(())
    }
}
