//! CPU twins of the CUDA kernels, run by the simulated GPU and the host device. They
//! reach device memory through [`HostAccess`], which the memory implements, so this
//! module knows nothing of the simulator. Like GPU kernels, their arguments may alias
//! (an in-place `scale` reads and writes the same buffer), so elements are read and
//! written through raw pointers, one element at a time.

use std::marker::PhantomData;

use half::{bf16, f16};

use super::gemm_cpu::gemm;
pub use super::gemm_cpu::round_to_tf32;
use super::{optim_cpu, Kernel, Strided};
use crate::device_id::DevicePtr;
use crate::dtype::DType;
use crate::dtype::FillPattern;
use crate::error::{Error, Result};

/// Host pointers to ranges of device memory, as a kernel's twin needs them.
pub trait HostAccess {
    /// Calls `f` with one host pointer per `(address, bytes)` range, each valid for its
    /// length during the call; an error if a range is not inside live memory.
    fn with_host_ptrs(
        &self,
        ranges: &[(DevicePtr, usize)],
        f: &mut dyn FnMut(&[*mut u8]),
    ) -> Result<()>;
}

/// Runs the twin of `kernel` on `memory`.
pub fn run(kernel: &Kernel, memory: &dyn HostAccess) -> Result<()> {
    match *kernel {
        Kernel::Unary {
            op,
            dtype,
            x,
            out,
            n,
            alpha,
        } => by_dtype!(dtype,
            F => { let f = op.cpu(); unary::<F>([x, out], n, |v| f(v, alpha), memory) },
            I => { let f = int_twin(op.int_cpu(), op.name(), dtype)?;
                   unary::<I>([x, out], n, |v| f(v, alpha), memory) }),
        Kernel::Binary {
            op,
            dtype,
            a,
            b,
            out,
            n,
            alpha,
        } => by_dtype!(dtype,
            F => { let f = op.cpu(); binary::<F>([a, b, out], n, |x, y| f(x, y, alpha), memory) },
            I => { let f = int_twin(op.int_cpu(), op.name(), dtype)?;
                   binary::<I>([a, b, out], n, |x, y| f(x, y, alpha), memory) }),
        Kernel::BinaryStrided {
            op,
            dtype,
            a,
            a_layout,
            b,
            b_layout,
            out,
            n,
            alpha,
        } => {
            let inputs = [(a, a_layout), (b, b_layout)];
            by_dtype!(dtype,
                F => { let f = op.cpu();
                       binary_strided::<F, F>(inputs, out, n, |x, y| F::from_math(f(x, y, alpha)), memory) },
                I => { let f = int_twin(op.int_cpu(), op.name(), dtype)?;
                       binary_strided::<I, I>(inputs, out, n, |x, y| I::from_math(f(x, y, alpha)), memory) })
        }
        Kernel::BinaryRows {
            op,
            dtype,
            a,
            b,
            out,
            n,
            cols,
            row_first,
            alpha,
        } => {
            let shape = (n, cols, row_first);
            by_dtype!(dtype,
                F => { let f = op.cpu(); binary_rows::<F>([a, b, out], shape, |x, y| f(x, y, alpha), memory) },
                I => { let f = int_twin(op.int_cpu(), op.name(), dtype)?;
                       binary_rows::<I>([a, b, out], shape, |x, y| f(x, y, alpha), memory) })
        }
        Kernel::MixedBinary(ref m) => super::mixed_cpu::run(m, memory),
        Kernel::Compare {
            op,
            dtype,
            a,
            a_layout,
            b,
            b_layout,
            out,
            n,
        } => {
            let inputs = [(a, a_layout), (b, b_layout)];
            let mask = |x: Option<std::cmp::Ordering>| u8::from(op.holds(x));
            by_dtype!(dtype,
                F => binary_strided::<F, u8>(inputs, out, n, |x, y| mask(x.partial_cmp(&y)), memory),
                I => binary_strided::<I, u8>(inputs, out, n, |x, y| mask(x.partial_cmp(&y)), memory))
        }
        Kernel::Where {
            dtype,
            cond,
            cond_layout,
            a,
            a_layout,
            b,
            b_layout,
            out,
            n,
        } => {
            let operands = [(cond, cond_layout), (a, a_layout), (b, b_layout)];
            match dtype.size() {
                1 => select::<u8>(operands, out, n, memory),
                2 => select::<u16>(operands, out, n, memory),
                4 => select::<u32>(operands, out, n, memory),
                _ => select::<u64>(operands, out, n, memory),
            }
        }
        Kernel::Cast {
            from,
            to,
            x,
            out,
            n,
        } => by_dtype!(from,
            F => cast_from::<F>(to, [x, out], n, memory),
            I => cast_from::<I>(to, [x, out], n, memory)),
        Kernel::Randn {
            out,
            n,
            seed,
            offset,
        } => access(memory, &[(out, n * 4)], |p| {
            // SAFETY (every `Raw::new` here): `p[k]` is valid for the k-th range asked.
            let out = unsafe { Raw::<f32>::new(p[0], n) };
            for i in 0..n {
                out.set(i, randn(seed, offset + i as u64));
            }
        }),
        Kernel::Arange { out, n, start } => access(memory, &[(out, n * 8)], |p| {
            // SAFETY: `p[0]` is valid for the n int64 elements asked.
            let out = unsafe { Raw::<i64>::new(p[0], n) };
            for i in 0..n {
                out.set(i, start.wrapping_add(i as i64));
            }
        }),
        Kernel::Spin { x, n, iterations } => access(memory, &[(x, n * 4)], |p| {
            let x = unsafe { Raw::<f32>::new(p[0], n) };
            for i in 0..n {
                x.set(i, spin(x.get(i), iterations));
            }
        }),
        Kernel::StridedCopy {
            width,
            src,
            dst,
            layout,
            n,
        } => match width {
            1 => strided_copy::<u8>(src, dst, &layout, n, memory),
            2 => strided_copy::<u16>(src, dst, &layout, n, memory),
            4 => strided_copy::<u32>(src, dst, &layout, n, memory),
            8 => strided_copy::<u64>(src, dst, &layout, n, memory),
            _ => Err(Error::InvalidArgument(format!(
                "no strided copy for {width}-byte elements"
            ))),
        },
        Kernel::SumRows {
            dtype,
            x,
            out,
            rows,
            cols,
            alpha,
        } => match float(dtype, "sum")? {
            Float::F32 => sum_rows::<f32>([x, out], rows, cols, alpha, memory),
            Float::F16 => sum_rows::<f16>([x, out], rows, cols, alpha, memory),
            Float::BF16 => sum_rows::<bf16>([x, out], rows, cols, alpha, memory),
        },
        Kernel::SgdStep(s) => match float(s.dtype, "sgd_step")? {
            Float::F32 => optim_cpu::sgd::<f32>(&s, memory),
            Float::F16 => optim_cpu::sgd::<f16>(&s, memory),
            Float::BF16 => optim_cpu::sgd::<bf16>(&s, memory),
        },
        Kernel::AdamStep(s) => match float(s.dtype, "adam_step")? {
            Float::F32 => optim_cpu::adam::<f32>(&s, memory),
            Float::F16 => optim_cpu::adam::<f16>(&s, memory),
            Float::BF16 => optim_cpu::adam::<bf16>(&s, memory),
        },
        Kernel::UnscaleGrad(u) => match float(u.dtype, "non_finite_check_and_unscale")? {
            Float::F32 => super::amp_cpu::unscale::<f32>(&u, memory),
            Float::F16 => super::amp_cpu::unscale::<f16>(&u, memory),
            Float::BF16 => super::amp_cpu::unscale::<bf16>(&u, memory),
        },
        Kernel::UpdateScale(u) => super::amp_cpu::update_scale(&u, memory),
        Kernel::StridedScatter {
            width,
            src,
            dst,
            layout,
            n,
        } => super::cpu_rows::strided_scatter(width, src, dst, &layout, n, memory),
        Kernel::Rows(ref k) => super::cpu_rows::run(k, memory),
        Kernel::Attention(ref k) => super::attention_cpu::run(k, memory),
        Kernel::AttentionChunk(ref k) => super::attention_chunk_cpu::run(k, memory),
        Kernel::Gemm(g) => {
            g.validate()?;
            let wide = g.c_dtype != g.dtype;
            match float(g.dtype, "gemm")? {
                Float::F32 => gemm::<f32, f32>(&g, g.allow_tf32, memory),
                Float::F16 if wide => gemm::<f16, f32>(&g, false, memory),
                Float::F16 => gemm::<f16, f16>(&g, false, memory),
                Float::BF16 if wide => gemm::<bf16, f32>(&g, false, memory),
                Float::BF16 => gemm::<bf16, bf16>(&g, false, memory),
            }
        }
    }
}

