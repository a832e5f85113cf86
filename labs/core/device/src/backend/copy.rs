//! Copies and fills: between host and device, and within a device.

use super::Stream;
use crate::device_id::DevicePtr;
use crate::dtype::FillPattern;
use crate::error::Result;

pub trait Copies {
    /// Copies host memory to the device, ordered after the stream's earlier work; returns
    /// when the copy is done (pageable memory: the host buffer may be reused at once).
    fn copy_htod(&self, dst: DevicePtr, src: &[u8], stream: &Stream) -> Result<()>;
    /// Copies device memory to the host after the stream's earlier work; returns when done.
    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: &Stream) -> Result<()>;
    /// Enqueues a device-to-device copy; asynchronous.
    fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Enqueues a fill of `count` elements of the pattern's width; asynchronous.
    fn fill(
        &self,
        dst: DevicePtr,
        pattern: FillPattern,
        count: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Enqueues a copy of `bytes` from host memory at `src` (`cuMemcpyHtoDAsync`). From
    /// page-locked memory it returns at once; from pageable memory the driver stages it
    /// and the call returns only once the source has been read.
    ///
    /// # Safety
    /// `src..src+bytes` must stay valid and unmodified until the stream has passed the
    /// copy (record an event after it and wait for that).
    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()>;
    /// Enqueues a copy to host memory at `dst` (`cuMemcpyDtoHAsync`); see `copy_htod_async`.
    ///
    /// # Safety
    /// `dst..dst+bytes` must stay valid, and unread, until the stream has passed the copy.
    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()>;
}
