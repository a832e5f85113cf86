//! The simulated GPU's memory: an address space of allocations, each backed by host
//! memory only where touched, chunk by chunk (`backing.rs`), so that a trace replay of
//! tens of gigabytes costs nothing while a kernel on real data works on real bytes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::backing::{Backing, Staged};
use crate::backend::{DeviceId, DevicePtr};
use crate::dtype::FillPattern;
use crate::error::{Error, Result};

/// Where simulated addresses start: far from zero, so that a null or small integer used
/// as a pointer is caught as an illegal address.
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
/// Allocations are aligned like `cuMemAlloc`'s, with a guard gap between them so that
/// an access running off one allocation is an error rather than a write into the next.
const ALIGNMENT: u64 = 512;
const GUARD: u64 = 512;
/// The mapping granularity of reserved ranges, as `cuMemGetAllocationGranularity`
/// reports it on current GPUs.
pub(crate) const PAGE: u64 = 2 << 20;

pub(crate) struct SimMemory {
    device: DeviceId,
    capacity: u64,
    state: RwLock<State>,
}

struct State {
    allocations: BTreeMap<u64, Arc<Allocation>>,
    used: u64,
    next_address: u64,
    /// Pages of reserved ranges that have memory behind them.
    mapped: std::collections::HashSet<u64>,
    /// Physical memory made by `create`: its size, and where it is mapped (if it is).
    physical: std::collections::HashMap<u64, (usize, Option<DevicePtr>)>,
    /// The physical memory mapped at each mapping's first address.
    mapped_at: std::collections::HashMap<DevicePtr, u64>,
    /// The devices that may read and write each mapped page (`cuMemSetAccess`), by
    /// page address; none until access is set, and gone with the mapping.
    access: std::collections::HashMap<u64, Vec<DeviceId>>,
    next_handle: u64,
}

impl State {
    /// The base of `bytes` of new address space aligned to `align` (its length rounded
    /// up to `align`), with `gap` unused bytes after it. Addresses are never reused, so
    /// that a stale pointer is caught; past the end of the 64-bit space (2^64 bytes
    /// handed out, or a length no space holds) `call` fails with a one-line error,
    /// and every range ends below 2^64, so that `base + size` never wraps.
    fn take_addresses(
        &mut self,
        device: DeviceId,
        call: &'static str,
        bytes: usize,
        align: u64,
        gap: u64,
    ) -> Result<u64> {
        let base = self.next_address.checked_next_multiple_of(align);
        let len = (bytes as u64).max(1).checked_next_multiple_of(align);
        let end = base
            .zip(len)
            .and_then(|(b, l)| b.checked_add(l)?.checked_add(gap));
        match (base, end) {
            (Some(base), Some(end)) => {
                self.next_address = end;
                Ok(base)
            }
            _ => Err(Error::Driver {
                call,
                message: format!(
                    "{bytes} bytes do not fit in what is left of {device}'s address space \
                     (from {:#x} to 2^64; the simulated GPU never reuses an address)",
                    self.next_address
                ),
            }),
        }
    }
}

// ANCHOR: sim_allocation
struct Allocation {
    base: u64,
    size: usize,
    /// A reserved virtual range: only its mapped pages may be touched, and only they
    /// count against the capacity.
    reserved: bool,
    /// Host bytes: chunks allocated as they are first touched.
    data: Mutex<Backing>,
}
// ANCHOR_END: sim_allocation

