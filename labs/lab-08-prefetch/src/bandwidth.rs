//! Copy bandwidth between the host and the device, from pageable and from pinned
//! memory, at sizes from 64 KiB up: the first half of `bench`, measured by
//! `labs_core::bandwidth` (chapter 11's lab, `lab-11 bandwidth`, shows the same by size
//! and discusses it).

use labs_core::bandwidth::{default_max, sizes_up_to};
use labs_core::Device;

pub use labs_core::bandwidth::{gbps, measure, table, Bandwidth};

/// The sizes measured: 64 KiB to 1 GiB on a GPU, up to 64 MiB on the simulator, whose
/// copies are memcpy and gain nothing from larger sizes; up to 1 MiB with `--quick`.
pub fn sizes(device: &Device, quick: bool) -> Vec<usize> {
    sizes_up_to(default_max(device, quick))
}
