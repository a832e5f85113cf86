//! Compiles the CUDA C modules of `kernels/` with NVRTC the first time one of their
//! kernels is launched on a device, and keeps them: a compile costs ~180 ms, a cached
//! lookup nothing.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::error::{Error, Result};
use crate::kernels::rows::Param;
use crate::kernels::{Kernel, MixedBinary, MixedForm, Module, Strided};

/// A loaded function; raw driver handles are plain pointers valid in any thread.
#[derive(Clone, Copy)]
struct Function(sys::CUfunction);
unsafe impl Send for Function {}

pub(crate) struct ModuleCache {
    ctx: Arc<CudaContext>,
    functions: Mutex<HashMap<&'static str, Function>>,
}

const BLOCK: u32 = 256;

/// One kernel argument, stored by value so that its address can be handed to
/// `cuLaunchKernel`.
enum Arg {
    U64(u64),
    U32(u32),
    F32(f32),
    /// A struct passed by value; its layout matches the C struct of the kernel.
    Strided(Strided),
}

impl Arg {
    fn as_param(&mut self) -> *mut c_void {
        match self {
            Arg::U64(v) => v as *mut u64 as *mut c_void,
            Arg::U32(v) => v as *mut u32 as *mut c_void,
            Arg::F32(v) => v as *mut f32 as *mut c_void,
            Arg::Strided(v) => v as *mut Strided as *mut c_void,
        }
    }
}

/// The arguments in the order of the kernel's C signature: `DEFINE_UNARY`,
/// `DEFINE_BINARY` and `DEFINE_BINARY_ROWS` in `kernels/elementwise.cu`, then the fixed kernels, then the
/// strided families of `elementwise.cu` and `DEFINE_CAST` of `kernels/cast.cu`.
fn args(kernel: &Kernel) -> Vec<Arg> {
    use Arg::*;
    match *kernel {
        Kernel::Unary {
            x, out, n, alpha, ..
        } => vec![U64(x), U64(out), F32(alpha), U64(n as u64)],
        Kernel::Binary {
            a,
            b,
            out,
            n,
            alpha,
            ..
        } => vec![U64(a), U64(b), U64(out), F32(alpha), U64(n as u64)],
        Kernel::Randn {
            out,
            n,
            seed,
            offset,
        } => vec![U64(out), U64(n as u64), U64(seed), U64(offset)],
        Kernel::Spin { x, n, iterations } => vec![U64(x), U64(n as u64), U32(iterations)],
        Kernel::StridedCopy {
            src,
            dst,
            layout,
            n,
            ..
        }
        | Kernel::StridedScatter {
            src,
            dst,
            layout,
            n,
            ..
        } => vec![U64(src), U64(dst), Strided(layout), U64(n as u64)],
        Kernel::SumRows {
            x,
            out,
            rows,
            cols,
            alpha,
            ..
        } => vec![
            U64(x),
            U64(out),
            F32(alpha),
            U64(rows as u64),
            U64(cols as u64),
        ],
        Kernel::SgdStep(s) => vec![
            U64(s.param),
            U64(s.grad),
            U64(s.momentum_buffer),
            F32(s.lr),
            F32(s.momentum),
            F32(s.dampening),
            F32(s.weight_decay),
            U32(s.nesterov as u32),
            U32(s.first as u32),
            U64(s.n as u64),
        ],
        Kernel::UnscaleGrad(u) => {
            vec![U64(u.grad), U64(u.found_inf), U64(u.scale), U64(u.n as u64)]
        }
        Kernel::UpdateScale(u) => vec![
            U64(u.scale),
            U64(u.growth_tracker),
            U64(u.found_inf),
            F32(u.growth_factor),
            F32(u.backoff_factor),
            U32(u.growth_interval),
        ],
        Kernel::AdamStep(s) => vec![
            U64(s.param),
            U64(s.grad),
            U64(s.exp_avg),
            U64(s.exp_avg_sq),
            F32(s.one_minus_beta1),
            F32(s.beta2),
            F32(s.one_minus_beta2),
            F32(s.step_size),
            F32(s.bias_correction2_sqrt),
            F32(s.eps),
            F32(s.weight_decay),
            F32(s.param_decay),
            U64(s.n as u64),
        ],
        Kernel::BinaryStrided {
            a,
            a_layout,
            b,
            b_layout,
            out,
            n,
            alpha,
            ..
        } => vec![
            U64(a),
            Strided(a_layout),
            U64(b),
            Strided(b_layout),
            U64(out),
            F32(alpha),
            U64(n as u64),
        ],
        Kernel::BinaryRows {
            a,
            b,
            out,
            n,
            cols,
            row_first,
            alpha,
            ..
        } => vec![
            U64(a),
            U64(b),
            U64(out),
            F32(alpha),
            U64(n as u64),
            U64(cols as u64),
            U32(row_first as u32),
        ],
        Kernel::MixedBinary(m) => mixed_args(&m),
        Kernel::Compare {
            a,
            a_layout,
            b,
            b_layout,
            out,
            n,
            ..
        } => vec![
            U64(a),
            Strided(a_layout),
            U64(b),
            Strided(b_layout),
            U64(out),
            U64(n as u64),
        ],
        Kernel::Where {
            cond,
            cond_layout,
            a,
            a_layout,
            b,
            b_layout,
            out,
            n,
            ..
        } => vec![
            U64(cond),
            Strided(cond_layout),
            U64(a),
            Strided(a_layout),
            U64(b),
            Strided(b_layout),
            U64(out),
            U64(n as u64),
        ],
        Kernel::Cast { x, out, n, .. } => vec![U64(x), U64(out), U64(n as u64)],
        Kernel::Rows(ref k) => row_args(k.params()),
        Kernel::Attention(ref k) => row_args(k.params()),
        Kernel::AttentionChunk(ref k) => row_args(k.params()),
        // `function` refuses it before arguments are built: cuBLAS runs it (blas.rs).
        Kernel::Gemm(_) => unreachable!("a gemm is not launched as a module"),
    }
}

