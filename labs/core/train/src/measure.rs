//! What a run measures, with PyTorch's meanings: the peaks since the reset
//! (`max_memory_allocated`, `max_memory_reserved`), the allocated peak's split by
//! category at the moment it was reached, out-of-memory errors, and step times taken
//! with the device synchronised before and after each step.

use std::collections::BTreeMap;
use std::time::Duration;

use labs_core::clock::Instant;

use anyhow::Result;
use labs_core::Device;

/// The allocator's figures over a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Bytes per category (PyTorch's memory profiler's names) at the allocated peak.
    pub by_category: BTreeMap<String, u64>,
    /// Out-of-memory errors since the reset.
    pub num_ooms: u64,
}

/// Starts the measurement: resets the peaks (`reset_peak_memory_stats`).
pub fn start(device: &Device) -> Result<()> {
    device.allocator()?.reset_peak_memory_stats();
    Ok(())
}

/// The figures since [`start`]; `ooms_before`, the out-of-memory count before the run.
pub fn read(device: &Device, ooms_before: u64) -> Result<Memory> {
    let allocator = device.allocator()?;
    let stats = allocator.stats();
    let by_category = allocator
        .memory_by_category_at_peak()
        .into_iter()
        .map(|(c, bytes)| (c.name().to_string(), bytes))
        .collect();
    Ok(Memory {
        peak_allocated: stats.allocated.peak,
        peak_reserved: stats.reserved.peak,
        by_category,
        num_ooms: stats.num_ooms - ooms_before,
    })
}

/// Runs `f` between two synchronisations of the device and returns its result and
/// the time between them.
pub fn timed<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<(T, Duration)> {
    device.synchronize()?;
    let start = Instant::now();
    let out = f()?;
    device.synchronize()?;
    Ok((out, start.elapsed()))
}

/// The median in milliseconds (of an even count, the mean of the middle two, as
/// Python's `statistics.median`), `None` for no times.
pub fn median_ms(times: &[Duration]) -> Option<f64> {
    median(times.iter().map(|t| t.as_secs_f64() * 1e3).collect())
}

/// The median of `values` (as [`median_ms`]), `None` for none.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}
