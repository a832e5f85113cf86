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
use crate::kernels::{Kernel, MixedBinary, MixedForm, Module, Strided, TILE};

/// A loaded function; raw driver handles are plain pointers valid in any thread.
#[derive(Clone, Copy)]
struct Function(sys::CUfunction);
unsafe impl Send for Function {}

pub(crate) struct ModuleCache {
    ctx: Arc<CudaContext>,
    functions: Mutex<HashMap<&'static str, Function>>,
}

const BLOCK: u32 = 256;

/// The blocks of a 1-D launch of `threads` threads: at most enough to fill every
/// multiprocessor several times; the kernels' grid-stride loops cover the rest.
fn blocks(threads: u64, multiprocessors: u32) -> u32 {
    threads
        .div_ceil(BLOCK as u64)
        .min(multiprocessors as u64 * 32)
        .max(1) as u32
}

/// The block of the tiled transposes: `STRIDED_TILE` x `STRIDED_TILE_ROWS` threads
/// (`kernels/strided.cu`), each thread moving 4 elements of a 32 x 32 tile.
const TILE_BLOCK: (u32, u32, u32) = (TILE as u32, 8, 1);

/// The most blocks along each axis of a tiled launch (the limit of y and z; the
/// kernel's loops cover more).
const MAX_GRID_AXIS: u64 = 65535;

/// How a launch runs: most kernels one way, strided copies and scatters one of three.
#[derive(Debug, PartialEq)]
enum StridedPlan {
    /// Not a strided copy or scatter.
    NotStrided,
    /// The element kernel (`strided_copy_b*`, `strided_scatter_b*`), one thread per
    /// `per_vector` elements: 16 bytes, or 1 where the view cannot move in vectors.
    Vectors { per_vector: u64 },
    /// The tiled transpose (`strided_copy_tiled_b*`, ...) along `dim`, a 2-D grid of
    /// tiles (the last dimension on x, `dim` on y) times the other dimensions (z).
    Tiles { dim: usize, grid: (u32, u32, u32) },
}

