//! Running kernels.

use super::{DevicePtr, Stream};
use crate::error::Result;
use crate::kernels::Kernel;

pub trait Kernels {
    /// Enqueues a kernel; asynchronous.
    fn launch(&self, kernel: &Kernel, stream: &Stream) -> Result<()>;

    /// Gives the matrix-product library the workspace of `stream`: `bytes` at `ptr`,
    /// device memory the caller keeps for as long as the backend lives. The device
    /// lends it from its caching allocator before the stream's first product, so that
    /// it is counted as PyTorch counts its cuBLAS workspaces. A backend whose products
    /// need no workspace ignores it.
    fn lend_gemm_workspace(&self, _stream: &Stream, _ptr: DevicePtr, _bytes: usize) -> Result<()> {
        Ok(())
    }
}

/// The workspace a matrix-product library is given per stream on a GPU of compute
/// capability `(major, minor)`, PyTorch's default (`CUBLAS_WORKSPACE_CONFIG` unset):
/// `:4096:8`, 32 MiB, from Hopper on; `:4096:2:16:8`, 8 MiB and 128 KiB, before it.
/// None for a device with no such library (capability `(0, 0)`: the simulated GPU).
pub fn gemm_workspace_bytes(compute_capability: (u32, u32)) -> usize {
    match compute_capability.0 {
        0 => 0,
        major if major >= 9 => 8 * (4096 << 10),
        _ => 2 * (4096 << 10) + 8 * (16 << 10),
    }
}
