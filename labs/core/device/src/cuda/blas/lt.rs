//! Products with a bias through cuBLASLt (`libcublasLt`, opened at run time like
//! cuBLAS): one `cublasLtMatmul` with `CUBLASLT_EPILOGUE_BIAS`, as PyTorch runs
//! `F.linear` with a bias (its `addmm` through `cublasLtMatmul`).
//!
//! Row-major `C[m, n]` is column-major `Cᵀ[n, m]` (see `blas.rs`): the bias of `n`
//! elements, one per column of our C, is one per *row* of cuBLASLt's column-major D,
//! which is what the BIAS epilogue adds (a vector as long as D's rows).
//!
//! The descriptors are made for each call (a few microseconds on the host) and freed
//! on every path; the workspace is the stream's cuBLAS workspace, which products on
//! one stream may share because they run one after another.

use std::ffi::c_void;

use cudarc::cublaslt::sys as lt;
use cudarc::driver::sys;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::Gemm;

/// The largest `m`, `n` or `k` PyTorch hands to its cuBLASLt epilogue path (larger
/// grids are where cuBLASLt's kernels have had launch bugs); beyond it, and for
/// products with a dimension of 1 (leading-dimension bugs PyTorch also avoids), the
/// caller runs cuBLAS and a separate bias add.
const MAX_LT_DIM: usize = 65535 * 32;

/// Whether cuBLASLt runs this product with its bias (PyTorch's conditions for using
/// it in `addmm`, and a bias aligned for vector loads); if not, cuBLAS and a
/// broadcast add do.
pub(super) fn takes(g: &Gemm) -> bool {
    g.bias.is_some_and(|b| b.is_multiple_of(16))
        && g.batch == 1
        && [g.m, g.n, g.k].iter().all(|&d| d > 1 && d < MAX_LT_DIM)
}

fn lt_error(call: &'static str, status: lt::cublasStatus_t, g: &Gemm) -> Error {
    Error::Driver {
        call,
        message: format!(
            "{status:?} ({} m={} n={} k={}, lda={} ldb={} ldc={}, with a bias)",
            g.dtype, g.m, g.n, g.k, g.a.ld, g.b.ld, g.ldc
        ),
    }
}

fn check(call: &'static str, status: lt::cublasStatus_t, g: &Gemm) -> Result<()> {
    match status {
        lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        e => Err(lt_error(call, e, g)),
    }
}

/// A new cuBLASLt handle, or the error that names the missing library.
pub(super) fn create() -> Result<lt::cublasLtHandle_t> {
    // SAFETY: only probes for the library (cudarc panics on a call without it).
    if !unsafe { lt::is_culib_present() } {
        return Err(Error::NoDriver(format!(
            "the cuBLASLt library was not found (searched {}); matrix products with a \
             bias on cuda run through it: put the folder holding libcublasLt.so on \
             LD_LIBRARY_PATH",
            cudarc::get_lib_name_candidates("cublasLt").join(", ")
        )));
    }
    let mut raw: lt::cublasLtHandle_t = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context is bound.
    let status = unsafe { lt::cublasLtCreate(&mut raw) };
    if status != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(Error::Driver {
            call: "cublasLtCreate",
            message: format!("{status:?}"),
        });
    }
    Ok(raw)
}

/// Destroys a handle from [`create`].
///
/// # Safety
/// `raw` came from [`create`] and is destroyed once, after its work is done.
pub(super) unsafe fn destroy(raw: lt::cublasLtHandle_t) {
    lt::cublasLtDestroy(raw);
}

