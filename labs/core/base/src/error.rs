//! One error type for every device operation, so that the GPU and the simulator fail
//! the same way and callers can match on what went wrong.

use crate::device_id::{DeviceId, DeviceKind, ParseDeviceError};
use crate::dtype::DType;
use crate::format::bytes;
use crate::oom_report::{self, OomReport};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    // ANCHOR: out_of_memory
    /// The device could not satisfy an allocation. From the caching allocator, the
    /// error carries its [`OomReport`] and the message follows PyTorch's
    /// `torch.cuda.OutOfMemoryError`, then says more; from a backend alone (a driver
    /// call refused), it gives the figures the driver knows.
    #[error("{}", OomMessage { device, requested: *requested, free: *free, total: *total, report })]
    OutOfMemory {
        device: DeviceId,
        requested: u64,
        /// Bytes free on the device (the driver's figure).
        free: u64,
        /// The device's memory.
        total: u64,
        report: Option<Box<OomReport>>,
    },

    // ANCHOR_END: out_of_memory
    /// The CUDA driver library could not be loaded or initialised.
    #[error("no usable NVIDIA driver: {0}")]
    NoDriver(String),

    /// A device index beyond the number of devices of its kind, worded like PyTorch's
    /// `CUDA error: invalid device ordinal`, with the count; the same on every backend.
    #[error("{}", NoSuchDeviceMessage { requested: *requested, available: *available })]
    NoSuchDevice {
        requested: DeviceId,
        available: usize,
    },

    /// A driver call failed.
    #[error("{call} failed: {message}")]
    Driver { call: &'static str, message: String },

    /// NVRTC rejected a kernel source.
    #[error("compiling kernel module `{module}` failed:\n{log}")]
    Compile { module: &'static str, log: String },

    // ANCHOR: device_mismatch
    /// Two tensors of one operation live on different devices; PyTorch's words.
    #[error(
        "Expected all tensors to be on the same device, but found at least two devices, \
         {a} and {b}!"
    )]
    DeviceMismatch { a: DeviceId, b: DeviceId },

    // ANCHOR_END: device_mismatch
    /// An operation got a tensor of a dtype it does not support.
    #[error("{op} does not support dtype {found} (supported: {supported})")]
    DType {
        op: &'static str,
        found: DType,
        supported: &'static str,
    },

    /// Two operands of one operation with different dtypes, where the operation does
    /// not promote (matmul); elementwise ops promote instead.
    #[error("{op}: expected both operands to have the same dtype, but found {a} and {b}")]
    DTypeMismatch {
        op: &'static str,
        a: DType,
        b: DType,
    },

    /// Shapes that do not fit together.
    #[error("{op}: shape mismatch, {a:?} vs {b:?}")]
    Shape {
        op: &'static str,
        a: Vec<usize>,
        b: Vec<usize>,
    },

    /// A stream or event of one device handed to another; a real GPU would fail later
    /// and less clearly (an invalid handle, or work ordered on the wrong device).
    #[error("{what} of {of} used on {used_on}")]
    WrongDevice {
        what: &'static str,
        of: DeviceId,
        used_on: DeviceId,
    },

    /// A malformed device string, size or option.
    #[error("{0}")]
    InvalidArgument(String),

    /// A collective, its rendezvous, its launcher or its library failed: a peer that
    /// left or never came, a timeout, ranks that disagree about a collective, NCCL
    /// missing or reporting an error.
    #[error("{0}")]
    Distributed(String),

    /// The simulator caught something the GPU would report as an illegal address.
    /// A call a stream's capture forbids (CUDA's `cudaErrorStreamCaptureUnsupported`,
    /// `...Isolation`, `...Invalidated`): a synchronisation, a read of results by the
    /// host, memory given back to the driver, a dependency on work outside the capture.
    /// The capture is invalidated: ending it reports this error again.
    #[error("{call} while {stream} is being captured: {detail}")]
    Capture {
        call: &'static str,
        stream: String,
        detail: String,
    },
    #[error("illegal memory access on {device}: {detail}")]
    IllegalAddress { device: DeviceId, detail: String },
}

impl From<ParseDeviceError> for Error {
    fn from(e: ParseDeviceError) -> Self {
        Error::InvalidArgument(e.0)
    }
}

impl Error {
    pub fn driver(call: &'static str, e: impl std::fmt::Display) -> Self {
        Error::Driver {
            call,
            message: e.to_string(),
        }
    }

    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
    }
}

/// Formats [`Error::NoSuchDevice`]: which device, how many of its kind there are, and,
/// for simulated GPUs, how to have more.
struct NoSuchDeviceMessage {
    requested: DeviceId,
    available: usize,
}

impl std::fmt::Display for NoSuchDeviceMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = self.requested.kind();
        write!(
            f,
            "invalid device ordinal: {} requested, but there {} {} {kind} device{}",
            self.requested,
            if self.available == 1 { "is" } else { "are" },
            self.available,
            if self.available == 1 { "" } else { "s" },
        )?;
        if matches!(kind, DeviceKind::Sim | DeviceKind::Dry) {
            write!(f, " (LABS_SIM_DEVICES sets how many)")?;
        }
        Ok(())
    }
}

/// Formats [`Error::OutOfMemory`]: the report's message when there is one.
struct OomMessage<'a> {
    device: &'a DeviceId,
    requested: u64,
    free: u64,
    total: u64,
    report: &'a Option<Box<OomReport>>,
}

impl std::fmt::Display for OomMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.report {
            Some(r) => {
                oom_report::message(f, self.device, self.requested, self.free, self.total, r)
            }
            None => write!(
                f,
                "out of memory on {}: tried to allocate {} ({} total capacity, {} free)",
                self.device,
                bytes(self.requested),
                bytes(self.total),
                bytes(self.free)
            ),
        }
    }
}
