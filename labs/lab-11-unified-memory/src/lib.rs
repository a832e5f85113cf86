//! Lab 11: the kinds of memory a GPU reaches besides its own. Copies from pageable and
//! from pinned host memory, what pinning costs, a kernel reading mapped host memory,
//! and managed memory, whose pages move between host and device. Each module is one
//! experiment of chapter 11.

pub mod bandwidth;
pub mod exercises;
pub mod managed;
pub mod mapped;
pub mod pin_cost;

use std::time::Duration;

use labs_core::format::bytes;
use labs_core::Device;

/// Decimal GB/s: `bytes` moved in `d`.
pub use labs_core::bandwidth::gbps;

/// Serialises a duration as milliseconds (a float), the unit of the labs' JSON.
pub fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// Checks a kernel experiment's size before anything is allocated: whole float32
/// elements, and room on the device for `buffers` buffers of that size. The error
/// names `flag` and says what is missing.
pub fn check_kernel_size(
    device: &Device,
    flag: &str,
    size: usize,
    buffers: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(size > 0, "{flag}: the size must be more than 0 bytes");
    anyhow::ensure!(
        size.is_multiple_of(4),
        "{flag} {size}: not a whole number of float32 elements (a multiple of 4 bytes)"
    );
    let free = device.mem_info()?.free;
    let needed = (size as u64).saturating_mul(buffers as u64);
    anyhow::ensure!(
        needed <= free,
        "{flag} {}: the experiment needs {} of device memory ({buffers} buffers of that \
         size), and {device} has {} free",
        bytes(size as u64),
        bytes(needed),
        bytes(free)
    );
    Ok(())
}

/// The line printed under an experiment's table on a device that is not a GPU: what
/// the simulated GPU models of it, and what it does not.
pub fn sim_note(device: &Device, what: &str) -> Option<String> {
    (!device.is_cuda()).then(|| format!("(On {device}: {what})"))
}