/// The arguments of `DEFINE_MIXED`, `DEFINE_MIXED_ROWS` and `DEFINE_MIXED_STRIDED` in
/// `kernels/mixed.cu`.
fn mixed_args(m: &MixedBinary) -> Vec<Arg> {
    use Arg::*;
    let (a, b, out, n) = (U64(m.a), U64(m.b), U64(m.out), U64(m.n as u64));
    match m.form {
        MixedForm::Dense => vec![a, b, out, F32(m.alpha), n],
        MixedForm::Rows { cols, row_first } => vec![
            a,
            b,
            out,
            F32(m.alpha),
            n,
            U64(cols as u64),
            U32(row_first as u32),
        ],
        MixedForm::Strided { a_layout, b_layout } => vec![
            a,
            Strided(a_layout),
            b,
            Strided(b_layout),
            out,
            F32(m.alpha),
            n,
        ],
    }
}

/// Arguments listed as [`Param`]s (the row and attention kernels).
fn row_args(params: Vec<Param>) -> Vec<Arg> {
    params
        .into_iter()
        .map(|p| match p {
            Param::U64(v) => Arg::U64(v),
            Param::U32(v) => Arg::U32(v),
            Param::F32(v) => Arg::F32(v),
        })
        .collect()
}

impl ModuleCache {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        ModuleCache {
            ctx,
            functions: Mutex::new(HashMap::new()),
        }
    }

    fn compile(&self, module: &'static Module) -> Result<HashMap<&'static str, Function>> {
        // SAFETY: only probes for the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::NoDriver(
                "NVRTC (libnvrtc.so) was not found; it compiles the kernels at run time".into(),
            ));
        }
        let (major, minor) = self
            .ctx
            .compute_capability()
            .map_err(|e| Error::driver("cuDeviceGetAttribute", e))?;
        let opts = CompileOptions {
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(&module.source, opts).map_err(|e| Error::Compile {
            module: &module.name,
            log: e.to_string(),
        })?;
        let image = CString::new(ptx.to_src()).map_err(|e| Error::Compile {
            module: &module.name,
            log: e.to_string(),
        })?;
        // SAFETY: a NUL-terminated PTX image, loaded into the bound context.
        let loaded = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            .map_err(|e| Error::driver("cuModuleLoadData", e))?;
        let mut out = HashMap::new();
        for name in &module.functions {
            // SAFETY: the module was just loaded and is never unloaded.
            let f = unsafe {
                result::module::get_function(loaded, CString::new(name.as_str()).unwrap())
            }
            .map_err(|e| Error::driver("cuModuleGetFunction", e))?;
            out.insert(name.as_str(), Function(f));
        }
        Ok(out)
    }

    fn function(&self, kernel: &Kernel) -> Result<Function> {
        let (module, name) = kernel.function()?;
        let mut functions = self.functions.lock().unwrap();
        if !functions.contains_key(name) {
            functions.extend(self.compile(module)?);
        }
        Ok(functions[name])
    }

    pub fn launch(
        &self,
        kernel: &Kernel,
        stream: sys::CUstream,
        multiprocessors: u32,
    ) -> Result<()> {
        let n = kernel.elements() as u64;
        if n == 0 {
            return Ok(());
        }
        let f = self.function(kernel)?;
        // One thread per element, or per 16-byte vector for the dense elementwise
        // kernels (their few tail elements go to the first threads); at most enough
        // blocks to fill every multiprocessor several times: the kernels' grid-stride
        // loops cover the rest.
        let threads = match *kernel {
            Kernel::Unary { dtype, .. }
            | Kernel::Binary { dtype, .. }
            | Kernel::BinaryRows { dtype, .. } => n.div_ceil((16 / dtype.size()) as u64),
            Kernel::MixedBinary(ref m) => m.threads() as u64,
            _ => n,
        };
        let blocks = threads
            .div_ceil(BLOCK as u64)
            .min(multiprocessors as u64 * 32)
            .max(1) as u32;
        let mut args = args(kernel);
        let mut params: Vec<*mut c_void> = args.iter_mut().map(Arg::as_param).collect();
        // SAFETY: the argument list matches the kernel's signature in kernels/*.cu, and
        // the pointers are device memory the caller keeps alive until the work is done.
        unsafe { result::launch_kernel(f.0, (blocks, 1, 1), (BLOCK, 1, 1), 0, stream, &mut params) }
            .map_err(|e| Error::driver("cuLaunchKernel", e))
    }
}
