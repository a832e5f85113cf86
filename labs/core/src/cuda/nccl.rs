//! NCCL, the collective library of NVIDIA GPUs, through cudarc (loaded at run time, like
//! the driver). This is the thin layer: a communicator handle and one call per
//! collective on a [`Stream`]; `dist` builds PyTorch's process-group semantics on it.

use std::sync::OnceLock;

use cudarc::nccl::sys;

use super::stream::cuda_stream;
use crate::backend::{DeviceId, DevicePtr, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The bytes of an `ncclUniqueId`: rank 0 makes it, every rank needs it to join.
pub const UNIQUE_ID_BYTES: usize = 128;

/// The library's file name, as the error for a missing one says it.
pub const LIBRARY: &str = "libnccl.so.2";

// ANCHOR: nccl_probe
/// Loads NCCL once. cudarc panics when a library it needs cannot be loaded, so the
/// presence check comes first and turns absence into an error naming the library.
pub fn library() -> Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            // SAFETY: only probes for the library; loading has no other side effects.
            if unsafe { sys::is_culib_present() } {
                Ok(())
            } else {
                Err(format!(
                    "NCCL could not be loaded: {LIBRARY} was not found. Install NCCL (the \
                     libnccl2 package, or the nvidia-nccl-cu12 wheel) and put its folder on \
                     LD_LIBRARY_PATH"
                ))
            }
        })
        .clone()
        .map_err(Error::Distributed)
}
// ANCHOR_END: nccl_probe

/// NCCL's version as a number (`22703` for 2.27.3).
pub fn version() -> Result<i32> {
    library()?;
    let mut v = 0;
    // SAFETY: writes one int.
    check("ncclGetVersion", unsafe { sys::ncclGetVersion(&mut v) })?;
    Ok(v)
}

/// A fresh unique id (`ncclGetUniqueId`), made by rank 0 and sent to the others.
pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
    library()?;
    // SAFETY: a plain C struct of bytes, written by the call.
    let mut id: sys::ncclUniqueId = unsafe { std::mem::zeroed() };
    check("ncclGetUniqueId", unsafe { sys::ncclGetUniqueId(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

fn check(call: &'static str, r: sys::ncclResult_t) -> Result<()> {
    match r {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        other => {
            // SAFETY: NCCL returns a static string for every result code.
            let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(other)) };
            Err(Error::Distributed(format!(
                "{call} failed: {} ({other:?})",
                text.to_string_lossy()
            )))
        }
    }
}

/// NCCL's name for a dtype; all of ours have one.
fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match dtype {
        DType::F32 => T::ncclFloat32,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I32 => T::ncclInt32,
        DType::I64 => T::ncclInt64,
        DType::U8 => T::ncclUint8,
    }
}

/// The reductions NCCL has, as `dist` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    Sum,
    Avg,
    Max,
    Min,
}

fn nccl_op(op: RedOp) -> sys::ncclRedOp_t {
    match op {
        RedOp::Sum => sys::ncclRedOp_t::ncclSum,
        RedOp::Avg => sys::ncclRedOp_t::ncclAvg,
        RedOp::Max => sys::ncclRedOp_t::ncclMax,
        RedOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

/// The raw stream behind `stream` (a stream of `device`), with its context made current
/// on this thread: NCCL finds the device through the current context.
fn raw_stream(stream: &Stream, device: DeviceId) -> Result<sys::cudaStream_t> {
    let s = cuda_stream(stream, device)?;
    s.bind()?;
    Ok(s.raw() as sys::cudaStream_t)
}

/// One rank's NCCL communicator, on one GPU; destroyed when dropped.
pub struct NcclComm {
    raw: sys::ncclComm_t,
    device: DeviceId,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `dist`
// issues each rank's calls from the thread that owns its communicator.
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl NcclComm {
    // ANCHOR: comm_init_rank
    /// Joins communicator `id` as `rank` of `world_size` (`ncclCommInitRank`), on the GPU
    /// of `stream` (any stream of it: its context is made current first). Blocks until
    /// every rank has joined.
    pub fn init_rank(
        stream: &Stream,
        world_size: usize,
        id: &[u8; UNIQUE_ID_BYTES],
        rank: usize,
    ) -> Result<NcclComm> {
        library()?;
        let device = stream.device();
        raw_stream(stream, device)?;
        let unique = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` receives the new communicator.
        check("ncclCommInitRank", unsafe {
            sys::ncclCommInitRank(&mut raw, world_size as i32, unique, rank as i32)
        })?;
        Ok(NcclComm { raw, device })
    }
    // ANCHOR_END: comm_init_rank

    /// One communicator per GPU of this process (`ncclCommInitAll`); rank `i` drives
    /// `ordinals[i]`.
    pub fn init_all(ordinals: &[usize], any_stream: &Stream) -> Result<Vec<NcclComm>> {
        library()?;
        raw_stream(any_stream, any_stream.device())?;
        let list: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut raws = vec![std::ptr::null_mut(); list.len()];
        // SAFETY: `raws` has room for one communicator per listed device.
        check("ncclCommInitAll", unsafe {
            sys::ncclCommInitAll(raws.as_mut_ptr(), list.len() as i32, list.as_ptr())
        })?;
        Ok(raws
            .into_iter()
            .zip(ordinals)
            .map(|(raw, &o)| NcclComm {
                raw,
                device: DeviceId::Cuda(o),
            })
            .collect())
    }

    /// `ncclAllReduce` of `count` elements from `send` into `recv` (which may be `send`).
    pub fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        op: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let s = raw_stream(stream, self.device)?;
        // SAFETY: `dist` checked both buffers' sizes against `count` and `dtype`.
        check("ncclAllReduce", unsafe {
            sys::ncclAllReduce(
                send as _,
                recv as _,
                count,
                nccl_dtype(dtype),
                nccl_op(op),
                self.raw,
                s,
            )
        })
    }

    /// `ncclBroadcast` of `count` elements from `root`'s `send` into every rank's `recv`.
    pub fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let s = raw_stream(stream, self.device)?;
        // SAFETY: as for `all_reduce`.
        check("ncclBroadcast", unsafe {
            sys::ncclBroadcast(
                send as _,
                recv as _,
                count,
                nccl_dtype(dtype),
                root as i32,
                self.raw,
                s,
            )
        })
    }

    /// `ncclAllGather`: `count` elements from each rank into `recv`, rank after rank.
    pub fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        stream: &Stream,
    ) -> Result<()> {
        let s = raw_stream(stream, self.device)?;
        // SAFETY: `recv` holds `count` elements per rank (checked by `dist`).
        check("ncclAllGather", unsafe {
            sys::ncclAllGather(send as _, recv as _, count, nccl_dtype(dtype), self.raw, s)
        })
    }

    /// `ncclReduceScatter`: reduces `send` (`count` elements per rank) and leaves rank
    /// `r`'s `count` elements of the result in its `recv`.
    pub fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DType,
        op: RedOp,
        stream: &Stream,
    ) -> Result<()> {
        let s = raw_stream(stream, self.device)?;
        // SAFETY: as for `all_gather`, the other way round.
        check("ncclReduceScatter", unsafe {
            sys::ncclReduceScatter(
                send as _,
                recv as _,
                count,
                nccl_dtype(dtype),
                nccl_op(op),
                self.raw,
                s,
            )
        })
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: destroyed once; NCCL waits for the communicator's pending work.
        let _ = unsafe { sys::ncclCommDestroy(self.raw) };
    }
}
