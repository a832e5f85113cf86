//! Lab 6: streams and events. Work on one stream runs in order, work on two may
//! overlap; events mark points in a stream that the host or another stream can wait
//! for, and time the work between two of them. Each module is one experiment of
//! chapter 6.

pub mod events;
pub mod exercises;
pub mod hazard;
pub mod overlap;
pub mod priorities;
pub mod timing;

use std::time::Duration;

use labs_core::{DType, Device, Result, Stream, Tensor};

/// Elements of the small busy kernels of this lab: a few dozen thread blocks, so that
/// one kernel leaves most of a GPU's multiprocessors free for a second stream.
pub const SMALL: usize = 8192;

/// A small tensor and a `spin_` iteration count that keeps it busy for `target`.
pub fn busy_work(device: &Device, stream: &Stream, target: Duration) -> Result<(Tensor, u32)> {
    let x = Tensor::zeros(&[SMALL], DType::F32, device)?;
    let iterations = labs_core::timing::calibrate_spin(&x, stream, target)?;
    Ok((x, iterations))
}

pub(crate) fn event_duration(a: &labs_core::Event, b: &labs_core::Event) -> Result<Duration> {
    Ok(Duration::from_secs_f64(a.elapsed_ms(b)? as f64 / 1e3))
}
