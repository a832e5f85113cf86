//! Names of devices as users write them: `cpu`, `cuda`, `cuda:1`, `sim`, `sim:0`, `dry`, and
//! the address types of their memory. A bottom layer: errors, backends and the registry
//! all name devices.

use std::fmt;
use std::str::FromStr;

// ANCHOR: device_id
/// Which device a tensor or buffer lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceId {
    /// Host memory.
    Cpu,
    /// A real NVIDIA GPU, by ordinal.
    Cuda(usize),
    /// A simulated GPU in host memory, by ordinal.
    Sim(usize),
    /// A dry run of the simulated GPU: its allocator and every allocation, but no
    /// kernels, no copies and no values (what fits, known before running).
    Dry(usize),
}
// ANCHOR_END: device_id

impl DeviceId {
    pub fn is_accelerator(self) -> bool {
        !matches!(self, DeviceId::Cpu)
    }

    /// The kind of device, without its index.
    pub fn kind(self) -> DeviceKind {
        match self {
            DeviceId::Cpu => DeviceKind::Cpu,
            DeviceId::Cuda(_) => DeviceKind::Cuda,
            DeviceId::Sim(_) => DeviceKind::Sim,
            DeviceId::Dry(_) => DeviceKind::Dry,
        }
    }

    /// The device's index among those of its kind (`torch.device.index`); the host
    /// has none.
    pub fn index(self) -> Option<usize> {
        match self {
            DeviceId::Cpu => None,
            DeviceId::Cuda(i) | DeviceId::Sim(i) | DeviceId::Dry(i) => Some(i),
        }
    }
}

/// A kind of device (`torch.device.type`): what `device_count` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Sim,
    Dry,
}

impl DeviceKind {
    /// The device of this kind with index `index` (the host has one, whatever the index).
    pub fn device(self, index: usize) -> DeviceId {
        match self {
            DeviceKind::Cpu => DeviceId::Cpu,
            DeviceKind::Cuda => DeviceId::Cuda(index),
            DeviceKind::Sim => DeviceId::Sim(index),
            DeviceKind::Dry => DeviceId::Dry(index),
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Sim => "sim",
            DeviceKind::Dry => "dry",
        })
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Cpu => write!(f, "cpu"),
            DeviceId::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceId::Sim(n) => write!(f, "sim:{n}"),
            DeviceId::Dry(n) => write!(f, "dry:{n}"),
        }
    }
}

// ANCHOR: parse_device_id
impl FromStr for DeviceId {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (kind, index) = match s.split_once(':') {
            Some((k, i)) => {
                let n = i.parse::<usize>().map_err(|_| {
                    ParseDeviceError(format!("invalid device `{s}`: `{i}` is not a device index"))
                })?;
                (k, n)
            }
            None => (s, 0),
        };
        match kind.to_ascii_lowercase().as_str() {
            "cpu" if !s.contains(':') => Ok(DeviceId::Cpu),
            "cuda" | "gpu" => Ok(DeviceId::Cuda(index)),
            "sim" => Ok(DeviceId::Sim(index)),
            "dry" => Ok(DeviceId::Dry(index)),
            _ => Err(ParseDeviceError(format!(
                "invalid device `{s}`: expected cpu, cuda, cuda:N, sim, sim:N, dry or dry:N"
            ))),
        }
    }
}
// ANCHOR_END: parse_device_id

/// A device name that is not one: the message says what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseDeviceError(pub String);

impl fmt::Display for ParseDeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseDeviceError {}

/// A device address. On `cuda` it is a real `CUdeviceptr`; on `sim` and `cpu` it is an
/// address in the backend's own simulated address space.
pub type DevicePtr = u64;

/// A host address of page-locked memory from `HostMemory::host_alloc`.
pub type HostPtr = *mut u8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for text in [
            "cpu", "cuda:0", "cuda:3", "sim:0", "sim:2", "dry:0", "dry:1",
        ] {
            assert_eq!(text.parse::<DeviceId>().unwrap().to_string(), text);
        }
        assert_eq!("cuda".parse::<DeviceId>().unwrap(), DeviceId::Cuda(0));
        assert_eq!("sim".parse::<DeviceId>().unwrap(), DeviceId::Sim(0));
        assert_eq!("dry".parse::<DeviceId>().unwrap(), DeviceId::Dry(0));
    }

    #[test]
    fn rejects_garbage() {
        for text in ["tpu", "cuda:x", "cpu:1", "", "cuda:-1", "dry:x"] {
            let err = text.parse::<DeviceId>().unwrap_err().to_string();
            assert!(err.contains("invalid device"), "{text}: {err}");
        }
    }
}
