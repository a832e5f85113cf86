//! How many devices of each kind there are (`torch.cuda.device_count()`): GPUs as the
//! driver reports them, simulated GPUs as `LABS_SIM_DEVICES` (or
//! [`set_sim_device_count`]) says. An index at or beyond the count is refused when the
//! device is opened, with the same message on every backend.

use std::sync::Mutex;

use super::select::ENV_SIM_DEVICES;
use crate::device_id::DeviceKind;
use crate::error::{Error, Result};

/// The most simulated GPUs (and dry-run devices) a process may have configured: each
/// costs host memory and, once used, a thread per stream.
pub const MAX_SIM_DEVICES: usize = 1024;

/// The count [`set_sim_device_count`] set, or the environment's once read.
static SIM_COUNT: Mutex<Option<usize>> = Mutex::new(None);

fn parse_sim_count(text: &str) -> Result<usize> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_SIM_DEVICES).contains(&n) => Ok(n),
        _ => Err(Error::InvalidArgument(format!(
            "{ENV_SIM_DEVICES}={}: expected a number of simulated GPUs, 1 to {MAX_SIM_DEVICES}",
            crate::format::quote(text)
        ))),
    }
}

/// The number of simulated GPUs (and of dry-run devices): `LABS_SIM_DEVICES`, read
/// once, unless [`set_sim_device_count`] said otherwise.
pub(crate) fn sim_device_count() -> Result<usize> {
    let mut count = SIM_COUNT.lock().unwrap();
    if let Some(n) = *count {
        return Ok(n);
    }
    let n = match std::env::var(ENV_SIM_DEVICES) {
        Ok(v) if !v.trim().is_empty() => parse_sim_count(&v)?,
        _ => 1,
    };
    *count = Some(n);
    Ok(n)
}

/// Sets how many simulated GPUs exist from now on, in place of `LABS_SIM_DEVICES`
/// (a program, or a test, that needs several whatever the environment says). Devices
/// already opened stay usable; a smaller count only refuses indices not yet opened.
pub fn set_sim_device_count(count: usize) -> Result<()> {
    if count == 0 {
        return Err(Error::InvalidArgument(
            "set_sim_device_count(0): there is always at least one simulated GPU".into(),
        ));
    }
    if count > MAX_SIM_DEVICES {
        return Err(Error::InvalidArgument(format!(
            "set_sim_device_count({count}): at most {MAX_SIM_DEVICES} simulated GPUs"
        )));
    }
    *SIM_COUNT.lock().unwrap() = Some(count);
    Ok(())
}

// ANCHOR: device_count
/// How many devices of `kind` exist (`torch.cuda.device_count()`): the GPUs the driver
/// sees (0 without a usable driver, as in PyTorch), the simulated GPUs configured (dry
/// runs have as many), and one host. Simulated GPUs made by `Device::new_sim` are
/// extras beyond this count and not included.
pub fn device_count(kind: DeviceKind) -> Result<usize> {
    match kind {
        DeviceKind::Cpu => Ok(1),
        DeviceKind::Cuda => match crate::cuda::device_count() {
            Ok(n) => Ok(n),
            Err(Error::NoDriver(_)) => Ok(0),
            Err(e) => Err(e),
        },
        DeviceKind::Sim | DeviceKind::Dry => sim_device_count(),
    }
}
// ANCHOR_END: device_count

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_strictly() {
        assert_eq!(parse_sim_count(" 4 ").unwrap(), 4);
        assert_eq!(parse_sim_count("1024").unwrap(), MAX_SIM_DEVICES);
        for bad in ["0", "-1", "two", "", "1025", "100000"] {
            let err = parse_sim_count(bad).unwrap_err().to_string();
            assert!(
                err.contains(ENV_SIM_DEVICES) && err.contains("1 to 1024"),
                "{err}"
            );
        }
        assert!(set_sim_device_count(0).is_err());
    }
}
