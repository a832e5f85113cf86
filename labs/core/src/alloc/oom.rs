//! Before raising out-of-memory: the retry ladder, and the one place the allocator's
//! out-of-memory error is built.

use super::allocator::Allocation;
use super::caching::State;
use super::pool::PoolKey;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::snapshot::TraceAction;

/// What has been tried for a request so far, in the order the ladder climbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Best fit, else a new segment.
    First,
    /// Again, after waiting for the events of pending cross-stream frees.
    AfterWaitingForFrees,
    /// Again, after returning every cached byte to the driver.
    AfterReleasingCache,
}

impl State {
    // ANCHOR: malloc_retry
    /// Serves a request that no parked block could: tries, and on out-of-memory frees
    /// what can be freed and tries again, the whole search each time.
    pub(super) fn malloc_with_retries(
        &mut self,
        be: &dyn Backend,
        key: PoolKey,
        stream: u64,
        rounded: u64,
        size: u64,
    ) -> Result<Allocation> {
        let mut attempt = Attempt::First;
        loop {
            match self.try_malloc(be, key, stream, rounded, size) {
                Err(e) if e.is_out_of_memory() => {}
                result => return result,
            }
            attempt = match attempt {
                // A block freed on another stream may be exactly what is needed: wait
                // for its events rather than fail (PyTorch can raise here).
                Attempt::First if !self.deferred.is_empty() => {
                    self.process_events(true)?;
                    Attempt::AfterWaitingForFrees
                }
                Attempt::First | Attempt::AfterWaitingForFrees => {
                    self.stats.num_alloc_retries += 1;
                    self.process_events(true)?;
                    self.release_cached(be)?;
                    Attempt::AfterReleasingCache
                }
                Attempt::AfterReleasingCache => {
                    self.stats.num_ooms += 1;
                    self.note(TraceAction::Oom, 0, size, stream);
                    return Err(self.out_of_memory(size));
                }
            };
        }
    }
    // ANCHOR_END: malloc_retry

    /// The allocator's out-of-memory error for a request of `requested` bytes: what
    /// is left under the limit (the device's memory times the memory fraction).
    pub(super) fn out_of_memory(&self, requested: u64) -> Error {
        Error::OutOfMemory {
            device: self.device,
            requested,
            free: self.limit.saturating_sub(self.stats.reserved.current),
            total: self.limit,
        }
    }
}
