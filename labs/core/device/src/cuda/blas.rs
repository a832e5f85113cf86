//! Matrix products through cuBLAS (`libcublas`, opened at run time like the driver: a
//! machine without it builds and runs everything else, and its first matmul on `cuda`
//! is an error naming the library).
//!
//! One cuBLAS handle per context, created on the first product and kept. cuBLAS
//! computes column-major; a row-major `C = op(A) @ op(B)` is the column-major
//! `C^T = op(B)^T @ op(A)^T`, so the call passes B before A and swaps `m` and `n`:
//! the same memory, no copy.
//!
//! A product with a bias goes to cuBLASLt instead (`blas/lt.rs`), which adds the bias
//! in the product's epilogue; where cuBLASLt does not take it, cuBLAS runs the product
//! and the caller adds the bias with a broadcast add ([`Gemm::bias_add`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys as blas;
use cudarc::driver::{result, sys, CudaContext};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::Gemm;

mod lt;

/// Products with a bias that ran as cuBLAS and a separate broadcast add, in this
/// process (see [`separate_bias_adds`](super::separate_bias_adds)).
pub(super) static SEPARATE_BIAS_ADDS: AtomicU64 = AtomicU64::new(0);

pub(crate) struct Blas {
    ctx: Arc<CudaContext>,
    handle: Mutex<Option<Handle>>,
}

/// A handle and the workspaces it has been given.
struct Handle {
    raw: blas::cublasHandle_t,
    /// A workspace per stream the handle has run on, by stream handle. Products on two
    /// streams may run at once, so they must not share one (PyTorch keys its cuBLAS
    /// workspaces by stream too). Kept until the context goes, like PyTorch's.
    workspaces: HashMap<u64, Workspace>,
    /// The size of a workspace this handle allocates itself.
    workspace_bytes: usize,
    /// The cuBLASLt handle, made on the first product with a bias.
    lt: Option<cudarc::cublaslt::sys::cublasLtHandle_t>,
}

// SAFETY: the handle is used only under the mutex, with the context bound.
unsafe impl Send for Handle {}

/// One stream's workspace: lent by the device's caching allocator (see
/// [`Blas::lend_workspace`]), or, where none was lent, allocated by the handle and
/// freed with it.
#[derive(Debug, Clone, Copy)]
struct Workspace {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    owned: bool,
}

/// Where cudarc looks for the library, for the error that says it is missing.
fn library_names() -> String {
    cudarc::get_lib_name_candidates("cublas").join(", ")
}

fn cublas_error(call: &'static str, status: blas::cublasStatus_t, g: &Gemm) -> Error {
    Error::Driver {
        call,
        message: format!(
            "{status:?} ({} m={} n={} k={} batch={}, lda={} ldb={} ldc={}, A {}, B {})",
            g.dtype,
            g.m,
            g.n,
            g.k,
            g.batch,
            g.a.ld,
            g.b.ld,
            g.ldc,
            if g.a.transposed {
                "transposed"
            } else {
                "as stored"
            },
            if g.b.transposed {
                "transposed"
            } else {
                "as stored"
            },
        ),
    }
}

fn check(call: &'static str, status: blas::cublasStatus_t, g: &Gemm) -> Result<()> {
    match status {
        blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        e => Err(cublas_error(call, e, g)),
    }
}