/// The kernel and grid of a strided copy or scatter. Views whose last dimension is
/// contiguous, or that have no contiguous dimension at all, run the element kernel,
/// one thread per 16-byte vector when the view and pointers allow (the rule the kernel
/// applies itself, so that no thread goes idle and none loops twice). Transposes (see
/// `Strided::transposed_dim`) run the tiled kernel, a kernel of its own because its
/// blocks are 2-D and its grid counts tiles: element by element, a warp would touch one
/// element per 32-byte sector on the strided side.
fn strided_plan(kernel: &Kernel) -> StridedPlan {
    let (width, src, dst, layout) = match *kernel {
        Kernel::StridedCopy {
            width,
            src,
            dst,
            layout,
            ..
        }
        | Kernel::StridedScatter {
            width,
            src,
            dst,
            layout,
            ..
        } => (width, src, dst, layout),
        _ => return StridedPlan::NotStrided,
    };
    if let Some(dim) = layout.transposed_dim() {
        let last = layout.rank as usize - 1;
        let tiles = |size: u64| size.div_ceil(TILE as u64).min(MAX_GRID_AXIS) as u32;
        let batches = layout.numel() as u64 / (layout.shape[dim] * layout.shape[last]);
        let grid = (
            tiles(layout.shape[last]),
            tiles(layout.shape[dim]),
            batches.clamp(1, MAX_GRID_AXIS) as u32,
        );
        return StridedPlan::Tiles { dim, grid };
    }
    let per_vector = if layout.moves_in_vectors(width, src, dst) {
        (16 / width) as u64
    } else {
        1
    };
    StridedPlan::Vectors { per_vector }
}

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
        Kernel::Arange { out, n, start } => vec![U64(out), U64(n as u64), U64(start as u64)],
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
            U64(s.step),
            F32(s.lr),
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
        if module.name.starts_with("attention_flash") && major < 8 {
            return Err(Error::InvalidArgument(format!(
                "the tensor-core attention kernels need compute capability 8.0 or later \
                 (this GPU has {major}.{minor}); LABS_ATTENTION=chunked avoids them"
            )));
        }
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
        // SAFETY: a NUL-terminated PTX image, loaded into the bound context. Relaxed, so
        // that a kernel first used inside a capture can still be loaded.
        let loaded = super::graphs::relaxed(|| unsafe {
            result::module::load_data(image.as_ptr() as *const c_void)
        })
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

    fn function(&self, kernel: &Kernel, tiled: bool) -> Result<Function> {
        let (module, name) = if tiled {
            kernel.tiled_function()?
        } else {
            kernel.function()?
        };
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
        let mut args = args(kernel);
        let (f, grid, block) = match strided_plan(kernel) {
            StridedPlan::Tiles { dim, grid } => {
                args.push(Arg::U32(dim as u32));
                (self.function(kernel, true)?, grid, TILE_BLOCK)
            }
            StridedPlan::Vectors { per_vector } => {
                let grid = (blocks(n.div_ceil(per_vector), multiprocessors), 1, 1);
                (self.function(kernel, false)?, grid, (BLOCK, 1, 1))
            }
            StridedPlan::NotStrided => {
                // One thread per element, or per 16-byte vector for the dense
                // elementwise kernels (their few tail elements go to the first threads).
                let threads = match *kernel {
                    Kernel::Unary { dtype, .. }
                    | Kernel::Binary { dtype, .. }
                    | Kernel::BinaryRows { dtype, .. } => n.div_ceil((16 / dtype.size()) as u64),
                    Kernel::MixedBinary(ref m) => m.threads() as u64,
                    _ => n,
                };
                let grid = (blocks(threads, multiprocessors), 1, 1);
                (self.function(kernel, false)?, grid, (BLOCK, 1, 1))
            }
        };
        let mut params: Vec<*mut c_void> = args.iter_mut().map(Arg::as_param).collect();
        // SAFETY: the argument list matches the kernel's signature in kernels/*.cu, and
        // the pointers are device memory the caller keeps alive until the work is done.
        unsafe { result::launch_kernel(f.0, grid, block, 0, stream, &mut params) }
            .map_err(|e| Error::driver("cuLaunchKernel", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(width: usize, src: u64, shape: &[usize], strides: &[isize]) -> Kernel {
        let layout = Strided::new(shape, strides).unwrap().coalesced();
        Kernel::StridedCopy {
            width,
            src,
            dst: 0x20000,
            layout,
            n: layout.numel(),
        }
    }

    #[test]
    fn strided_launches_pick_vectors_elements_or_tiles() {
        // Heads gathered from a packed projection: 16-byte vectors.
        let heads = copy(4, 0x10000, &[8, 8, 100, 32], &[76800, 32, 768, 1]);
        assert_eq!(strided_plan(&heads), StridedPlan::Vectors { per_vector: 4 });
        // The same view from an address off 16 bytes: element by element.
        let off = copy(4, 0x10004, &[8, 8, 100, 32], &[76800, 32, 768, 1]);
        assert_eq!(strided_plan(&off), StridedPlan::Vectors { per_vector: 1 });
        // [B, T, D] read as [B, D, T]: tiles of D (y) by T (x), B batches (z).
        let transpose = copy(2, 0x10000, &[3, 64, 100], &[6400, 1, 64]);
        assert_eq!(
            strided_plan(&transpose),
            StridedPlan::Tiles {
                dim: 1,
                grid: (4, 2, 3)
            }
        );
        let scatter = Kernel::StridedScatter {
            width: 8,
            src: 0,
            dst: 0,
            layout: Strided::new(&[40, 33], &[1, 40]).unwrap(),
            n: 40 * 33,
        };
        assert_eq!(
            strided_plan(&scatter),
            StridedPlan::Tiles {
                dim: 0,
                grid: (2, 2, 1)
            }
        );
        assert_eq!(
            strided_plan(&Kernel::scale(0, 1.0, 0, 4)),
            StridedPlan::NotStrided
        );
    }
}
