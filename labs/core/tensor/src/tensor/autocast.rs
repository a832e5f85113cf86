//! Automatic mixed precision (`torch.autocast(device_type="cuda", dtype=...)`): inside
//! an [`autocast`] region, the ops that tensor cores speed up run in half precision and
//! the ops whose accuracy needs range or many small terms run in float32, whatever
//! dtype their inputs arrive in. The lists are PyTorch's CUDA lists
//! (`aten/src/ATen/autocast_mode.cpp`), restricted to the ops this runtime has:
//!
//! - [`CastPolicy::LowerPrecision`] ops run in the region's dtype (`matmul`, `linear`;
//!   attention is made of them here, so its products run in half precision and its
//!   softmax in float32);
//! - [`CastPolicy::Fp32`] ops run in float32 (`layer_norm`, the losses, `exp`, `log`,
//!   `rsqrt`, `pow`);
//! - [`CastPolicy::Fp32SetOptDtype`] ops run in float32 through their `dtype` argument
//!   (`softmax`, `log_softmax`, `sum`): softmax and log_softmax read a half-precision
//!   input as it is and write float32, with no float32 copy of the input, and their
//!   backward writes the gradient in the input's dtype (`sum` casts its input);
//! - every other op runs in the dtype of its inputs, and binary ops on mixed inputs
//!   promote to the widest (type promotion does that already, region or not; two float
//!   dtypes are read each in its own by one kernel, with no cast: `mixed.rs`).
//!
//! An op consults the region in one place, [`autocast_args`], with its class, declared
//! beside the op: the function returns its inputs cast as the class says, or `None`
//! outside a region. Only out-of-place ops call it; in-place ops write their own dtype.
//!
//! As in PyTorch, half-precision copies of float32 leaves that require grad (the
//! weights) are cached until the outermost region exits, so a weight used by several
//! ops of one forward pass is cast once; the cache's memory is counted as
//! [`Category::AutocastCache`]. The graph keeps a cached copy alive after the region
//! when an op saved it for backward, and it stays in that category until then.
//! Backward runs as on PyTorch's backward threads, with no region open: a checkpointed
//! layer recomputed there opens the outermost region, whose casts go when it ends.

use std::cell::{Cell, RefCell};

use super::promote::is_floating_point;
use super::{DType, Tensor};
use crate::alloc::Category;
use crate::error::{Error, Result};

// ANCHOR: cast_lists
/// What an op's inputs become inside a region: the op's autocast class, after
/// PyTorch's CUDA lists. Each op declares its class beside itself (an [`AutocastOp`]
/// constant, or for the elementwise ops an exhaustive match over their enum), so an op
/// cannot consult autocast without naming one, and a misspelt class does not compile:
///
/// - `LowerPrecision`: `matmul`, `linear` (PyTorch's `lower_precision_fp` list: `mm`,
///   `matmul`, `linear`, `bmm`, `addmm`, `scaled_dot_product_attention`, ...);
/// - `Fp32`: `layer_norm`, `nll_loss`, `mse_loss`, `exp`, `log`, `rsqrt`, `pow`,
///   `pow_scalar` (PyTorch's `fp32` list);
/// - `Fp32SetOptDtype`: `softmax`, `log_softmax`, `sum` (PyTorch's
///   `fp32_set_opt_dtype` list: `softmax(x, dim)` runs as `softmax(x, dim,
///   dtype=float32)`, which on CUDA reads half and writes float; `sum` has no dtype
///   argument here: it casts its input);
/// - `Promote`: `cat` (and `stack`, which joins through it); the binary ops promote
///   anyway, region or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CastPolicy {
    /// Floating-point inputs are cast to the region's dtype.
    LowerPrecision,
    /// Half-precision inputs are cast to float32.
    Fp32,
    /// The op's output dtype is float32 unless the caller gave one; the op reads its
    /// half-precision input as it is where it has a kernel for that.
    Fp32SetOptDtype,
    /// Floating-point inputs are cast to the widest of their dtypes.
    Promote,
    /// Inputs are used as they are.
    Unchanged,
}

/// An op that is not one entry of the elementwise families, with its autocast class:
/// declared as a constant beside the op, which passes it to `autocast_args`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutocastOp {
    pub name: &'static str,
    pub policy: CastPolicy,
}

