//! Peer access on the GPU: copies straight from another GPU's memory, and the access
//! rights that memory mapped with the virtual memory API needs for them.
//!
//! `cuCtxEnablePeerAccess` lets one context address another's `cuMemAlloc` memory, but
//! not memory mapped with `cuMemMap`: that is reachable only by the devices named in
//! its access descriptors (`cuMemSetAccess`). The caching allocator's expandable
//! segments are such memory, so a peer copy of a tensor could not address its pages
//! directly, and the driver took a slower path. Each GPU therefore remembers which
//! others were granted access to its memory: granting one sets access on every current
//! mapping, and every later mapping gets a descriptor for each granted peer beside its
//! own (`vm_set_access`), as PyTorch's allocator does for its expandable segments once
//! peer access is enabled between two devices.

use std::collections::HashMap;

use cudarc::driver::{result, sys};

use super::{driver, CudaBackend};
use crate::backend::prelude::*;
use crate::backend::{DeviceId, DevicePtr, Stream};
use crate::error::{Error, Result};

/// What `vm_map_memory` mapped and who besides the device may use it, behind one lock
/// (`State::mappings`): a grant walks the mappings and `vm_set_access` reads the peers
/// while holding it, so a mapping made while access is being granted ends up
/// accessible to the peer either way.
#[derive(Default)]
pub(super) struct Mappings {
    /// The physical allocation behind each mapping and its size, by mapped address.
    handles: HashMap<DevicePtr, (sys::CUmemGenericAllocationHandle, usize)>,
    /// The other GPUs granted read and write access to every mapping, in order.
    peers: Vec<usize>,
}

impl Mappings {
    pub fn insert(
        &mut self,
        ptr: DevicePtr,
        handle: sys::CUmemGenericAllocationHandle,
        bytes: usize,
    ) {
        self.handles.insert(ptr, (handle, bytes));
    }

    /// Forgets the mapping at `ptr` and returns its handle.
    pub fn remove(&mut self, ptr: DevicePtr) -> Option<sys::CUmemGenericAllocationHandle> {
        self.handles.remove(&ptr).map(|(handle, _)| handle)
    }

    pub fn peers(&self) -> &[usize] {
        &self.peers
    }
}

/// Read and write access for GPU `ordinal`.
pub(super) fn access_desc(ordinal: usize) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as i32,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Whether GPU `from` can address GPU `to`'s memory (`cuDeviceCanAccessPeer`).
fn device_can_access(from: usize, to: usize) -> Result<bool> {
    driver()?;
    let cu_device = |ordinal: usize| {
        result::device::get(ordinal as i32).map_err(|e| Error::driver("cuDeviceGet", e))
    };
    let (from, to) = (cu_device(from)?, cu_device(to)?);
    let mut can = 0;
    // SAFETY: a valid out-pointer and two device handles; no context is needed.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, from, to) }
        .result()
        .map_err(|e| Error::driver("cuDeviceCanAccessPeer", e))?;
    Ok(can != 0)
}

impl CudaBackend {
    /// Lets this context address `other`'s `cuMemAlloc` memory (`cuCtxEnablePeerAccess`),
    /// once. Leaves this context bound to the calling thread.
    fn enable_context_access(&self, other: &CudaBackend) -> Result<()> {
        // The peer's context first: making it exists binds it, and ours must be bound last.
        let peer_ctx = other.state()?.ctx.cu_ctx();
        let s = self.state()?;
        let mut peers = s.peers.lock().unwrap();
        if peers.contains(&other.ordinal) {
            return Ok(());
        }
        // SAFETY: our context is current; the peer's is alive (its device holds it).
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
        if r != sys::CUresult::CUDA_SUCCESS
            && r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        {
            return Err(Error::driver(
                "cuCtxEnablePeerAccess",
                format!("cuda:{} to cuda:{}: {r:?}", self.ordinal, other.ordinal),
            ));
        }
        peers.insert(other.ordinal);
        Ok(())
    }

