//! Page-locked host memory on the simulated GPU. Nothing is really locked: what matters
//! is that the simulator knows which host ranges are "pinned", because that decides
//! whether an asynchronous copy really is asynchronous, exactly as in the CUDA driver.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Mutex;

use super::memory::SimMemory;
use crate::backend::{DeviceId, DevicePtr, HostPtr};
use crate::error::{Error, Result};

/// Pinned allocations are page aligned, like `cuMemHostAlloc`'s.
const PAGE: usize = 4096;
/// The driver stages pageable copies through a small pinned buffer; the simulator
/// does the same, so pageable copies cost two memory copies instead of one.
pub(crate) const STAGING_BYTES: usize = 2 << 20;

struct Record {
    bytes: usize,
    /// The simulated device address of mapped memory; the host bytes then belong to
    /// the simulated allocation.
    mapped: Option<DevicePtr>,
    /// A dry run's allocation: an address and no bytes (see [`PinnedHost::alloc`]).
    dry: bool,
}

#[derive(Default)]
pub(crate) struct PinnedHost {
    records: Mutex<BTreeMap<usize, Record>>,
    /// The next address a dry run's allocation gets, in pages from [`DRY_FIRST`].
    next_dry: Mutex<usize>,
}

/// A dry run's first pinned address: a page above null, never read or written.
const DRY_FIRST: usize = PAGE;

fn layout(bytes: usize) -> Layout {
    Layout::from_size_align(bytes.max(1), PAGE).expect("a valid layout")
}

impl PinnedHost {
    /// `bytes` of pinned memory (`mapped`: also visible to the device). A dry run
    /// (`dry`) moves no data, so its pinned memory has an address and no bytes: an
    /// offload of tens of GiB costs the host nothing, in a browser's 4 GiB too. Its
    /// addresses are a page apart, so only a copy from a buffer's first page is one
    /// the simulator knows as pinned; no dry copy starts further in.
    pub fn alloc(
        &self,
        memory: &SimMemory,
        bytes: usize,
        mapped: bool,
        dry: bool,
    ) -> Result<HostPtr> {
        if dry && !mapped {
            let ptr = {
                let mut next = self.next_dry.lock().unwrap();
                let ptr = next
                    .checked_mul(PAGE)
                    .and_then(|p| p.checked_add(DRY_FIRST))
                    .filter(|p| p.checked_add(PAGE).is_some())
                    .ok_or_else(|| {
                        Error::driver("cuMemHostAlloc", "a dry run ran out of host addresses")
                    })?;
                *next += 1;
                ptr
            };
            let record = Record {
                bytes,
                mapped: None,
                dry: true,
            };
            self.records.lock().unwrap().insert(ptr, record);
            return Ok(ptr as HostPtr);
        }
        let (ptr, device) = if mapped {
            let (d, h) = memory.alloc_mapped(bytes)?;
            (h, Some(d))
        } else {
            // SAFETY: a non-zero size with a valid alignment.
            let p = unsafe { std::alloc::alloc(layout(bytes)) };
            if p.is_null() {
                return Err(Error::driver(
                    "cuMemHostAlloc",
                    format!("out of host memory for {bytes} bytes"),
                ));
            }
            // Pinning faults in and locks every page up front; touching them all is
            // the part of that cost the simulator can reproduce.
            // SAFETY: `p` is valid for `bytes` bytes.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
            (p, None)
        };
        self.records.lock().unwrap().insert(
            ptr as usize,
            Record {
                bytes,
                mapped: device,
                dry: false,
            },
        );
        Ok(ptr)
    }

    pub fn free(&self, memory: &SimMemory, ptr: HostPtr) -> Result<()> {
        let record = self.records.lock().unwrap().remove(&(ptr as usize));
        match record {
            Some(Record {
                mapped: Some(d), ..
            }) => memory.free_mapped(d),
            Some(Record { dry: true, .. }) => Ok(()),
            Some(Record { bytes, .. }) => {
                // SAFETY: allocated above with the same layout, freed once.
                unsafe { std::alloc::dealloc(ptr, layout(bytes)) };
                Ok(())
            }
            None => Err(Error::InvalidArgument(format!(
                "cuMemFreeHost of {ptr:p}: not page-locked memory from host_alloc"
            ))),
        }
    }

    /// The record holding `ptr..ptr+bytes`, as (base, record bytes, mapped address).
    fn find(&self, ptr: usize, bytes: usize) -> Option<(usize, usize, Option<DevicePtr>)> {
        let records = self.records.lock().unwrap();
        let (&base, r) = records.range(..=ptr).next_back()?;
        let inside = ptr + bytes <= base + r.bytes.max(1) && (!r.dry || ptr - base < PAGE);
        inside.then_some((base, r.bytes, r.mapped))
    }

    /// Whether the whole range lies inside one pinned allocation.
    pub fn contains(&self, ptr: usize, bytes: usize) -> bool {
        self.find(ptr, bytes).is_some()
    }

    pub fn device_ptr(&self, device: DeviceId, ptr: HostPtr) -> Result<DevicePtr> {
        match self.find(ptr as usize, 0) {
            Some((base, _, Some(d))) => Ok(d + (ptr as usize - base) as u64),
            Some(_) => Err(Error::InvalidArgument(format!(
                "{ptr:p} is page-locked but was not allocated as mapped memory on {device}"
            ))),
            None => Err(Error::InvalidArgument(format!(
                "{ptr:p} is not page-locked memory of {device}"
            ))),
        }
    }

    /// Whether `d` is the device address of a mapped host allocation.
    pub fn is_mapped_device_ptr(&self, d: DevicePtr) -> bool {
        self.records
            .lock()
            .unwrap()
            .values()
            .any(|r| r.mapped == Some(d))
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        for (&ptr, r) in self.records.get_mut().unwrap().iter() {
            if r.mapped.is_none() && !r.dry {
                // SAFETY: still allocated; the device that owns it is going away.
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout(r.bytes)) };
            }
        }
    }
}

/// Copies through a staging buffer, as the driver does for pageable memory.
///
/// # Safety
/// Both ranges must be valid for `bytes` bytes and not overlap.
pub(crate) unsafe fn staged_copy(src: *const u8, dst: *mut u8, bytes: usize) {
    let mut stage = Vec::new();
    if stage.try_reserve_exact(STAGING_BYTES.min(bytes)).is_err() {
        // A host out of memory: the copy is the same without its staging.
        std::ptr::copy_nonoverlapping(src, dst, bytes);
        return;
    }
    stage.resize(STAGING_BYTES.min(bytes), 0u8);
    let mut done = 0;
    while done < bytes {
        let n = stage.len().min(bytes - done);
        std::ptr::copy_nonoverlapping(src.add(done), stage.as_mut_ptr(), n);
        std::ptr::copy_nonoverlapping(stage.as_ptr(), dst.add(done), n);
        done += n;
    }
}
