//! Lab 4: several GPUs. Each device has its own memory and its own caching allocator;
//! an operation takes tensors of one device; data moves between devices by copies,
//! directly where the GPUs reach each other's memory (peer access), else through pinned
//! host memory. Each module is one experiment of chapter 4.

pub mod bandwidth;
pub mod caches;
pub mod collectives;
pub mod data_parallel;
pub mod devices;
pub mod exercises;
pub mod mismatch;
pub mod outside;
pub mod replicate;

use labs_core::device::{device_count, set_sim_device_count, DeviceKind, ENV_SIM_DEVICES};
use labs_core::{Device, Error, Result};

/// Bytes as MiB with two decimals, the unit of every memory table of the lab.
pub fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 20) as f64)
}

/// How many simulated GPUs the lab uses when `LABS_SIM_DEVICES` does not say: two, the
/// fewest that show anything about several devices.
pub const DEFAULT_SIM_DEVICES: usize = 2;

/// Makes two simulated GPUs exist unless `LABS_SIM_DEVICES` says how many; before the
/// first device is opened, so that `--device sim:1` is one of them.
pub fn default_sim_devices() -> Result<()> {
    if std::env::var(ENV_SIM_DEVICES).map_or(true, |v| v.trim().is_empty()) {
        set_sim_device_count(DEFAULT_SIM_DEVICES)?;
    }
    Ok(())
}

// ANCHOR: every_device
/// Every device of `first`'s kind: all the GPUs for `cuda`, the simulated GPUs
/// (`LABS_SIM_DEVICES`, two when unset) for `sim` and `dry`. The host is one device,
/// with nothing to show here.
pub fn every_device(first: &Device) -> Result<Vec<Device>> {
    let kind = first.id().kind();
    if kind == DeviceKind::Cpu {
        return Err(Error::InvalidArgument(
            "lab 4 needs GPUs (or simulated ones): the host is a single device; pass \
             --device cuda or --device sim"
                .into(),
        ));
    }
    if matches!(kind, DeviceKind::Sim | DeviceKind::Dry) {
        default_sim_devices()?;
    }
    (0..device_count(kind)?)
        .map(|i| Device::get(kind.device(i)))
        .collect()
}
// ANCHOR_END: every_device

/// The note the lab prints where its times come from the simulator.
pub fn simulated_note(device: &Device) -> Option<&'static str> {
    (!device.is_cuda()).then_some(
        "(simulated GPUs: their memory is host memory and their copies are memcpy, so \
         the memory figures are the allocator's own and the times say nothing about a GPU)",
    )
}