/// The named ops' declarations, for looking an op's class up by name
/// ([`cast_policy`]); each entry is the constant the op itself uses.
const NAMED_OPS: &[AutocastOp] = &[
    super::matmul::MATMUL,
    super::matmul::LINEAR,
    super::norm::LAYER_NORM,
    super::loss::NLL_LOSS,
    super::loss::MSE_LOSS,
    super::softmax::SOFTMAX,
    super::softmax::LOG_SOFTMAX,
    super::reduce::SUM,
    super::concat::CAT,
];
// ANCHOR_END: cast_lists

/// The class of the op named `op` (a kernel's or a method's name), read from the op's
/// own declaration; `Unchanged` for a name no op declares.
pub fn cast_policy(op: &str) -> CastPolicy {
    let named = NAMED_OPS.iter().find(|o| o.name == op).map(|o| o.policy);
    let unary = || {
        (crate::kernels::UnaryOp::ALL.iter())
            .find(|o| o.name() == op)
            .map(|&o| super::ops::unary_autocast(o))
    };
    let binary = || {
        (crate::kernels::BinaryOp::ALL.iter())
            .find(|o| o.name() == op)
            .map(|&o| super::ops::binary_autocast(o))
    };
    named
        .or_else(unary)
        .or_else(binary)
        .unwrap_or(CastPolicy::Unchanged)
}

/// The names of the ops of class `policy`, named ops first, then the elementwise ones
/// in declaration order (what PyTorch's lists hold, restricted to this runtime's ops).
pub fn ops_with(policy: CastPolicy) -> Vec<&'static str> {
    let named = NAMED_OPS
        .iter()
        .filter(|o| o.policy == policy)
        .map(|o| o.name);
    let unary = (crate::kernels::UnaryOp::ALL.iter())
        .filter(|&&o| super::ops::unary_autocast(o) == policy)
        .map(|o| o.name());
    let binary = (crate::kernels::BinaryOp::ALL.iter())
        .filter(|&&o| super::ops::binary_autocast(o) == policy)
        .map(|o| o.name());
    named.chain(unary).chain(binary).collect()
}

thread_local! {
    /// The dtype of the innermost region, `None` outside or in a disabled one.
    static DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
    /// How many regions (enabled or not) are open: the cache is cleared when it
    /// returns to 0, as `torch.autocast.__exit__` does.
    static NESTING: Cell<usize> = const { Cell::new(0) };
    /// `(source, dtype, cast)`: the source is kept alive, so its storage cannot be
    /// reused by another tensor that would then hit in the cache.
    static CACHE: RefCell<Vec<(Tensor, DType, Tensor)>> = const { RefCell::new(Vec::new()) };
}

/// The autocast state of a fresh thread, as PyTorch's backward threads have it: no
/// region open and an empty cache, until dropped, when the thread's own are restored.
/// Backward runs under it, so that a checkpoint's recomputation opens the outermost
/// region and its casts go when it ends, not when backward does.
pub(crate) struct EngineAutocast {
    dtype: Option<DType>,
    nesting: usize,
    cache: Vec<(Tensor, DType, Tensor)>,
}

/// Enters [`EngineAutocast`].
pub(crate) fn engine_autocast() -> EngineAutocast {
    EngineAutocast {
        dtype: DTYPE.with(|d| d.replace(None)),
        nesting: NESTING.with(|n| n.replace(0)),
        cache: CACHE.with(|c| std::mem::take(&mut *c.borrow_mut())),
    }
}

impl Drop for EngineAutocast {
    fn drop(&mut self) {
        clear_autocast_cache();
        DTYPE.with(|d| d.set(self.dtype));
        NESTING.with(|n| n.set(self.nesting));
        let cache = std::mem::take(&mut self.cache);
        CACHE.with(|c| *c.borrow_mut() = cache);
    }
}

/// An open region; closing it (dropping the guard) restores the enclosing one.
#[must_use = "autocast applies only while the guard is alive"]
pub struct AutocastGuard {
    previous: Option<DType>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        DTYPE.with(|d| d.set(self.previous));
        let left = NESTING.with(|n| {
            let left = n.get().saturating_sub(1);
            n.set(left);
            left
        });
        if left == 0 {
            clear_autocast_cache();
        }
    }
}

fn open(dtype: Option<DType>) -> AutocastGuard {
    NESTING.with(|n| n.set(n.get() + 1));
    AutocastGuard {
        previous: DTYPE.with(|d| d.replace(dtype)),
    }
}