    /// Whether the pair has been through `enable_pair` (from this side).
    fn pair_enabled(&self, other: &CudaBackend) -> Result<bool> {
        Ok(self.state()?.peers.lock().unwrap().contains(&other.ordinal))
    }

    /// Peer access between the two GPUs both ways: each context addresses the other's
    /// memory, and each GPU's mapped memory is granted to the other, since the copy
    /// engine of either side may read or write it. Leaves this context bound.
    fn enable_pair(&self, other: &CudaBackend) -> Result<()> {
        other.grant_peer_access(self.id())?;
        self.grant_peer_access(other.id())?;
        other.enable_context_access(self)?;
        self.enable_context_access(other)
    }
}

// ANCHOR: cuda_peer
impl PeerAccess for CudaBackend {
    fn can_access_peer(&self, peer: DeviceId) -> Result<bool> {
        let DeviceId::Cuda(other) = peer else {
            return Ok(false);
        };
        if other == self.ordinal {
            return Ok(false);
        }
        device_can_access(self.ordinal, other)
    }

    fn copy_from_peer(
        &self,
        dst: DevicePtr,
        peer: &dyn Backend,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let other = peer.as_any().downcast_ref::<CudaBackend>().ok_or_else(|| {
            Error::InvalidArgument(format!("a peer copy from {} to {}", peer.id(), self.id()))
        })?;
        if !self.pair_enabled(other)? {
            self.enable_pair(other)?;
        }
        let peer_ctx = other.state()?.ctx.cu_ctx();
        // Ours bound last: the copy is enqueued on our stream.
        let s = self.state()?;
        let raw = super::stream::cuda_stream(stream, self.id())?.raw();
        // SAFETY: both ranges are device memory their owners keep alive until the
        // stream has passed the copy; the contexts are those the pointers belong to.
        unsafe { sys::cuMemcpyPeerAsync(dst, s.ctx.cu_ctx(), src, peer_ctx, bytes, raw) }
            .result()
            .map_err(|e| Error::driver("cuMemcpyPeerAsync", e))
    }

    fn grant_peer_access(&self, peer: DeviceId) -> Result<()> {
        let ordinal = match peer {
            DeviceId::Cuda(o) if o != self.ordinal => o,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{peer} cannot be granted access to the memory of {}: only another GPU can",
                    self.id()
                )))
            }
        };
        if !device_can_access(ordinal, self.ordinal)? {
            return Err(Error::InvalidArgument(format!(
                "{peer} cannot access the memory of {} (cuDeviceCanAccessPeer says no: no \
                 NVLink or PCIe peer-to-peer path between them)",
                self.id()
            )));
        }
        let s = self.state()?;
        let mut mappings = s.mappings.lock().unwrap();
        if mappings.peers.contains(&ordinal) {
            return Ok(());
        }
        let desc = [access_desc(ordinal)];
        for (&ptr, &(_, bytes)) in &mappings.handles {
            // SAFETY: a mapping this backend made and has not unmapped (the lock keeps
            // it so); one valid descriptor.
            unsafe { sys::cuMemSetAccess(ptr, bytes, desc.as_ptr(), 1) }
                .result()
                .map_err(|e| {
                    Error::driver(
                        "cuMemSetAccess",
                        format!(
                            "granting {peer} access to {bytes} bytes at {ptr:#x} of {}: {e}",
                            self.id()
                        ),
                    )
                })?;
        }
        // Listed only once every mapping is granted: a failed grant is tried afresh.
        mappings.peers.push(ordinal);
        Ok(())
    }

    fn granted_peers(&self) -> Vec<DeviceId> {
        match self.state.get() {
            Some(s) => (s.mappings.lock().unwrap().peers.iter())
                .map(|&o| DeviceId::Cuda(o))
                .collect(),
            None => Vec::new(),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
// ANCHOR_END: cuda_peer
