//! Copies between two devices. GPU to GPU goes straight across (a peer copy) where the
//! hardware allows it, else through pinned host memory in chunks; anything else (the
//! host, devices of two kinds) goes through an ordinary host buffer. The path taken is
//! returned, for tests and for lab 4, which measures each.
//!
//! Every path is ordered on the two devices' default streams, where their tensors'
//! memory is allocated and their work runs: the copy waits for the source's pending
//! work (an event), and the source's later work waits for the copy (another event), so
//! that the source's memory, freed and reused on its own stream, is never overwritten
//! under the copy. PyTorch orders its cross-device copies the same way, both ways,
//! rather than recording the source block on the other device's stream, which its
//! allocator (like ours) does not accept.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::{Device, DeviceId, DevicePtr, Event};
use crate::error::{Error, Result};

/// How a cross-device copy travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CopyPath {
    /// Device to device directly (`cuMemcpyPeerAsync` over NVLink or PCIe).
    Peer,
    /// Device to pinned host memory to device, chunk by chunk, the two halves of
    /// consecutive chunks overlapping.
    Staged,
    /// Through an ordinary host buffer: to or from the host, or between kinds of device.
    Host,
}

impl std::fmt::Display for CopyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CopyPath::Peer => "peer",
            CopyPath::Staged => "staged",
            CopyPath::Host => "host",
        })
    }
}

/// Which paths a copy may take: any (peer where possible), or staged even where a peer
/// copy is possible (to compare the two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyVia {
    #[default]
    Any,
    Staged,
}

/// The size of one staging chunk: a copy of any size needs two of them in pinned
/// memory, not a host buffer as large as itself.
pub const STAGING_CHUNK: usize = 16 << 20;

// ANCHOR: copy_between
/// Copies `bytes` from `src_ptr` on `src` to `dst_ptr` on `dst`, two distinct devices,
/// and says how. Peer and staged copies are ordered on both default streams (see the
/// module's documentation); a peer copy returns before it has run, a staged one once
/// its last chunk has arrived, as its pinned buffers are then free again.
pub fn copy_between(
    src: &Device,
    src_ptr: DevicePtr,
    dst: &Device,
    dst_ptr: DevicePtr,
    bytes: usize,
    via: CopyVia,
) -> Result<CopyPath> {
    if src.id() == dst.id() {
        return Err(Error::InvalidArgument(format!(
            "copy_between: {} to itself is not a cross-device copy",
            src.id()
        )));
    }
    let same_kind = src.id().kind() == dst.id().kind() && src.id() != DeviceId::Cpu;
    if !same_kind {
        let mut host = vec![0u8; bytes];
        src.backend()
            .copy_dtoh(&mut host, src_ptr, &src.current_stream()?)?;
        dst.backend()
            .copy_htod(dst_ptr, &host, &dst.current_stream()?)?;
        return Ok(CopyPath::Host);
    }
    if bytes == 0 {
        return Ok(CopyPath::Peer);
    }
    let path = if via == CopyVia::Any && dst.can_access_peer(src)? {
        CopyPath::Peer
    } else {
        CopyPath::Staged
    };
    match path {
        // Dry runs have no values to move, whichever way: the backend checks the ranges.
        _ if dst.is_dry() => dst.backend().copy_from_peer(
            dst_ptr,
            src.backend(),
            src_ptr,
            bytes,
            &dst.current_stream()?,
        )?,
        CopyPath::Peer => peer_copy(src, src_ptr, dst, dst_ptr, bytes)?,
        _ => staged_copy(src, src_ptr, dst, dst_ptr, bytes)?,
    }
    Ok(path)
}
// ANCHOR_END: copy_between

