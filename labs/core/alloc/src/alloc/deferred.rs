//! Frees that wait on other streams: a block used by work on streams other than its
//! own (`record_stream`) is freed only after that work, which the allocator learns
//! from an event recorded on each of those streams at the free.

use super::caching::State;
use super::pool::BlockState;
use crate::backend::{Event, MemoryBackend};
use crate::error::Result;
use crate::snapshot::TraceAction;

/// The events of cross-stream frees, each with the block it holds back.
#[derive(Default)]
pub(super) struct Deferred(Vec<(Event, u32)>);

impl Deferred {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl State {
    // ANCHOR: defer_free
    /// Frees block `id` (already counted as freed) once the work queued so far on
    /// every other stream that used it has completed: it stays pending until then.
    pub(super) fn defer_free(&mut self, be: &dyn MemoryBackend, id: u32) -> Result<()> {
        let b = &mut self.blocks[id];
        b.state = BlockState::Pending;
        let uses = std::mem::take(&mut b.stream_uses);
        for s in &uses {
            let event = be.new_event()?;
            s.record(&event)?;
            self.deferred.0.push((event, id));
            self.blocks[id].pending_events += 1;
        }
        self.stats.num_deferred_frees += 1;
        Ok(())
    }
    // ANCHOR_END: defer_free

    /// Frees blocks whose events have completed; with `wait`, waits for all of them.
    pub(super) fn process_events(&mut self, wait: bool) -> Result<()> {
        let mut i = 0;
        while i < self.deferred.0.len() {
            let event = &self.deferred.0[i].0;
            let done = if wait {
                event.synchronize()?;
                true
            } else {
                event.query()?
            };
            if !done {
                i += 1;
                continue;
            }
            let (_, id) = self.deferred.0.swap_remove(i);
            let b = &mut self.blocks[id];
            b.pending_events -= 1;
            if b.pending_events == 0 {
                b.state = BlockState::Free;
                if self.history.is_some() {
                    let b = &self.blocks[id];
                    let (addr, requested, stream) = (b.addr, b.requested, self.stream_of(b.key));
                    self.note(TraceAction::FreeCompleted, addr, requested, stream);
                }
                self.deactivate(id);
            }
        }
        Ok(())
    }

    /// Releases a block that has just stopped being active (freed, with no other
    /// stream's work outstanding).
    fn deactivate(&mut self, id: u32) {
        let b = &self.blocks[id];
        let pool = b.key.pool;
        self.stats.active.sub(pool, 1);
        self.stats.active_bytes.sub(pool, b.size);
        self.release_block(id);
    }
}
