//! Running kernels.

use super::Stream;
use crate::error::Result;
use crate::kernels::Kernel;

pub trait Kernels {
    /// Enqueues a kernel; asynchronous.
    fn launch(&self, kernel: &Kernel, stream: &Stream) -> Result<()>;
}