// ANCHOR: autocast_guard
/// Runs the thread's ops under autocast to `dtype` (`float16` or `bfloat16`, the CUDA
/// autocast dtypes) until the guard drops (`with torch.autocast("cuda", dtype):`).
/// Regions nest; the innermost decides.
pub fn autocast(dtype: DType) -> Result<AutocastGuard> {
    match dtype {
        DType::F16 | DType::BF16 => Ok(open(Some(dtype))),
        other => Err(Error::InvalidArgument(format!(
            "autocast: the CUDA autocast dtype must be float16 or bfloat16, got {other}"
        ))),
    }
}

/// Turns autocast off until the guard drops (`torch.autocast("cuda", enabled=False)`
/// inside a region): ops run in their inputs' dtypes again.
pub fn autocast_disabled() -> AutocastGuard {
    open(None)
}
// ANCHOR_END: autocast_guard

/// The dtype ops are autocast to on this thread now, if a region is enabled
/// (`torch.get_autocast_dtype` when `torch.is_autocast_enabled()`).
pub fn autocast_dtype() -> Option<DType> {
    DTYPE.with(Cell::get)
}

/// Drops the cached casts (`torch.clear_autocast_cache()`); closing the outermost
/// region does it.
pub fn clear_autocast_cache() {
    // Taken out first: dropping tensors frees memory, which must not happen while the
    // cache is borrowed.
    let cached = CACHE.with(|c| std::mem::take(&mut *c.borrow_mut()));
    drop(cached);
}

/// How many casts the cache holds now.
pub fn autocast_cache_len() -> usize {
    CACHE.with(|c| c.borrow().len())
}

/// `t` cast to `dtype`, through the cache when `t` is a float32 leaf that requires
/// grad (PyTorch's `cached_cast`: only weights are worth keeping for the region).
fn cast(t: &Tensor, dtype: DType) -> Result<Tensor> {
    let cacheable = t.dtype() == DType::F32 && t.is_leaf() && t.requires_grad();
    if !cacheable {
        return t.to_dtype(dtype);
    }
    let hit = CACHE.with(|c| {
        c.borrow()
            .iter()
            .find(|(src, d, _)| *d == dtype && src.shares_storage(t) && src.layout() == t.layout())
            .map(|(_, _, cast)| cast.clone())
    });
    if let Some(cast) = hit {
        return Ok(cast);
    }
    let cast = {
        let _cache = Category::AutocastCache.scope();
        t.to_dtype(dtype)?
    };
    CACHE.with(|c| c.borrow_mut().push((t.clone(), dtype, cast.clone())));
    Ok(cast)
}

/// The output dtype the current region sets for op `op` called without one: float32
/// for the `fp32_set_opt_dtype` ops in an enabled region (PyTorch's `set_opt_dtype`),
/// `None` otherwise. Ops that take a dtype consult this instead of [`autocast_args`].
pub(crate) fn autocast_opt_dtype(op: AutocastOp) -> Option<DType> {
    autocast_dtype()?;
    (op.policy == CastPolicy::Fp32SetOptDtype).then_some(DType::F32)
}

// ANCHOR: autocast_args
/// The inputs of an op of class `policy` as the current region wants them: `None`
/// outside a region or when the class changes nothing, else every input, cast where
/// the class says (integer inputs, indices, are never cast). The one place ops consult
/// autocast.
pub(crate) fn autocast_args(policy: CastPolicy, inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let Some(region) = autocast_dtype() else {
        return Ok(None);
    };
    let target = match policy {
        CastPolicy::Unchanged => return Ok(None),
        CastPolicy::LowerPrecision => region,
        // An op with a dtype argument asks `autocast_opt_dtype` first; one without
        // (sum) has its input cast.
        CastPolicy::Fp32 | CastPolicy::Fp32SetOptDtype => DType::F32,
        CastPolicy::Promote => {
            let floats = inputs
                .iter()
                .map(|t| t.dtype())
                .filter(|&d| is_floating_point(d));
            match floats.reduce(super::promote_types) {
                Some(widest) => widest,
                None => return Ok(None),
            }
        }
    };
    let needs_cast = |t: &&Tensor| is_floating_point(t.dtype()) && t.dtype() != target;
    if !inputs.iter().any(needs_cast) {
        return Ok(None);
    }
    inputs
        .iter()
        .map(|t| {
            if needs_cast(t) {
                cast(t, target)
            } else {
                Ok((*t).clone())
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
// ANCHOR_END: autocast_args