impl Blas {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Blas {
            ctx,
            handle: Mutex::new(None),
        }
    }

    /// A new handle in the bound context. Its workspace size is NVIDIA's
    /// recommendation for `cublasSetWorkspace`: 32 MiB on Hopper and later, 4 MiB before.
    fn create(&self) -> Result<Handle> {
        // SAFETY: only probes for the library (cudarc panics on a call without it).
        if !unsafe { blas::is_culib_present() } {
            return Err(Error::NoDriver(format!(
                "the cuBLAS library was not found (searched {}); matrix products on cuda \
                 run through it: install CUDA's cuBLAS, or put the folder holding \
                 libcublas.so (and libcublasLt.so) on LD_LIBRARY_PATH",
                library_names()
            )));
        }
        let mut raw: blas::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is bound (CudaBackend::state).
        let status = unsafe { blas::cublasCreate_v2(&mut raw) };
        if status != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Driver {
                call: "cublasCreate",
                message: format!("{status:?}"),
            });
        }
        // Plain FP32 unless a launch asks for TF32 through its compute type (an
        // environment's NVIDIA_TF32_OVERRIDE=0 can still forbid it).
        // SAFETY: a live handle.
        let status =
            unsafe { blas::cublasSetMathMode(raw, blas::cublasMath_t::CUBLAS_DEFAULT_MATH) };
        if status != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            // SAFETY: created above, destroyed once.
            unsafe { blas::cublasDestroy_v2(raw) };
            return Err(Error::Driver {
                call: "cublasSetMathMode",
                message: format!("{status:?}"),
            });
        }
        let (major, _) = self
            .ctx
            .compute_capability()
            .map_err(|e| Error::driver("cuDeviceGetAttribute", e))?;
        Ok(Handle {
            raw,
            workspaces: HashMap::new(),
            workspace_bytes: crate::backend::gemm_workspace_bytes((major as u32, 0)),
            lt: None,
        })
    }

    /// Makes `bytes` at `ptr` the workspace of the stream with handle `key`, unless it
    /// already has one. The memory is the caller's (a block of the device's caching
    /// allocator, as PyTorch's cuBLAS workspaces are), kept for as long as this handle.
    /// The context must be bound.
    pub fn lend_workspace(&self, key: u64, ptr: sys::CUdeviceptr, bytes: usize) -> Result<()> {
        let mut guard = self.handle.lock().unwrap();
        if guard.is_none() {
            *guard = Some(self.create()?);
        }
        let h = guard.as_mut().expect("just created");
        h.workspaces.entry(key).or_insert(Workspace {
            ptr,
            bytes,
            owned: false,
        });
        Ok(())
    }

    // ANCHOR: cublas_gemm
    /// Enqueues `g` on `stream` (whose [`StreamImpl::handle`] is `key`). The context
    /// must be bound.
    ///
    /// [`StreamImpl::handle`]: crate::backend::StreamImpl::handle
    ///
    /// `Ok(true)` when the product is done, its bias included; `Ok(false)` when it has a
    /// bias that cuBLASLt did not take: cuBLAS ran the product without it, and the
    /// caller launches [`Gemm::bias_add`] after it.
    pub fn gemm(&self, g: &Gemm, stream: sys::CUstream, key: u64) -> Result<bool> {
        g.validate()?;
        if g.is_empty() {
            return Ok(true);
        }
        if g.bias.is_some() {
            if lt::takes(g) {
                let mut guard = self.handle.lock().unwrap();
                if guard.is_none() {
                    *guard = Some(self.create()?);
                }
                let h = guard.as_mut().expect("just created");
                let workspace = h.workspace(key)?;
                let handle = match h.lt {
                    Some(raw) => raw,
                    None => *h.lt.insert(lt::create()?),
                };
                // SAFETY: a live handle in the bound context, the stream's own
                // workspace, and pointers the caller keeps alive (as below).
                let done =
                    unsafe { lt::matmul_bias(handle, g, stream, workspace.ptr, workspace.bytes)? };
                if done {
                    return Ok(true);
                }
            }
            if g.bias_add().is_none() {
                return Err(Error::InvalidArgument(format!(
                    "gemm: cuBLASLt has no algorithm for this product with a bias, and \
                     its output's rows are not dense (ldc = {} for n = {}), so the bias \
                     cannot be added after it",
                    g.ldc, g.n
                )));
            }
            self.gemm(&g.without_bias(), stream, key)?;
            SEPARATE_BIAS_ADDS.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let (data_type, compute) = match g.dtype {
            DType::F32 if g.allow_tf32 => (
                blas::cudaDataType::CUDA_R_32F,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
            DType::F32 => (
                blas::cudaDataType::CUDA_R_32F,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::F16 => (
                blas::cudaDataType::CUDA_R_16F,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::BF16 => (
                blas::cudaDataType::CUDA_R_16BF,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            _ => unreachable!("validate() admits float dtypes only"),
        };
        // The output's type: the inputs', or float32 (validate() admits no other).
        let c_type = if g.c_dtype == g.dtype {
            data_type
        } else {
            blas::cudaDataType::CUDA_R_32F
        };
        let op = |transposed: bool| {
            if transposed {
                blas::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas::cublasOperation_t::CUBLAS_OP_N
            }
        };

        let mut guard = self.handle.lock().unwrap();
        if guard.is_none() {
            *guard = Some(self.create()?);
        }
        let h = guard.as_mut().expect("just created");
        let workspace = h.workspace(key)?;
        // SAFETY: a live handle and a stream of this context.
        check(
            "cublasSetStream",
            unsafe { blas::cublasSetStream_v2(h.raw, stream as blas::cudaStream_t) },
            g,
        )?;
        // Setting the stream puts the handle back on cuBLAS's default workspace pool, so
        // the stream's own workspace is set after it, every time.
        // SAFETY: device memory of `workspace_bytes`, 256-byte aligned (cuMemAlloc's is
        // 512), used only by work on this stream.
        check(
            "cublasSetWorkspace",
            unsafe {
                blas::cublasSetWorkspace_v2(h.raw, workspace.ptr as *mut c_void, workspace.bytes)
            },
            g,
        )?;
        let (alpha, beta) = (g.alpha, g.beta);
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B's memory
        // read column-major is B^T, so B goes first with its own `op`, then A, and the
        // output is n x m with leading dimension ldc. Sizes fit: validate() checked.
        // SAFETY: the pointers are device memory that the caller keeps alive until the
        // stream has run the product, spanning what `Gemm::extents` says; alpha and
        // beta are host scalars read during the call (the default pointer mode).
        let status = unsafe {
            blas::cublasGemmStridedBatchedEx(
                h.raw,
                op(g.b.transposed),
                op(g.a.transposed),
                g.n as i32,
                g.m as i32,
                g.k as i32,
                &alpha as *const f32 as *const c_void,
                g.b.ptr as *const c_void,
                data_type,
                g.b.ld as i32,
                g.b.batch_stride as i64,
                g.a.ptr as *const c_void,
                data_type,
                g.a.ld as i32,
                g.a.batch_stride as i64,
                &beta as *const f32 as *const c_void,
                g.c as *mut c_void,
                c_type,
                g.ldc as i32,
                g.stride_c as i64,
                g.batch as i32,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        check("cublasGemmStridedBatchedEx", status, g)?;
        Ok(true)
    }
    // ANCHOR_END: cublas_gemm
}

impl Handle {
    /// The workspace of the stream with handle `key`, allocated on its first product.
    fn workspace(&mut self, key: u64) -> Result<Workspace> {
        if let Some(&w) = self.workspaces.get(&key) {
            return Ok(w);
        }
        // SAFETY: a plain allocation, owned by this handle.
        let ptr = unsafe { result::malloc_sync(self.workspace_bytes) }
            .map_err(|e| Error::driver("cuMemAlloc (the cuBLAS workspace)", e))?;
        let w = Workspace {
            ptr,
            bytes: self.workspace_bytes,
            owned: true,
        };
        self.workspaces.insert(key, w);
        Ok(w)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let Some(h) = self.handle.get_mut().ok().and_then(Option::take) else {
            return;
        };
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: created by us, destroyed once, after the context's work is done.
        unsafe {
            let _ = result::ctx::synchronize();
            blas::cublasDestroy_v2(h.raw);
            if let Some(raw) = h.lt {
                lt::destroy(raw);
            }
            for w in h.workspaces.values().filter(|w| w.owned) {
                let _ = result::free_sync(w.ptr);
            }
        }
    }
}
