//! The epochs of expandable segments' idle memory: when memory that fell idle is safe
//! to unmap (`pages.rs` says why epochs close on events rather than on waits).

use super::caching::State;
use crate::backend::{Event, MemoryBackend, Stream};
use crate::error::Result;

/// Frees between two epochs: often enough that memory wanted back has usually fallen
/// idle in an epoch whose events have completed, seldom enough that recording them
/// costs nothing measurable (one event a stream, about a microsecond).
pub(super) const FREES_PER_EPOCH: u32 = 16;

/// The end of an epoch: an event on each stream that owned memory that fell idle in
/// it, or `None` when one of those streams is not the allocator's to record on (a
/// device-wide synchronisation is then the wait).
pub(super) struct Marker {
    pub epoch: u64,
    pub events: Option<Vec<Event>>,
}

impl State {
    /// Counts a free, closing the epoch every [`FREES_PER_EPOCH`] frees when memory
    /// fell idle in it. Where the allocator does not hold every stream that owns idle memory (a replay
    /// of a trace names streams by number), epochs close only when memory is wanted,
    /// with one device-wide synchronisation.
    pub(super) fn count_free(&mut self, be: &dyn MemoryBackend) -> Result<()> {
        self.pages.frees += 1;
        self.pages.frees_total += 1;
        if self.pages.frees >= FREES_PER_EPOCH && !self.pages.idle_dirty.is_empty() {
            if let Some(streams) = self.idle_owners() {
                self.close_epoch(be, Some(streams))?;
            }
        }
        Ok(())
    }

    /// The streams that own memory that fell idle in the current epoch, if the
    /// allocator holds them all.
    pub(super) fn idle_owners(&self) -> Option<Vec<Stream>> {
        (self.pages.dirty_owners.iter())
            .map(|&i| self.stream_objects.get(i as usize).cloned().flatten())
            .collect::<Option<Vec<Stream>>>()
            .filter(|streams| !streams.is_empty())
    }

    /// Ends the current epoch: an event on each of `streams`, those that own memory
    /// that fell idle in it (`None`: the wait will be device-wide), and that memory
    /// joins the closed epochs' idle set.
    pub(super) fn close_epoch(
        &mut self,
        be: &dyn MemoryBackend,
        streams: Option<Vec<Stream>>,
    ) -> Result<()> {
        let events = match streams {
            Some(streams) if !streams.is_empty() => {
                let mut events = Vec::with_capacity(streams.len());
                for stream in streams {
                    let event = be.new_event()?;
                    stream.record(&event)?;
                    events.push(event);
                }
                Some(events)
            }
            _ => None,
        };
        self.pages.markers.push_back(Marker {
            epoch: self.pages.epoch,
            events,
        });
        self.pages.epoch += 1;
        self.pages.frees = 0;
        let mut dirty = std::mem::take(&mut self.pages.idle_dirty);
        self.pages.idle.append(&mut dirty);
        self.pages.dirty_owners.clear();
        Ok(())
    }

    /// Waits until no queued work can use memory that fell idle in epoch `since`,
    /// which is then safe to unmap: for the events of the epochs up to it that have not
    /// completed (closing the current epoch first when `since` is it).
    pub(super) fn settle(&mut self, be: &dyn MemoryBackend, since: u64) -> Result<()> {
        if since == self.pages.epoch {
            let streams = self.idle_owners();
            self.close_epoch(be, streams)?;
        }
        while self.pages.markers.front().is_some_and(|m| m.epoch <= since) {
            let marker = self.pages.markers.pop_front().expect("checked");
            match marker.events {
                Some(events) => {
                    for event in events {
                        if !event.query()? {
                            (self.stats.driver.synchronize).time(|| event.synchronize())?;
                            self.stats.num_stream_syncs += 1;
                        }
                    }
                }
                None => {
                    (self.stats.driver.synchronize).time(|| be.synchronize())?;
                    self.stats.num_sync_all_streams += 1;
                    // Every epoch closed so far is done with.
                    self.pages.markers.clear();
                }
            }
        }
        Ok(())
    }
}