/// Row sums accumulated in `f32`, as the GPU kernel does (its order of additions differs:
/// the results agree to rounding, not bit for bit).
fn sum_rows<E: FloatElement>(
    [x, out]: [DevicePtr; 2],
    rows: usize,
    cols: usize,
    alpha: f32,
    memory: &dyn HostAccess,
) -> Result<()> {
    let size = std::mem::size_of::<E>();
    access(
        memory,
        &[(x, rows * cols * size), (out, rows * size)],
        |p| {
            // SAFETY: each pointer is valid for the range asked for it.
            let (x, out) = unsafe { (Raw::<E>::new(p[0], rows * cols), Raw::<E>::new(p[1], rows)) };
            for r in 0..rows {
                let acc: f32 = (0..cols).map(|c| x.get(r * cols + c).widen()).sum();
                out.set(r, E::narrow(alpha * acc));
            }
        },
    )
}

/// `len` elements of `E` at a host pointer that may be unaligned and may alias
/// another view of the same launch.
pub(super) struct Raw<E> {
    ptr: *mut u8,
    len: usize,
    _element: PhantomData<E>,
}

impl<E: Copy> Raw<E> {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` elements while the view is
    /// used: a pointer [`HostAccess`] gave for a range of `len` elements, used inside
    /// its call.
    pub(super) unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Raw {
            ptr,
            len,
            _element: PhantomData,
        }
    }
    pub(super) fn get(&self, i: usize) -> E {
        assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: `i < len`, and `new`'s contract makes `len` elements valid.
        unsafe { (self.ptr as *const E).add(i).read_unaligned() }
    }
    pub(super) fn set(&self, i: usize, v: E) {
        assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: as in `get`.
        unsafe { (self.ptr as *mut E).add(i).write_unaligned(v) }
    }
}

pub(super) fn access(
    memory: &dyn HostAccess,
    ranges: &[(DevicePtr, usize)],
    mut f: impl FnMut(&[*mut u8]),
) -> Result<()> {
    memory.with_host_ptrs(ranges, &mut f)
}

/// A float element type the elementwise kernels compute on: widened to `f32` for the
/// op, rounded back to nearest even after, as the GPU kernels do.
pub(super) trait FloatElement: Copy {
    fn widen(self) -> f32;
    fn narrow(v: f32) -> Self;
}
impl FloatElement for f32 {
    fn widen(self) -> f32 {
        self
    }
    fn narrow(v: f32) -> Self {
        v
    }
}
impl FloatElement for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FloatElement for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

pub(super) enum Float {
    F32,
    F16,
    BF16,
}

/// The float type of `dtype`; other dtypes are the error the GPU's lookup gives too.
pub(super) fn float(dtype: DType, op: &str) -> Result<Float> {
    match dtype {
        DType::F32 => Ok(Float::F32),
        DType::F16 => Ok(Float::F16),
        DType::BF16 => Ok(Float::BF16),
        DType::I32 | DType::I64 | DType::U8 => Err(Error::InvalidArgument(format!(
            "{op} has no kernel for dtype {dtype}"
        ))),
    }
}

/// Runs `$float` with `$F` the Rust type of a float `dtype`, or `$int` with `$I` that of
/// an integer one.
macro_rules! by_dtype {
    ($dtype:expr, $F:ident => $float:expr, $I:ident => $int:expr) => {
        match $dtype {
            DType::F32 => {
                type $F = f32;
                $float
            }
            DType::F16 => {
                type $F = f16;
                $float
            }
            DType::BF16 => {
                type $F = bf16;
                $float
            }
            DType::I32 => {
                type $I = i32;
                $int
            }
            DType::I64 => {
                type $I = i64;
                $int
            }
            DType::U8 => {
                type $I = u8;
                $int
            }
        }
    };
}
use by_dtype;

/// An element type as the elementwise twins compute on it: widened to its math type
/// (`f32` for the float types, `i64` for the integer types), narrowed back after (to
/// nearest even; integers keep their low bits, which is C's wrapping on the GPU).
trait Num: Copy {
    type Math: Copy + PartialOrd;
    fn to_math(self) -> Self::Math;
    fn from_math(m: Self::Math) -> Self;
    /// The value a cast reads.
    fn to_value(self) -> Value;
    /// The element a cast writes, by C's conversions (see `kernels/cast.cu`).
    fn from_value(v: Value) -> Self;
}

/// An element on its way through a cast: a float type's value widened to `f32`, or an
/// integer's to `i64`.
#[derive(Clone, Copy)]
enum Value {
    F(f32),
    I(i64),
}

macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            type Math = f32;
            fn to_math(self) -> f32 {
                self.widen()
            }
            fn from_math(m: f32) -> Self {
                <$t>::narrow(m)
            }
            fn to_value(self) -> Value {
                Value::F(self.widen())
            }
            fn from_value(v: Value) -> Self {
                match v {
                    Value::F(f) => <$t>::narrow(f),
                    // C's (float) of an integer: to nearest.
                    Value::I(i) => <$t>::narrow(i as f32),
                }
            }
        }
    )*};
}
float_num!(f32, f16, bf16);

/// Integer types: `$via` is the math type the GPU computes a float's conversion in
/// (C truncates toward zero, and Rust's `as` saturates as the GPU's `cvt` does).
macro_rules! int_num {
    ($($t:ty, $via:ty);*) => {$(
        impl Num for $t {
            type Math = i64;
            fn to_math(self) -> i64 {
                self as i64
            }
            fn from_math(m: i64) -> Self {
                m as $t
            }
            fn to_value(self) -> Value {
                Value::I(self as i64)
            }
            fn from_value(v: Value) -> Self {
                match v {
                    Value::F(f) => (f as $via) as $t,
                    Value::I(i) => i as $t,
                }
            }
        }
    )*};
}
int_num!(i32, i32; i64, i64; u8, i32);

/// The integer twin of an op, or the error the GPU's lookup gives for a float-only op.
fn int_twin<T>(twin: Option<T>, op: &str, dtype: DType) -> Result<T> {
    twin.ok_or_else(|| Error::InvalidArgument(format!("{op} has no kernel for dtype {dtype}")))
}

fn unary<E: Num>(
    [x, out]: [DevicePtr; 2],
    n: usize,
    f: impl Fn(E::Math) -> E::Math,
    memory: &dyn HostAccess,
) -> Result<()> {
    let bytes = n * std::mem::size_of::<E>();
    access(memory, &[(x, bytes), (out, bytes)], |p| {
        let x = unsafe { Raw::<E>::new(p[0], n) };
        let out = unsafe { Raw::<E>::new(p[1], n) };
        for i in 0..n {
            out.set(i, E::from_math(f(x.get(i).to_math())));
        }
    })
}

// ANCHOR: cpu_binary
fn binary<E: Num>(
    [a, b, out]: [DevicePtr; 3],
    n: usize,
    f: impl Fn(E::Math, E::Math) -> E::Math,
    memory: &dyn HostAccess,
) -> Result<()> {
    let bytes = n * std::mem::size_of::<E>();
    access(memory, &[(a, bytes), (b, bytes), (out, bytes)], |p| {
        let a = unsafe { Raw::<E>::new(p[0], n) };
        let b = unsafe { Raw::<E>::new(p[1], n) };
        let out = unsafe { Raw::<E>::new(p[2], n) };
        for i in 0..n {
            out.set(i, E::from_math(f(a.get(i).to_math(), b.get(i).to_math())));
        }
    })
}
// ANCHOR_END: cpu_binary

/// The twin of `DEFINE_BINARY_ROWS`: `out[i] = f(a[i], b[i % cols])`, or with
/// `row_first` `f(a[i % cols], b[i])`.
fn binary_rows<E: Num>(
    [a, b, out]: [DevicePtr; 3],
    (n, cols, row_first): (usize, usize, bool),
    f: impl Fn(E::Math, E::Math) -> E::Math,
    memory: &dyn HostAccess,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if cols == 0 || n % cols != 0 {
        return Err(Error::InvalidArgument(format!(
            "a broadcast row of {cols} elements over {n} elements"
        )));
    }
    let width = std::mem::size_of::<E>();
    let (a_len, b_len) = if row_first { (cols, n) } else { (n, cols) };
    let ranges = [(a, a_len * width), (b, b_len * width), (out, n * width)];
    access(memory, &ranges, |p| {
        let a = unsafe { Raw::<E>::new(p[0], a_len) };
        let b = unsafe { Raw::<E>::new(p[1], b_len) };
        let out = unsafe { Raw::<E>::new(p[2], n) };
        for i in 0..n {
            let (ia, ib) = if row_first {
                (i % cols, i)
            } else {
                (i, i % cols)
            };
            out.set(i, E::from_math(f(a.get(ia).to_math(), b.get(ib).to_math())));
        }
    })
}

/// The memory a strided view of `n` elements of `width` bytes at `ptr` touches:
/// `(start address, element count, offset of the first element from the start)`.
pub(super) fn strided_range(
    ptr: DevicePtr,
    layout: &Strided,
    n: usize,
    width: usize,
) -> Result<(DevicePtr, usize, i64)> {
    if layout.numel() != n {
        return Err(Error::InvalidArgument(format!(
            "a strided operand of {} elements for a launch of {n}",
            layout.numel()
        )));
    }
    let (low, count) = layout.extent();
    Ok((ptr.wrapping_add_signed(low * width as i64), count, -low))
}

/// Element `i` of a strided view, from the start of its range.
pub(super) fn strided_get<E: Copy>(raw: &Raw<E>, layout: &Strided, shift: i64, i: usize) -> E {
    raw.get((layout.offset(i as u64) + shift) as usize)
}

/// The twin of `DEFINE_BINARY_STRIDED` and `DEFINE_COMPARE`: `out[i] = f(a, b)` with
/// each input read through its layout, `O` the output element.
fn binary_strided<E: Num, O: Copy>(
    inputs: [(DevicePtr, Strided); 2],
    out: DevicePtr,
    n: usize,
    f: impl Fn(E::Math, E::Math) -> O,
    memory: &dyn HostAccess,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let width = std::mem::size_of::<E>();
    let [(a, la), (b, lb)] = inputs;
    let (a_start, a_count, a_shift) = strided_range(a, &la, n, width)?;
    let (b_start, b_count, b_shift) = strided_range(b, &lb, n, width)?;
    let ranges = [
        (a_start, a_count * width),
        (b_start, b_count * width),
        (out, n * std::mem::size_of::<O>()),
    ];
    access(memory, &ranges, |p| {
        let a = unsafe { Raw::<E>::new(p[0], a_count) };
        let b = unsafe { Raw::<E>::new(p[1], b_count) };
        let out = unsafe { Raw::<O>::new(p[2], n) };
        for i in 0..n {
            let x = strided_get(&a, &la, a_shift, i).to_math();
            let y = strided_get(&b, &lb, b_shift, i).to_math();
            out.set(i, f(x, y));
        }
    })
}

/// The twin of `DEFINE_WHERE`, by element width (a selection does not read values).
fn select<E: Copy>(
    operands: [(DevicePtr, Strided); 3],
    out: DevicePtr,
    n: usize,
    memory: &dyn HostAccess,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let width = std::mem::size_of::<E>();
    let [(c, lc), (a, la), (b, lb)] = operands;
    let (c_start, c_count, c_shift) = strided_range(c, &lc, n, 1)?;
    let (a_start, a_count, a_shift) = strided_range(a, &la, n, width)?;
    let (b_start, b_count, b_shift) = strided_range(b, &lb, n, width)?;
    let ranges = [
        (c_start, c_count),
        (a_start, a_count * width),
        (b_start, b_count * width),
        (out, n * width),
    ];
    access(memory, &ranges, |p| {
        let c = unsafe { Raw::<u8>::new(p[0], c_count) };
        let a = unsafe { Raw::<E>::new(p[1], a_count) };
        let b = unsafe { Raw::<E>::new(p[2], b_count) };
        let out = unsafe { Raw::<E>::new(p[3], n) };
        for i in 0..n {
            let v = if strided_get(&c, &lc, c_shift, i) != 0 {
                strided_get(&a, &la, a_shift, i)
            } else {
                strided_get(&b, &lb, b_shift, i)
            };
            out.set(i, v);
        }
    })
}

/// The twin of `cast_{from}_{to}`: `S` is the source element, `to` the destination.
fn cast_from<S: Num>(
    to: DType,
    io: [DevicePtr; 2],
    n: usize,
    memory: &dyn HostAccess,
) -> Result<()> {
    by_dtype!(to,
        F => cast::<S, F>(io, n, memory),
        I => cast::<S, I>(io, n, memory))
}

fn cast<S: Num, D: Num>([x, out]: [DevicePtr; 2], n: usize, memory: &dyn HostAccess) -> Result<()> {
    let (from, to) = (std::mem::size_of::<S>(), std::mem::size_of::<D>());
    access(memory, &[(x, n * from), (out, n * to)], |p| {
        let x = unsafe { Raw::<S>::new(p[0], n) };
        let out = unsafe { Raw::<D>::new(p[1], n) };
        for i in 0..n {
            out.set(i, D::from_value(x.get(i).to_value()));
        }
    })
}

/// The twin of `strided_copy_b*` in `kernels/strided.cu`.
fn strided_copy<E: Copy>(
    src: DevicePtr,
    dst: DevicePtr,
    layout: &Strided,
    n: usize,
    memory: &dyn HostAccess,
) -> Result<()> {
    if layout.numel() != n {
        return Err(Error::InvalidArgument(format!(
            "strided copy of {n} elements from a view of {}",
            layout.numel()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let width = std::mem::size_of::<E>();
    let (low, count) = layout.extent();
    let start = src.wrapping_add_signed(low * width as i64);
    access(memory, &[(start, count * width), (dst, n * width)], |p| {
        let src = unsafe { Raw::<E>::new(p[0], count) };
        let dst = unsafe { Raw::<E>::new(p[1], n) };
        for i in 0..n {
            dst.set(i, src.get((layout.offset(i as u64) - low) as usize));
        }
    })
}

/// The twin of `spin_f32` in `kernels/spin.cu`.
fn spin(mut v: f32, iterations: u32) -> f32 {
    for _ in 0..iterations {
        v = v * 0.999999 + 0.000001;
    }
    v
}

/// Writes `count` copies of `pattern` at `dst`.
///
/// # Safety
/// `dst` must be valid for `count * pattern.width()` bytes.
pub unsafe fn fill(dst: *mut u8, pattern: FillPattern, count: usize) {
    match pattern {
        FillPattern::U8(v) => std::ptr::write_bytes(dst, v, count),
        FillPattern::U16(v) => {
            for i in 0..count {
                (dst as *mut u16).add(i).write_unaligned(v)
            }
        }
        FillPattern::U32(v) => {
            for i in 0..count {
                (dst as *mut u32).add(i).write_unaligned(v)
            }
        }
        FillPattern::U64(v) => {
            for i in 0..count {
                (dst as *mut u64).add(i).write_unaligned(v)
            }
        }
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The same generator as `randn_f32` in `kernels/random.cu`.
pub fn randn(seed: u64, index: u64) -> f32 {
    let bits = splitmix64(seed ^ splitmix64(index));
    let u1 = ((bits >> 40) as f32 + 1.0) * (1.0 / 16_777_216.0);
    let u2 = ((bits >> 16) & 0xFF_FFFF) as f32 * (1.0 / 16_777_216.0);
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
