//! Which device a lab runs on: `--device`, else `LABS_DEVICE`, else the first GPU if
//! there is one, else the simulator (with a one-line notice saying so).

use super::{Device, DeviceId};
use crate::error::{Error, Result};
use crate::format::{bytes, parse_bytes};

// ANCHOR: env_vars
/// Environment variable naming the device (`cuda`, `cuda:1`, `sim`, `dry`, `cpu`).
pub const ENV_DEVICE: &str = "LABS_DEVICE";
/// Environment variable setting the simulated GPU's capacity (`16GiB`, `80GiB`, ...),
/// and the dry-run device's.
pub const ENV_SIM_CAPACITY: &str = "LABS_SIM_CAPACITY";
/// The simulated GPU's capacity unless `LABS_SIM_CAPACITY` says otherwise.
pub const DEFAULT_SIM_CAPACITY: u64 = 16 << 30;
/// Environment variable setting how many simulated GPUs exist (`sim:0` to `sim:N-1`,
/// and as many dry-run devices); 1 when unset.
pub const ENV_SIM_DEVICES: &str = "LABS_SIM_DEVICES";
/// Environment variable that, set to `0`, takes the simulated GPUs' peer access away,
/// so that copies between them are staged through host memory as between GPUs without it.
pub use crate::sim::ENV_SIM_PEER;
// ANCHOR_END: env_vars

pub(crate) fn sim_capacity_from_env() -> Result<u64> {
    match std::env::var(ENV_SIM_CAPACITY) {
        Ok(v) => {
            parse_bytes(&v).map_err(|e| Error::InvalidArgument(format!("{ENV_SIM_CAPACITY}: {e}")))
        }
        Err(_) => Ok(DEFAULT_SIM_CAPACITY),
    }
}

/// The device chosen, and a notice for the user when the choice was a fallback.
#[derive(Debug)]
pub struct Selection {
    pub device: Device,
    pub notice: Option<String>,
}

// ANCHOR: select_device
/// Chooses the device. `flag` is the value of a `--device` option, if given.
pub fn select_device(flag: Option<&str>) -> Result<Selection> {
    let explicit = match flag {
        Some(f) => Some(f.to_string()),
        None => std::env::var(ENV_DEVICE)
            .ok()
            .filter(|v| !v.trim().is_empty()),
    };
    if let Some(text) = explicit {
        let mut id: DeviceId = text.parse()?;
        // A kind without an index means the thread's current device of that kind, as
        // `torch.device("cuda")` does.
        if !text.contains(':') {
            id = id.kind().device(super::current_device());
        }
        return Ok(Selection {
            device: Device::get(id)?,
            notice: None,
        });
    }
    match crate::cuda::device_count() {
        Ok(n) if n > 0 => Ok(Selection {
            device: Device::get(DeviceId::Cuda(super::current_device()))?,
            notice: None,
        }),
        other => {
            let why = match other {
                Ok(_) => "the NVIDIA driver reports no GPU".to_string(),
                Err(e) => e.to_string(),
            };
            let device = Device::get(DeviceId::Sim(super::current_device()))?;
            let capacity = device.mem_info()?.total;
            Ok(Selection {
                notice: Some(format!(
                    "note: no NVIDIA GPU ({why}); running on the simulated GPU {} ({}). \
                     Pass --device cuda to insist on a GPU.",
                    device.id(),
                    bytes(capacity)
                )),
                device,
            })
        }
    }
}
// ANCHOR_END: select_device
