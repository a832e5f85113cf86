//! Workshop exercises. The default build compiles the reference solutions, so CI
//! checks them; `--features exercises` swaps in the starter code, and the same tests
//! (`cargo test -p lab-06 --features exercises`) then grade the student's version.

#[cfg(feature = "exercises")]
mod starter;
#[cfg(feature = "exercises")]
pub use starter::*;

#[cfg(not(feature = "exercises"))]
mod solutions;
#[cfg(not(feature = "exercises"))]
pub use solutions::*;

use labs_core::device_id::DevicePtr;
use labs_core::{Device, Error, Event, Result, Stream};

// ANCHOR: stream_pool
/// Exercise 4: a pool of blocks of one size with the caching allocator's stream rule.
/// A block belongs to the stream it was allocated on, and once freed it is reusable at
/// once by later work on that stream. A block that other streams used
/// ([`record_stream`](Self::record_stream)) must not be handed out again before the
/// work those streams had queued when it was freed has completed; and neither `free`
/// nor `malloc` may block the host to learn when that is.
pub struct StreamPool {
    device: Device,
    bytes: usize,
    /// Every block taken from the driver, returned to it on drop.
    raw: Vec<DevicePtr>,
    /// Blocks handed out.
    live: Vec<Live>,
    /// Blocks ready for reuse, each with the stream it belongs to.
    free: Vec<(DevicePtr, Stream)>,
    /// Freed blocks that wait for other streams' work.
    pending: Vec<Pending>,
}

// The starter leaves these to the student's code: unused until it is written.
#[cfg_attr(feature = "exercises", allow(dead_code))]
struct Live {
    ptr: DevicePtr,
    /// The stream it was allocated on.
    owner: Stream,
    /// The other streams that use it.
    used_by: Vec<Stream>,
}

#[cfg_attr(feature = "exercises", allow(dead_code))]
struct Pending {
    ptr: DevicePtr,
    owner: Stream,
    events: Vec<Event>,
}

impl StreamPool {
    pub fn new(device: &Device, bytes: usize) -> StreamPool {
        StreamPool {
            device: device.clone(),
            bytes,
            raw: Vec::new(),
            live: Vec::new(),
            free: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// A block for work on `stream`: a free block of that stream, else a new one from
    /// the driver.
    pub fn malloc(&mut self, stream: &Stream) -> Result<DevicePtr> {
        self.process_events()?;
        let ptr = match (self.free.iter()).position(|(_, s)| s.handle() == stream.handle()) {
            Some(i) => self.free.swap_remove(i).0,
            None => {
                let ptr = self.device.backend().raw_alloc(self.bytes)?;
                self.raw.push(ptr);
                ptr
            }
        };
        self.live.push(Live {
            ptr,
            owner: stream.clone(),
            used_by: Vec::new(),
        });
        Ok(ptr)
    }
    // ANCHOR_END: stream_pool

    /// How many blocks the pool has taken from the driver.
    pub fn blocks(&self) -> usize {
        self.raw.len()
    }

    /// How many freed blocks are waiting for other streams.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The live block at `ptr`, or an error naming it.
    #[cfg_attr(feature = "exercises", allow(dead_code))]
    fn live_index(&self, ptr: DevicePtr) -> Result<usize> {
        (self.live.iter().position(|l| l.ptr == ptr)).ok_or_else(|| {
            Error::InvalidArgument(format!("{ptr:#x} is not a live block of this pool"))
        })
    }
}

impl Drop for StreamPool {
    fn drop(&mut self) {
        // `raw_free` synchronises the device first: no stream still uses a block.
        for &ptr in &self.raw {
            if let Err(e) = self.device.backend().raw_free(ptr) {
                eprintln!("warning: freeing {ptr:#x} on {}: {e}", self.device);
            }
        }
    }
}
