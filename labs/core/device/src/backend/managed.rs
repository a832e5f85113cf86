//! Managed (unified) memory: one address valid on host and device, pages migrating on
//! demand or when asked.

use super::{Memory, Stream};
use crate::device_id::DevicePtr;
use crate::error::Result;

/// Where managed memory should live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemLocation {
    Device,
    Host,
}

/// The `cuMemAdvise` hints the labs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedAdvice {
    /// Read-only copies may live on every processor that reads.
    ReadMostly,
    /// Pages stay at this location and others map them rather than migrating them.
    PreferredLocation(MemLocation),
}

pub trait ManagedMemory: Memory {
    /// Managed memory (`cuMemAllocManaged`), refused with an out-of-memory error when
    /// larger than the device's free memory: oversubscribing managed memory can stall
    /// the GPU for minutes.
    fn managed_alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees managed memory: `cuMemFree`, as for any device allocation.
    fn managed_free(&self, ptr: DevicePtr) -> Result<()> {
        self.raw_free(ptr)
    }
    /// Enqueues a migration of managed memory (`cuMemPrefetchAsync`).
    fn managed_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        to: MemLocation,
        stream: &Stream,
    ) -> Result<()>;
    /// A hint about how managed memory will be used (`cuMemAdvise`).
    fn managed_advise(&self, ptr: DevicePtr, bytes: usize, advice: ManagedAdvice) -> Result<()>;
}
