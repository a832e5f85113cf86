//! NCCL, the collective library of NVIDIA GPUs, loaded at run time like the driver (by
//! its own name, `libnccl.so.2`, with cudarc's declarations of its types). This is the
//! thin layer: a communicator handle and one call per collective on a [`Stream`];
//! `collectives.rs` makes it the GPU's side of the contract's collectives, and `dist`
//! builds PyTorch's process-group semantics on that.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nccl::sys;

use super::stream::cuda_stream;
use crate::backend::{DeviceId, DevicePtr, ReduceOp, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};

pub use crate::backend::UNIQUE_ID_BYTES;

/// The library's file name, as its packages and Python wheels install it.
pub const LIBRARY: &str = "libnccl.so.2";

/// An environment variable naming the library's path, tried before anything else.
pub const ENV_LIBRARY: &str = "LABS_NCCL_LIBRARY";

type Status = c_int;
type RawStream = sys::cudaStream_t;

/// The NCCL calls used here, resolved once from the loaded library. Results are read
/// as plain integers: a code this build does not know must not be an invalid enum.
struct Api {
    _library: libloading::Library,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    get_unique_id: unsafe extern "C" fn(*mut sys::ncclUniqueId) -> Status,
    comm_init_rank:
        unsafe extern "C" fn(*mut sys::ncclComm_t, c_int, sys::ncclUniqueId, c_int) -> Status,
    comm_init_all: unsafe extern "C" fn(*mut sys::ncclComm_t, c_int, *const c_int) -> Status,
    comm_destroy: unsafe extern "C" fn(sys::ncclComm_t) -> Status,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        sys::ncclDataType_t,
        sys::ncclRedOp_t,
        sys::ncclComm_t,
        RawStream,
    ) -> Status,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        sys::ncclDataType_t,
        c_int,
        sys::ncclComm_t,
        RawStream,
    ) -> Status,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        sys::ncclDataType_t,
        sys::ncclComm_t,
        RawStream,
    ) -> Status,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        sys::ncclDataType_t,
        sys::ncclRedOp_t,
        sys::ncclComm_t,
        RawStream,
    ) -> Status,
}

/// Where NCCL may be: `LABS_NCCL_LIBRARY` alone when set; else the loader's search path
/// (`LD_LIBRARY_PATH`, the system's folders), then the folders where Python environments
/// keep the `nvidia-nccl` wheel PyTorch installs (loaded there through PyTorch's own
/// library path, which a Rust program does not have).
fn candidates() -> Vec<PathBuf> {
    if let Some(path) = std::env::var_os(ENV_LIBRARY).filter(|p| !p.is_empty()) {
        return vec![path.into()];
    }
    let mut found: Vec<PathBuf> = vec![LIBRARY.into(), "libnccl.so".into()];
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    for prefix in prefixes {
        found.push(prefix.join("lib").join(LIBRARY));
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                for packages in ["site-packages", "dist-packages"] {
                    found.push(
                        entry
                            .path()
                            .join(packages)
                            .join("nvidia/nccl/lib")
                            .join(LIBRARY),
                    );
                }
            }
        }
    }
    found.push("/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2".into());
    found
}

fn load() -> std::result::Result<Api, String> {
    let tried = candidates();
    let mut first_error = None;
    let mut library = None;
    for path in tried
        .iter()
        .filter(|p| p.components().count() == 1 || p.exists())
    {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(path) } {
            Ok(l) => {
                library = Some(l);
                break;
            }
            Err(e) => {
                // libloading's message is "dlopen failed"; the loader's reason is its source.
                let reason = std::error::Error::source(&e).map(|s| s.to_string());
                first_error.get_or_insert(reason.unwrap_or_else(|| e.to_string()));
            }
        }
    }
    let library = library.ok_or_else(|| {
        format!(
            "NCCL could not be loaded: {LIBRARY} was not found ({}; also looked in {} \
             folders of Python environments). Install NCCL (the libnccl2 package, or the \
             nvidia-nccl-cu12 wheel) and put its folder on LD_LIBRARY_PATH, or set \
             {ENV_LIBRARY} to the library's path",
            first_error.unwrap_or_else(|| "no candidate exists".into()),
            tried.len().saturating_sub(2)
        )
    })?;
    macro_rules! symbol {
        ($name:literal) => {
            // SAFETY: the field's type is the C signature of the NCCL function named.
            *unsafe { library.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("NCCL has no {}: {e}", $name))?
        };
    }
    Ok(Api {
        get_error_string: symbol!("ncclGetErrorString"),
        get_version: symbol!("ncclGetVersion"),
        get_unique_id: symbol!("ncclGetUniqueId"),
        comm_init_rank: symbol!("ncclCommInitRank"),
        comm_init_all: symbol!("ncclCommInitAll"),
        comm_destroy: symbol!("ncclCommDestroy"),
        all_reduce: symbol!("ncclAllReduce"),
        broadcast: symbol!("ncclBroadcast"),
        all_gather: symbol!("ncclAllGather"),
        reduce_scatter: symbol!("ncclReduceScatter"),
        _library: library,
    })
}