impl SimMemory {
    pub fn new(device: DeviceId, capacity: u64) -> Self {
        SimMemory {
            device,
            capacity,
            state: RwLock::new(State {
                allocations: BTreeMap::new(),
                used: 0,
                next_address: BASE_ADDRESS,
                mapped: std::collections::HashSet::new(),
                physical: Default::default(),
                mapped_at: Default::default(),
                access: Default::default(),
                next_handle: 1,
            }),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Hands out the following addresses from `base` (rounded down to the alignment)
    /// on: an address space elsewhere than the usual one, such as above 2^49.
    pub fn start_addresses_at(&self, base: u64) {
        self.state.write().unwrap().next_address = base - base % ALIGNMENT;
    }

    pub fn used(&self) -> u64 {
        self.state.read().unwrap().used
    }

    // ANCHOR: sim_alloc
    pub fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut s = self.state.write().unwrap();
        let free = self.capacity - s.used;
        if bytes as u64 > free {
            return Err(Error::OutOfMemory {
                device: self.device,
                requested: bytes as u64,
                free,
                total: self.capacity,
                report: None,
            });
        }
        let base = s.take_addresses(self.device, "cuMemAlloc", bytes, ALIGNMENT, GUARD)?;
        s.used += bytes as u64;
        s.allocations.insert(
            base,
            Arc::new(Allocation {
                base,
                size: bytes,
                reserved: false,
                data: Mutex::new(Backing::chunked()),
            }),
        );
        Ok(base)
    }
    // ANCHOR_END: sim_alloc

    /// Reserves a virtual range (`cuMemAddressReserve`): no capacity is used until
    /// pages are mapped. Host backing, if a kernel ever touches it, is zeroed memory
    /// allocated chunk by chunk, only for the pages touched.
    pub fn reserve(&self, bytes: usize) -> Result<DevicePtr> {
        let mut s = self.state.write().unwrap();
        let base = s.take_addresses(self.device, "cuMemAddressReserve", bytes, PAGE, PAGE)?;
        let size = (bytes as u64).max(1).div_ceil(PAGE) * PAGE;
        s.allocations.insert(
            base,
            Arc::new(Allocation {
                base,
                size: size as usize,
                reserved: true,
                data: Mutex::new(Backing::chunked()),
            }),
        );
        Ok(base)
    }

    pub fn release(&self, base: DevicePtr) -> Result<()> {
        let mut s = self.state.write().unwrap();
        match s.allocations.get(&base) {
            Some(a) if a.reserved => {
                let end = a.base + a.size as u64;
                if (base..end)
                    .step_by(PAGE as usize)
                    .any(|p| s.mapped.contains(&p))
                {
                    return Err(Error::InvalidArgument(format!(
                        "release of {base:#x} on {}: pages are still mapped",
                        self.device
                    )));
                }
                s.allocations.remove(&base);
                Ok(())
            }
            _ => Err(Error::InvalidArgument(format!(
                "release of {base:#x} on {}: not a reserved range",
                self.device
            ))),
        }
    }

    fn pages(&self, s: &State, ptr: DevicePtr, bytes: usize) -> Result<std::ops::Range<u64>> {
        let inside = s
            .allocations
            .range(..=ptr)
            .next_back()
            .map(|(_, a)| a.reserved && ptr + bytes as u64 <= a.base + a.size as u64)
            .unwrap_or(false);
        if !inside || (ptr | bytes as u64) & (PAGE - 1) != 0 {
            return Err(Error::InvalidArgument(format!(
                "{bytes} bytes at {ptr:#x} on {}: not whole pages of a reserved range",
                self.device
            )));
        }
        Ok(ptr / PAGE..(ptr + bytes as u64) / PAGE)
    }

    /// Physical memory (`cuMemCreate`): counts against the capacity from now until
    /// `free_physical`, mapped or not. Its contents do not travel with it between
    /// mappings here: the bytes of a reserved range's pages go when the pages are
    /// unmapped, and pages mapped again read zeros. The allocator never relies on the
    /// contents of memory it moves.
    pub fn create(&self, bytes: usize) -> Result<u64> {
        let mut s = self.state.write().unwrap();
        if bytes == 0 || bytes as u64 & (PAGE - 1) != 0 {
            return Err(Error::InvalidArgument(format!(
                "physical memory of {bytes} bytes on {}: not whole pages",
                self.device
            )));
        }
        let free = self.capacity - s.used;
        if bytes as u64 > free {
            return Err(Error::OutOfMemory {
                device: self.device,
                requested: bytes as u64,
                free,
                total: self.capacity,
                report: None,
            });
        }
        s.used += bytes as u64;
        let handle = s.next_handle;
        s.next_handle += 1;
        s.physical.insert(handle, (bytes, None));
        Ok(handle)
    }

    /// Maps physical memory at `ptr`, whole pages of a reserved range (`cuMemMap`).
    pub fn map_physical(&self, ptr: DevicePtr, handle: u64) -> Result<()> {
        let mut s = self.state.write().unwrap();
        let bytes = match s.physical.get(&handle) {
            Some((bytes, None)) => *bytes,
            Some((_, Some(at))) => {
                return Err(Error::InvalidArgument(format!(
                    "map at {ptr:#x} on {}: that memory is already mapped at {at:#x}",
                    self.device
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "map at {ptr:#x} on {}: no such physical memory",
                    self.device
                )))
            }
        };
        let pages = self.pages(&s, ptr, bytes)?;
        if pages.clone().any(|p| s.mapped.contains(&(p * PAGE))) {
            return Err(Error::InvalidArgument(format!(
                "map of {ptr:#x} on {}: already mapped",
                self.device
            )));
        }
        for p in pages {
            s.mapped.insert(p * PAGE);
        }
        s.physical.insert(handle, (bytes, Some(ptr)));
        s.mapped_at.insert(ptr, handle);
        Ok(())
    }

    /// Unmaps what one `map_physical` mapped at `ptr` (`cuMemUnmap`); the memory stays
    /// allocated and is returned. The host bytes behind the unmapped pages are freed.
    pub fn unmap_physical(&self, ptr: DevicePtr, bytes: usize) -> Result<u64> {
        let (handle, range) = self.unmap_pages(ptr, bytes)?;
        // Outside the state lock: allocations are locked while a kernel runs, and a
        // kernel may wait on another memory's state (a peer copy).
        range
            .data
            .lock()
            .unwrap()
            .drop_chunks((ptr - range.base) as usize, bytes);
        Ok(handle)
    }

    /// The bookkeeping of `unmap_physical`: the handle, and the reserved range.
    fn unmap_pages(&self, ptr: DevicePtr, bytes: usize) -> Result<(u64, Arc<Allocation>)> {
        let mut s = self.state.write().unwrap();
        let handle = match s.mapped_at.get(&ptr) {
            Some(&h) if s.physical.get(&h).map(|p| p.0) == Some(bytes) => h,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unmap of {bytes} bytes at {ptr:#x} on {}: not one mapping",
                    self.device
                )))
            }
        };
        for p in self.pages(&s, ptr, bytes)? {
            s.mapped.remove(&(p * PAGE));
            s.access.remove(&(p * PAGE));
        }
        s.mapped_at.remove(&ptr);
        s.physical.insert(handle, (bytes, None));
        let range = s
            .allocations
            .range(..=ptr)
            .next_back()
            .map(|(_, a)| a.clone())
            .expect("pages() found the reserved range");
        Ok((handle, range))
    }

    /// Lets `devices` read and write every page of `ptr..ptr+bytes`, which must all be
    /// mapped (`cuMemSetAccess`). Access is bookkeeping only: kernels are not checked
    /// against it.
    pub fn set_access(&self, ptr: DevicePtr, bytes: usize, devices: &[DeviceId]) -> Result<()> {
        let mut s = self.state.write().unwrap();
        let pages = self.pages(&s, ptr, bytes)?;
        if !pages.clone().all(|p| s.mapped.contains(&(p * PAGE))) {
            return Err(Error::InvalidArgument(format!(
                "access to {bytes} bytes at {ptr:#x} on {}: not all mapped",
                self.device
            )));
        }
        for p in pages {
            let list = s.access.entry(p * PAGE).or_default();
            for d in devices {
                if !list.contains(d) {
                    list.push(*d);
                }
            }
        }
        Ok(())
    }

    /// Lets `device` read and write every page mapped now.
    pub fn grant_mapped(&self, device: DeviceId) {
        let mut s = self.state.write().unwrap();
        let pages: Vec<u64> = s.mapped.iter().copied().collect();
        for page in pages {
            let list = s.access.entry(page).or_default();
            if !list.contains(&device) {
                list.push(device);
            }
        }
    }

    /// Whether `device` may read and write the mapped page at `ptr` (`cuMemGetAccess`,
    /// which fails on an address that is not mapped).
    pub fn has_access(&self, ptr: DevicePtr, device: DeviceId) -> Result<bool> {
        let s = self.state.read().unwrap();
        let page = ptr / PAGE * PAGE;
        if !s.mapped.contains(&page) {
            return Err(Error::InvalidArgument(format!(
                "access of {ptr:#x} on {}: not mapped memory",
                self.device
            )));
        }
        Ok(s.access.get(&page).is_some_and(|l| l.contains(&device)))
    }

    /// Releases physical memory mapped nowhere (`cuMemRelease`).
    pub fn free_physical(&self, handle: u64) -> Result<()> {
        let mut s = self.state.write().unwrap();
        match s.physical.get(&handle) {
            Some((bytes, None)) => {
                s.used -= *bytes as u64;
                s.physical.remove(&handle);
                Ok(())
            }
            Some((_, Some(at))) => Err(Error::InvalidArgument(format!(
                "release of physical memory on {}: still mapped at {at:#x}",
                self.device
            ))),
            None => Err(Error::InvalidArgument(format!(
                "release of physical memory on {}: no such memory",
                self.device
            ))),
        }
    }

    /// Host memory mapped into the simulated address space: backed at once, because the
    /// host writes it through the returned pointer, and not counted against the
    /// capacity, because it is not device memory.
    pub fn alloc_mapped(&self, bytes: usize) -> Result<(DevicePtr, *mut u8)> {
        let mut s = self.state.write().unwrap();
        let base = s.take_addresses(self.device, "cuMemHostAlloc", bytes, ALIGNMENT, GUARD)?;
        let mut data = vec![0u8; bytes.max(1)].into_boxed_slice();
        // The boxed bytes never move, so the pointer stays valid while the allocation lives.
        let host = data.as_mut_ptr();
        s.allocations.insert(
            base,
            Arc::new(Allocation {
                base,
                size: bytes,
                reserved: false,
                data: Mutex::new(Backing::Whole(data)),
            }),
        );
        Ok((base, host))
    }

    /// Unregisters memory from `alloc_mapped`.
    pub fn free_mapped(&self, ptr: DevicePtr) -> Result<()> {
        let mut s = self.state.write().unwrap();
        match s.allocations.remove(&ptr) {
            Some(_) => Ok(()),
            None => Err(Error::InvalidArgument(format!(
                "free of mapped {ptr:#x} on {}: not a live mapping",
                self.device
            ))),
        }
    }

    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        let mut s = self.state.write().unwrap();
        match s.allocations.get(&ptr).filter(|a| !a.reserved).cloned() {
            Some(a) => {
                s.allocations.remove(&ptr);
                s.used -= a.size as u64;
                Ok(())
            }
            None => Err(Error::InvalidArgument(format!(
                "free of {ptr:#x} on {}: not the start of a live allocation",
                self.device
            ))),
        }
    }

    fn find(&self, addr: u64, len: usize) -> Result<Arc<Allocation>> {
        let s = self.state.read().unwrap();
        let hit = s.allocations.range(..=addr).next_back().map(|(_, a)| a);
        match hit {
            Some(a)
                if addr + len as u64 <= a.base + a.size as u64
                    && (!a.reserved
                        || (addr / PAGE..(addr + len.max(1) as u64).div_ceil(PAGE))
                            .all(|p| s.mapped.contains(&(p * PAGE)))) =>
            {
                Ok(a.clone())
            }
            _ => Err(Error::IllegalAddress {
                device: self.device,
                detail: format!("{len} bytes at {addr:#x} are not inside one live allocation"),
            }),
        }
    }

    /// Checks that `len` bytes at `addr` lie inside one live allocation (mapped, for a
    /// reserved range) without touching them: what a dry run checks in place of a copy.
    pub fn check_range(&self, addr: u64, len: usize) -> Result<()> {
        self.find(addr, len).map(|_| ())
    }

    /// Runs `f` with host pointers to each `(address, length)` range. Every allocation
    /// involved stays locked for the call (locks are taken in address order, so two
    /// kernels never deadlock). Ranges may alias: callers use raw pointers, as a kernel
    /// would, and ranges that overlap on the device overlap on the host (`backing.rs`).
    pub fn access<R>(&self, ranges: &[(u64, usize)], f: impl FnOnce(&[*mut u8]) -> R) -> Result<R> {
        let mut allocs: Vec<Arc<Allocation>> = Vec::with_capacity(ranges.len());
        // The base of the allocation each range lies in.
        let mut owners: Vec<u64> = Vec::with_capacity(ranges.len());
        for &(addr, len) in ranges {
            let a = self.find(addr, len)?;
            owners.push(a.base);
            if !allocs.iter().any(|b| b.base == a.base) {
                allocs.push(a);
            }
        }
        allocs.sort_by_key(|a| a.base);
        let mut guards: Vec<MutexGuard<'_, Backing>> =
            allocs.iter().map(|a| a.data.lock().unwrap()).collect();
        let mut pointers = vec![std::ptr::null_mut(); ranges.len()];
        let mut staged: Vec<Staged> = Vec::new();
        for (n, (a, g)) in allocs.iter().zip(guards.iter_mut()).enumerate() {
            let mine: Vec<(usize, usize, usize)> = (ranges.iter().zip(&owners).enumerate())
                .filter(|(_, (_, &owner))| owner == a.base)
                .map(|(i, (&(addr, len), _))| ((addr - a.base) as usize, len, i))
                .collect();
            g.resolve(a.size, n, mine, &mut pointers, &mut staged)
                .map_err(|bytes| self.host_exhausted(bytes))?;
        }
        let result = f(&pointers);
        for s in &staged {
            guards[s.alloc]
                .scatter(allocs[s.alloc].size, s)
                .map_err(|bytes| self.host_exhausted(bytes))?;
        }
        drop(guards);
        Ok(result)
    }

    /// The error of a host that cannot give `bytes` more to back this device's memory.
    fn host_exhausted(&self, bytes: usize) -> Error {
        let budget = match super::backing::budget() {
            u64::MAX => String::new(),
            b => format!(
                ", of at most {} that the simulated GPUs may back (3/4 of ulimit -v)",
                crate::format::bytes(b)
            ),
        };
        Error::Driver {
            call: "simulated device memory",
            message: format!(
                "{}: the host has no {bytes} bytes left to back the simulated GPU's memory\
                 {budget} (its memory is host memory: use a smaller model, fewer ranks or \
                 devices, or more host memory)",
                self.device
            ),
        }
    }

    /// Fills `count` elements of `pattern` at `dst` (`cuMemsetD*`), chunk by chunk:
    /// zeros written over chunks never touched leave them untouched, so that zeroing a
    /// tensor of gigabytes costs no host memory.
    pub fn fill(&self, dst: u64, pattern: FillPattern, count: usize) -> Result<()> {
        let width = pattern.width();
        let bytes = count * width;
        let a = self.find(dst, bytes)?;
        let mut data = a.data.lock().unwrap();
        let offset = (dst - a.base) as usize;
        data.fill(a.size, offset, bytes, pattern)
            .map_err(|n| self.host_exhausted(n))
    }

    pub fn write(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.access(&[(dst, src.len())], |p| unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), p[0], src.len())
        })
    }

    pub fn read(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.access(&[(src, dst.len())], |p| unsafe {
            std::ptr::copy_nonoverlapping(p[0], dst.as_mut_ptr(), dst.len())
        })
    }

    /// Host bytes materialised so far (tests check the laziness with it).
    pub fn backed_bytes(&self) -> u64 {
        let allocs: Vec<Arc<Allocation>> = self
            .state
            .read()
            .unwrap()
            .allocations
            .values()
            .cloned()
            .collect();
        allocs.iter().map(|a| a.data.lock().unwrap().bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_enforced() {
        let m = SimMemory::new(DeviceId::Sim(0), 1 << 20);
        let a = m.alloc(768 << 10).unwrap();
        let err = m.alloc(512 << 10).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        m.free(a).unwrap();
        m.alloc(1 << 20).unwrap();
    }

    #[test]
    fn memory_is_backed_lazily() {
        let m = SimMemory::new(DeviceId::Sim(0), 64 << 30);
        let big = m.alloc(32 << 30).unwrap();
        let small = m.alloc(4096).unwrap();
        assert_eq!(m.backed_bytes(), 0);
        m.write(small, &[1, 2, 3]).unwrap();
        assert_eq!(m.backed_bytes(), 4096);
        m.free(big).unwrap();
    }

    /// A reserved range of `bytes` with physical memory mapped over all of it.
    fn mapped_range(m: &SimMemory, bytes: usize) -> DevicePtr {
        let base = m.reserve(bytes).unwrap();
        let handle = m.create(bytes).unwrap();
        m.map_physical(base, handle).unwrap();
        base
    }

    #[test]
    fn touching_one_byte_of_a_gigabyte_backs_one_chunk() {
        let m = SimMemory::new(DeviceId::Sim(0), 64 << 30);
        let plain = m.alloc(1 << 30).unwrap();
        m.write(plain + (300 << 20) + 5, &[7]).unwrap();
        assert_eq!(m.backed_bytes(), PAGE, "one byte of a 1 GiB allocation");
        let reserved = mapped_range(&m, 1 << 30);
        m.write(reserved + (700 << 20) + 3, &[9]).unwrap();
        assert_eq!(
            m.backed_bytes(),
            2 * PAGE,
            "one byte of a 1 GiB mapped range"
        );
        let mut back = [0u8; 2];
        m.read(&mut back, reserved + (700 << 20) + 2).unwrap();
        assert_eq!(back, [0, 9]);
        assert_eq!(m.backed_bytes(), 2 * PAGE, "reading backs nothing more");
    }

    /// Deterministic bytes, none of them zero.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 + seed.max(1)).collect()
    }

    #[test]
    fn a_range_spanning_chunks_reads_and_writes() {
        let m = SimMemory::new(DeviceId::Sim(0), 1 << 30);
        let page = PAGE as usize;
        let a = m.alloc(3 * page + 1000).unwrap();
        let data = pattern(2 * page + 1000, 3);
        let at = page as u64 - 500;
        m.write(a + at, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        m.read(&mut back, a + at).unwrap();
        assert!(back == data, "a write across three chunks reads back");
        // Pieces of it, inside one chunk and across a boundary, and the zeros around.
        let mut piece = vec![0u8; 64];
        m.read(&mut piece, a + 2 * PAGE - 32).unwrap();
        let from = (2 * PAGE - 32 - at) as usize;
        assert_eq!(piece, data[from..from + 64]);
        m.read(&mut piece, a + at - 64).unwrap();
        assert_eq!(piece, vec![0u8; 64], "bytes before the write are zero");
        let mut tail = vec![1u8; 700];
        m.read(&mut tail, a + 3 * PAGE).unwrap();
        let end = (3 * PAGE - at) as usize;
        assert_eq!(tail[..data.len() - end], data[end..]);
        assert!(tail[data.len() - end..].iter().all(|&b| b == 0));
    }

    #[test]
    fn aliasing_ranges_across_chunks_are_one_memory() {
        let m = SimMemory::new(DeviceId::Sim(0), 1 << 30);
        let a = m.alloc(3 * PAGE as usize).unwrap();
        let data = pattern(4096, 1);
        let at = PAGE - 2000;
        m.write(a + at, &data).unwrap();
        // An in-place shift across the chunk boundary (memmove within one allocation,
        // source and destination overlapping), as a device-to-device copy does it.
        let shift = 3;
        let len = data.len() - shift;
        m.access(&[(a + at, len), (a + at + shift as u64, len)], |p| unsafe {
            std::ptr::copy(p[0], p[1], len)
        })
        .unwrap();
        let mut expected = data.clone();
        expected.copy_within(..len, shift);
        let mut back = vec![0u8; data.len()];
        m.read(&mut back, a + at).unwrap();
        assert!(back == expected, "the shift through aliasing pointers");
        // A write through one pointer is seen through the other at once.
        let seen = m
            .access(
                &[(a + PAGE - 8, 16), (a + PAGE - 4, 4), (a + PAGE, 8)],
                |p| unsafe {
                    *p[0].add(5) = 0xAB;
                    *p[0].add(9) = 0xCD;
                    (*p[1].add(1), *p[2].add(1))
                },
            )
            .unwrap();
        assert_eq!(seen, (0xAB, 0xCD));
        let mut two = [0u8; 5];
        m.read(&mut two, a + PAGE - 3).unwrap();
        assert_eq!((two[0], two[4]), (0xAB, 0xCD));
    }

    #[test]
    fn an_unmapped_range_mapped_again_reads_zeros() {
        let m = SimMemory::new(DeviceId::Sim(0), 1 << 30);
        let bytes = 2 * PAGE as usize;
        let base = mapped_range(&m, bytes);
        m.write(base + PAGE - 2, &[1, 2, 3, 4]).unwrap();
        assert!(m.backed_bytes() > 0);
        let handle = m.unmap_physical(base, bytes).unwrap();
        assert_eq!(m.backed_bytes(), 0, "unmapped pages keep no host memory");
        m.map_physical(base, handle).unwrap();
        let mut back = [9u8; 4];
        m.read(&mut back, base + PAGE - 2).unwrap();
        assert_eq!(back, [0; 4], "a page mapped again reads zeros");
    }

    #[test]
    fn zeroing_a_gigabyte_backs_nothing_and_a_pattern_crosses_chunks() {
        use crate::backend::prelude::*;
        use crate::dtype::FillPattern;
        let sim = crate::sim::SimBackend::new(DeviceId::Sim(0), 4 << 30);
        let stream = sim.default_stream().unwrap();
        let big = sim.raw_alloc(1 << 30).unwrap();
        sim.fill(big, FillPattern::U32(0), (1 << 30) / 4, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(sim.backed_bytes(), 0, "zeros over memory never touched");
        // A 4-byte pattern from an odd offset, across two chunk boundaries.
        let a = sim.raw_alloc(3 * PAGE as usize).unwrap();
        let (at, count) = (PAGE - 7, PAGE as usize / 4 + 5);
        sim.fill(a + at, FillPattern::U32(0x0403_0201), count, &stream)
            .unwrap();
        let mut back = vec![0u8; count * 4 + 2];
        sim.copy_dtoh(&mut back, a + at - 1, &stream).unwrap();
        assert_eq!(back[0], 0, "the byte before the fill");
        let element = 0x0403_0201u32.to_ne_bytes();
        assert!(
            (0..count * 4).all(|j| back[1 + j] == element[j % 4]),
            "every element of the pattern in place"
        );
        assert_eq!(back[count * 4 + 1], 0, "the byte after the fill");
    }

    #[test]
    fn out_of_bounds_is_an_illegal_address() {
        let m = SimMemory::new(DeviceId::Sim(0), 1 << 20);
        let a = m.alloc(100).unwrap();
        assert!(matches!(
            m.write(a + 90, &[0; 20]),
            Err(Error::IllegalAddress { .. })
        ));
        assert!(m.free(a + 8).is_err());
    }
}
