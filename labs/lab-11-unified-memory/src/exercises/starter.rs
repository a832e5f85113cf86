//! Starter code: replace each `todo!()`, then run
//! `cargo test -p lab-11 --features exercises`.

use std::time::Duration;

use labs_core::device_id::DevicePtr;
use labs_core::host::PinnedBuffer;
use labs_core::{Result, Stream};

// ANCHOR: exercise_staged
/// Exercise 1: copy pageable `src` to `dst` on the device the way the driver does,
/// through the pinned `staging` buffer, at most `staging.len()` bytes at a time: each
/// chunk copied by the host into `staging`, then sent with an asynchronous copy on
/// `stream`. Return once the whole copy is on the device (as `cudaMemcpy` from pageable
/// memory does), and an `InvalidArgument` error if `staging` is empty while `src` is not.
pub fn staged_copy(
    src: &[u8],
    dst: DevicePtr,
    staging: &mut PinnedBuffer,
    stream: &Stream,
) -> Result<()> {
    let _ = (src, dst, staging, stream);
    todo!("chunks through `staging`: when does the copy engine read the staging buffer you queued?")
}
// ANCHOR_END: exercise_staged

// ANCHOR: exercise_repay
/// Exercise 2: how many copies of a `bytes`-byte buffer it takes before pinning it has
/// paid for itself: the fewest copies whose time saved (each one at `pinned_gbps`
/// instead of `pageable_gbps`, decimal GB/s) adds up to at least `pin_cost`. `None`
/// when pinned copies save nothing.
pub fn copies_to_repay_pinning(
    bytes: usize,
    pin_cost: Duration,
    pageable_gbps: f64,
    pinned_gbps: f64,
) -> Option<u64> {
    let _ = (bytes, pin_cost, pageable_gbps, pinned_gbps);
    todo!("the time one copy saves, then how many of those make up the cost")
}
// ANCHOR_END: exercise_repay

// ANCHOR: exercise_mapped
/// Exercise 3: a kernel that runs `passes` times over a buffer of `buffer_bytes` in
/// host memory and reads `bytes_read` of it each time. Is reading it through mapped
/// memory (every read crosses the bus at `bus_gbps`) faster than copying the whole
/// buffer to the device first (at `bus_gbps`) and reading it there (at `device_gbps`)?
pub fn mapped_is_faster(
    buffer_bytes: usize,
    bytes_read: usize,
    passes: u32,
    bus_gbps: f64,
    device_gbps: f64,
) -> bool {
    let _ = (buffer_bytes, bytes_read, passes, bus_gbps, device_gbps);
    todo!("the time of each plan: which bytes cross the bus, and how many times?")
}
// ANCHOR_END: exercise_mapped