// ANCHOR: nccl_probe
/// NCCL, loaded on first use. A missing library is an error naming it and where it
/// was looked for, never a panic.
fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Distributed(e.clone()))
}
// ANCHOR_END: nccl_probe

/// Whether NCCL can be loaded (the error says why not).
pub fn library() -> Result<()> {
    api().map(|_| ())
}

/// NCCL's version as a number (`22703` for 2.27.3).
pub fn version() -> Result<i32> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: writes one int.
    check("ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok(v)
}

/// A fresh unique id (`ncclGetUniqueId`), made by rank 0 and sent to the others.
pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
    let api = api()?;
    // SAFETY: a plain C struct of bytes, written by the call.
    let mut id: sys::ncclUniqueId = unsafe { std::mem::zeroed() };
    check("ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
    Ok(id.internal.map(|c| c as u8))
}

fn check(call: &'static str, status: Status) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    let text = match api() {
        // SAFETY: NCCL returns a static string for every status, known or not.
        Ok(api) => unsafe { CStr::from_ptr((api.get_error_string)(status)) }
            .to_string_lossy()
            .into_owned(),
        Err(_) => String::new(),
    };
    Err(Error::Distributed(format!(
        "{call} failed: {text} (status {status})"
    )))
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

/// NCCL's name for a reduction; all of the contract's have one.
fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Product => sys::ncclRedOp_t::ncclProd,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
    }
}

/// The raw stream behind `stream` (a stream of `device`), with its context made current
/// on this thread: NCCL finds the device through the current context.
fn raw_stream(stream: &Stream, device: DeviceId) -> Result<RawStream> {
    let s = cuda_stream(stream, device)?;
    s.bind()?;
    Ok(s.raw() as RawStream)
}

/// One rank's NCCL communicator, on one GPU; destroyed when dropped.
pub struct NcclComm {
    raw: sys::ncclComm_t,
    device: DeviceId,
    /// NCCL takes one call at a time on a communicator: held across each.
    one_call: std::sync::Mutex<()>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time, which
// `one_call` ensures.
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
        let api = api()?;
        let device = stream.device();
        raw_stream(stream, device)?;
        let unique = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` receives the new communicator.
        check("ncclCommInitRank", unsafe {
            (api.comm_init_rank)(&mut raw, world_size as i32, unique, rank as i32)
        })?;
        Ok(NcclComm {
            raw,
            device,
            one_call: Default::default(),
        })
    }
    // ANCHOR_END: comm_init_rank

    /// One communicator per GPU of this process (`ncclCommInitAll`); rank `i` drives
    /// `ordinals[i]`.
    pub fn init_all(ordinals: &[usize], any_stream: &Stream) -> Result<Vec<NcclComm>> {
        let api = api()?;
        raw_stream(any_stream, any_stream.device())?;
        let list: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut raws = vec![std::ptr::null_mut(); list.len()];
        // SAFETY: `raws` has room for one communicator per listed device.
        check("ncclCommInitAll", unsafe {
            (api.comm_init_all)(raws.as_mut_ptr(), list.len() as i32, list.as_ptr())
        })?;
        Ok(raws
            .into_iter()
            .zip(ordinals)
            .map(|(raw, &o)| NcclComm {
                raw,
                device: DeviceId::Cuda(o),
                one_call: Default::default(),
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
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let _one = self.one_call.lock().unwrap();
        let s = raw_stream(stream, self.device)?;
        // SAFETY: `dist` checked both buffers' sizes against `count` and `dtype`.
        check("ncclAllReduce", unsafe {
            (api()?.all_reduce)(
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
        let _one = self.one_call.lock().unwrap();
        let s = raw_stream(stream, self.device)?;
        // SAFETY: as for `all_reduce`.
        check("ncclBroadcast", unsafe {
            (api()?.broadcast)(
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
        let _one = self.one_call.lock().unwrap();
        let s = raw_stream(stream, self.device)?;
        // SAFETY: `recv` holds `count` elements per rank (checked by `dist`).
        check("ncclAllGather", unsafe {
            (api()?.all_gather)(send as _, recv as _, count, nccl_dtype(dtype), self.raw, s)
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
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let _one = self.one_call.lock().unwrap();
        let s = raw_stream(stream, self.device)?;
        // SAFETY: as for `all_gather`, the other way round.
        check("ncclReduceScatter", unsafe {
            (api()?.reduce_scatter)(
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
        if let Ok(api) = api() {
            let _ = unsafe { (api.comm_destroy)(self.raw) };
        }
    }
}