/// The destination's stream waits for the source's work so far, copies, and the
/// source's stream waits for the copy.
fn peer_copy(
    src: &Device,
    src_ptr: DevicePtr,
    dst: &Device,
    dst_ptr: DevicePtr,
    bytes: usize,
) -> Result<()> {
    let (src_stream, dst_stream) = (src.current_stream()?, dst.current_stream()?);
    let ready = src.new_event()?;
    src_stream.record(&ready)?;
    dst_stream.wait(&ready)?;
    dst.backend()
        .copy_from_peer(dst_ptr, src.backend(), src_ptr, bytes, &dst_stream)?;
    let done = dst.new_event()?;
    dst_stream.record(&done)?;
    src_stream.wait(&done)
}

/// Device to host on the source's stream, host to device on the destination's, two
/// pinned chunks in turn, so that chunk `k + 1` leaves the source while chunk `k`
/// enters the destination.
fn staged_copy(
    src: &Device,
    src_ptr: DevicePtr,
    dst: &Device,
    dst_ptr: DevicePtr,
    bytes: usize,
) -> Result<()> {
    let (src_stream, dst_stream) = (src.current_stream()?, dst.current_stream()?);
    let mut chunks = StagingChunks::take(src)?;
    let left: [Event; 2] = [src.new_event()?, src.new_event()?];
    let mut arrived: [Option<Event>; 2] = [None, None];
    let mut offset = 0;
    let mut turn = 0;
    while offset < bytes {
        let n = STAGING_CHUNK.min(bytes - offset);
        let b = turn % 2;
        // The chunk's previous contents must have arrived before it is refilled.
        if let Some(e) = &arrived[b] {
            e.synchronize()?;
        }
        let host = chunks.ptrs[b] as *mut u8;
        // SAFETY: the chunk is ours until `chunks` is dropped, after every copy into
        // and out of it has completed (the loop waits for `arrived` below).
        unsafe {
            src.backend()
                .copy_dtoh_async(host, src_ptr + offset as u64, n, &src_stream)?;
        }
        src_stream.record(&left[b])?;
        dst_stream.wait(&left[b])?;
        // SAFETY: as above.
        unsafe {
            dst.backend()
                .copy_htod_async(dst_ptr + offset as u64, host, n, &dst_stream)?;
        }
        let e = dst.new_event()?;
        dst_stream.record(&e)?;
        arrived[b] = Some(e);
        offset += n;
        turn += 1;
    }
    for e in arrived.iter().flatten() {
        e.synchronize()?;
    }
    chunks.done = true;
    Ok(())
}

/// Two pinned chunks of one device's staging pool, put back when dropped. The pool
/// keeps them for the process, as PyTorch's pinned-memory cache keeps its blocks:
/// pinning costs milliseconds, too much to pay at every copy. They are the device's
/// own `host_alloc` memory (portable to every context on a GPU) rather than the host
/// caching allocator's, which sits above tensors in the layers.
struct StagingChunks {
    device: DeviceId,
    ptrs: [usize; 2],
    /// No copy uses them any more. Chunks of a copy that failed half-way may still be
    /// in use by a queued copy, and are never handed out again.
    done: bool,
}

fn staging_pool() -> &'static Mutex<HashMap<DeviceId, Vec<usize>>> {
    static POOL: OnceLock<Mutex<HashMap<DeviceId, Vec<usize>>>> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

impl StagingChunks {
    fn take(device: &Device) -> Result<StagingChunks> {
        let mut ptrs = [0usize; 2];
        for p in &mut ptrs {
            let cached = staging_pool()
                .lock()
                .unwrap()
                .get_mut(&device.id())
                .and_then(Vec::pop);
            *p = match cached {
                Some(ptr) => ptr,
                None => device.backend().host_alloc(STAGING_CHUNK, false)? as usize,
            };
        }
        Ok(StagingChunks {
            device: device.id(),
            ptrs,
            done: false,
        })
    }
}

impl Drop for StagingChunks {
    fn drop(&mut self) {
        if !self.done {
            return;
        }
        staging_pool()
            .lock()
            .unwrap()
            .entry(self.device)
            .or_default()
            .extend(self.ptrs);
    }
}