/// The descriptors of one call, destroyed when it returns.
struct Descriptors {
    desc: lt::cublasLtMatmulDesc_t,
    layouts: Vec<lt::cublasLtMatrixLayout_t>,
    pref: lt::cublasLtMatmulPreference_t,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each was created once by this call and is destroyed once.
        unsafe {
            if !self.pref.is_null() {
                lt::cublasLtMatmulPreferenceDestroy(self.pref);
            }
            for &l in &self.layouts {
                lt::cublasLtMatrixLayoutDestroy(l);
            }
            if !self.desc.is_null() {
                lt::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// The largest power of two, up to 256, that divides `ptr`: what the heuristic is told
/// of each matrix's alignment (it assumes 256 bytes otherwise, and a view that starts
/// inside its storage is less aligned), as PyTorch does.
fn alignment(ptr: u64) -> u32 {
    let mut a = 256u32;
    while a > 1 && !ptr.is_multiple_of(a as u64) {
        a /= 2;
    }
    a
}

fn data_type(dtype: DType) -> lt::cudaDataType {
    match dtype {
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::BF16 => lt::cudaDataType::CUDA_R_16BF,
        _ => lt::cudaDataType::CUDA_R_32F,
    }
}

/// Enqueues `g` (which [`takes`]) on `stream`: `Ok(false)` when cuBLASLt has no
/// algorithm for it (the caller then runs cuBLAS and a broadcast add).
///
/// # Safety
/// `handle` is live, the context bound, `workspace` device memory of `workspace_bytes`
/// used only by work on `stream`; the pointers of `g` are device memory kept alive
/// until the stream has run the product.
pub(super) unsafe fn matmul_bias(
    handle: lt::cublasLtHandle_t,
    g: &Gemm,
    stream: sys::CUstream,
    workspace: sys::CUdeviceptr,
    workspace_bytes: usize,
) -> Result<bool> {
    let bias = g.bias.expect("takes() admits products with a bias");
    let compute = if g.dtype == DType::F32 && g.allow_tf32 {
        lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        lt::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let (ab_type, c_type) = (data_type(g.dtype), data_type(g.c_dtype));
    let mut d = Descriptors {
        desc: std::ptr::null_mut(),
        layouts: Vec::new(),
        pref: std::ptr::null_mut(),
    };
    check(
        "cublasLtMatmulDescCreate",
        lt::cublasLtMatmulDescCreate(&mut d.desc, compute, lt::cudaDataType::CUDA_R_32F),
        g,
    )?;
    let set_desc = |attr, value: *const c_void, size: usize| {
        check(
            "cublasLtMatmulDescSetAttribute",
            lt::cublasLtMatmulDescSetAttribute(d.desc, attr, value, size),
            g,
        )
    };
    use lt::cublasLtMatmulDescAttributes_t as Attr;
    // As in blas.rs: cuBLASLt's A is our B and its B our A, each with its own `op`
    // (0 = CUBLAS_OP_N, 1 = CUBLAS_OP_T).
    let (trans_a, trans_b) = (g.b.transposed as i32, g.a.transposed as i32);
    set_desc(
        Attr::CUBLASLT_MATMUL_DESC_TRANSA,
        &trans_a as *const i32 as _,
        4,
    )?;
    set_desc(
        Attr::CUBLASLT_MATMUL_DESC_TRANSB,
        &trans_b as *const i32 as _,
        4,
    )?;
    let epilogue = lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
    set_desc(
        Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
        &epilogue as *const lt::cublasLtEpilogue_t as _,
        std::mem::size_of::<lt::cublasLtEpilogue_t>(),
    )?;
    set_desc(
        Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        &bias as *const u64 as _,
        std::mem::size_of::<u64>(),
    )?;
    // The bias is in the output's dtype, as `Gemm` says: D's type, cuBLASLt's default,
    // set all the same so that a float32 output of half inputs is not left to it.
    let bias_type = c_type as i32;
    set_desc(
        Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
        &bias_type as *const i32 as _,
        4,
    )?;

    // Column-major layouts of the matrices as stored: cuBLASLt's A (our B) is
    // `n x k` as used, stored `k x n` when transposed; its B (our A) `k x m`, stored
    // `m x k` when transposed; C and D are `n x m` with leading dimension ldc.
    let (n, m, k) = (g.n as u64, g.m as u64, g.k as u64);
    let (a_rows, a_cols) = if g.b.transposed { (k, n) } else { (n, k) };
    let (b_rows, b_cols) = if g.a.transposed { (m, k) } else { (k, m) };
    for (ty, rows, cols, ld) in [
        (ab_type, a_rows, a_cols, g.b.ld),
        (ab_type, b_rows, b_cols, g.a.ld),
        (c_type, n, m, g.ldc),
    ] {
        let mut l: lt::cublasLtMatrixLayout_t = std::ptr::null_mut();
        check(
            "cublasLtMatrixLayoutCreate",
            lt::cublasLtMatrixLayoutCreate(&mut l, ty, rows, cols, ld as i64),
            g,
        )?;
        d.layouts.push(l);
    }
    let (a_layout, b_layout, c_layout) = (d.layouts[0], d.layouts[1], d.layouts[2]);

    check(
        "cublasLtMatmulPreferenceCreate",
        lt::cublasLtMatmulPreferenceCreate(&mut d.pref),
        g,
    )?;
    use lt::cublasLtMatmulPreferenceAttributes_t as Pref;
    let set_pref = |attr, value: *const c_void, size: usize| {
        check(
            "cublasLtMatmulPreferenceSetAttribute",
            lt::cublasLtMatmulPreferenceSetAttribute(d.pref, attr, value, size),
            g,
        )
    };
    let max_workspace = workspace_bytes as u64;
    set_pref(
        Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &max_workspace as *const u64 as _,
        8,
    )?;
    let aligns = [
        (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.b.ptr),
        (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.a.ptr),
        (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.c),
        (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c),
    ];
    for (attr, ptr) in aligns {
        let a = alignment(ptr);
        set_pref(attr, &a as *const u32 as _, 4)?;
    }

    let mut heuristic: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
    let mut found = 0i32;
    let status = lt::cublasLtMatmulAlgoGetHeuristic(
        handle,
        d.desc,
        a_layout,
        b_layout,
        c_layout,
        c_layout,
        d.pref,
        1,
        &mut heuristic,
        &mut found,
    );
    // No algorithm for this combination (of types, layouts, alignments): the caller's
    // cuBLAS and broadcast add compute the same thing in two launches.
    if matches!(
        status,
        lt::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
            | lt::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE
    ) || (status == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS && found == 0)
    {
        return Ok(false);
    }
    check("cublasLtMatmulAlgoGetHeuristic", status, g)?;

    let (alpha, beta) = (g.alpha, g.beta);
    // SAFETY (the caller's): device pointers spanning `Gemm::extents` and the bias's
    // `n` elements; alpha and beta host scalars (the default pointer mode).
    let status = lt::cublasLtMatmul(
        handle,
        d.desc,
        &alpha as *const f32 as *const c_void,
        g.b.ptr as *const c_void,
        a_layout,
        g.a.ptr as *const c_void,
        b_layout,
        &beta as *const f32 as *const c_void,
        g.c as *const c_void,
        c_layout,
        g.c as *mut c_void,
        c_layout,
        &heuristic.algo,
        workspace as *mut c_void,
        workspace_bytes,
        stream as lt::cudaStream_t,
    );
    check("cublasLtMatmul", status, g)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_the_largest_power_of_two_dividing_the_address_up_to_256() {
        assert_eq!(alignment(0x1000), 256);
        assert_eq!(alignment(0x1000 + 2), 2);
        assert_eq!(alignment(0x1000 + 48), 16);
        assert_eq!(alignment(0x1001), 1);
    }

    #[test]
    fn cublaslt_takes_single_products_with_a_bias_and_no_dimension_of_one() {
        let mut g = Gemm::dense(DType::BF16, 8, 16, 4, [0x100, 0x200, 0x300]);
        assert!(!takes(&g), "no bias");
        g.bias = Some(0x400);
        assert!(takes(&g));
        assert!(!takes(&Gemm { m: 1, ..g }));
        assert!(!takes(&Gemm { batch: 2, ..g }));
        assert!(!takes(&Gemm { n: MAX_LT_DIM, ..g }));
    }
}
