//! CPU twins of the CUDA kernels, run by the simulated GPU and the host device. They
//! reach device memory through [`HostAccess`], which the memory implements, so this
//! module knows nothing of the simulator. Like GPU kernels, their arguments may alias
//! (an in-place `scale` reads and writes the same buffer), so elements are read and
//! written through raw pointers, one element at a time.

use std::marker::PhantomData;

use half::{bf16, f16};

use super::{Kernel, Strided};
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
        } => {
            let f = op.cpu();
            match float(dtype, op.name())? {
                Float::F32 => unary::<f32>([x, out], n, alpha, f, memory),
                Float::F16 => unary::<f16>([x, out], n, alpha, f, memory),
                Float::BF16 => unary::<bf16>([x, out], n, alpha, f, memory),
            }
        }
        Kernel::Binary {
            op,
            dtype,
            a,
            b,
            out,
            n,
            alpha,
        } => {
            let f = op.cpu();
            match float(dtype, op.name())? {
                Float::F32 => binary::<f32>([a, b, out], n, alpha, f, memory),
                Float::F16 => binary::<f16>([a, b, out], n, alpha, f, memory),
                Float::BF16 => binary::<bf16>([a, b, out], n, alpha, f, memory),
            }
        }
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
struct Raw<E> {
    ptr: *mut u8,
    len: usize,
    _element: PhantomData<E>,
}

impl<E: Copy> Raw<E> {
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` elements while the view is
    /// used: a pointer [`HostAccess`] gave for a range of `len` elements, used inside
    /// its call.
    unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Raw {
            ptr,
            len,
            _element: PhantomData,
        }
    }
    fn get(&self, i: usize) -> E {
        assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: `i < len`, and `new`'s contract makes `len` elements valid.
        unsafe { (self.ptr as *const E).add(i).read_unaligned() }
    }
    fn set(&self, i: usize, v: E) {
        assert!(i < self.len, "element {i} of {}", self.len);
        // SAFETY: as in `get`.
        unsafe { (self.ptr as *mut E).add(i).write_unaligned(v) }
    }
}

fn access(
    memory: &dyn HostAccess,
    ranges: &[(DevicePtr, usize)],
    mut f: impl FnMut(&[*mut u8]),
) -> Result<()> {
    memory.with_host_ptrs(ranges, &mut f)
}

/// A float element type the elementwise kernels compute on: widened to `f32` for the
/// op, rounded back to nearest even after, as the GPU kernels do.
trait FloatElement: Copy {
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

enum Float {
    F32,
    F16,
    BF16,
}

/// The float type of `dtype`; other dtypes are the error the GPU's lookup gives too.
fn float(dtype: DType, op: &str) -> Result<Float> {
    match dtype {
        DType::F32 => Ok(Float::F32),
        DType::F16 => Ok(Float::F16),
        DType::BF16 => Ok(Float::BF16),
        DType::I32 | DType::U8 => Err(Error::InvalidArgument(format!(
            "{op} has no kernel for dtype {dtype}"
        ))),
    }
}

fn unary<E: FloatElement>(
    [x, out]: [DevicePtr; 2],
    n: usize,
    alpha: f32,
    f: fn(f32, f32) -> f32,
    memory: &dyn HostAccess,
) -> Result<()> {
    let bytes = n * std::mem::size_of::<E>();
    access(memory, &[(x, bytes), (out, bytes)], |p| {
        let x = unsafe { Raw::<E>::new(p[0], n) };
        let out = unsafe { Raw::<E>::new(p[1], n) };
        for i in 0..n {
            out.set(i, E::narrow(f(x.get(i).widen(), alpha)));
        }
    })
}

// ANCHOR: cpu_binary
fn binary<E: FloatElement>(
    [a, b, out]: [DevicePtr; 3],
    n: usize,
    alpha: f32,
    f: fn(f32, f32, f32) -> f32,
    memory: &dyn HostAccess,
) -> Result<()> {
    let bytes = n * std::mem::size_of::<E>();
    access(memory, &[(a, bytes), (b, bytes), (out, bytes)], |p| {
        let a = unsafe { Raw::<E>::new(p[0], n) };
        let b = unsafe { Raw::<E>::new(p[1], n) };
        let out = unsafe { Raw::<E>::new(p[2], n) };
        for i in 0..n {
            out.set(i, E::narrow(f(a.get(i).widen(), b.get(i).widen(), alpha)));
        }
    })
}
// ANCHOR_END: cpu_binary

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
mod tests {
    use super::*;
    use crate::kernels::UnaryOp;

    /// Plain host bytes posing as device memory at address `BASE`: the twins need
    /// nothing more than [`HostAccess`].
    struct Bytes(std::cell::RefCell<Vec<u8>>);
    const BASE: DevicePtr = 0x1000;

    impl HostAccess for Bytes {
        fn with_host_ptrs(
            &self,
            ranges: &[(DevicePtr, usize)],
            f: &mut dyn FnMut(&[*mut u8]),
        ) -> Result<()> {
            let mut bytes = self.0.borrow_mut();
            let len = bytes.len() as u64;
            if ranges
                .iter()
                .any(|&(a, n)| a < BASE || a + n as u64 > BASE + len)
            {
                return Err(Error::InvalidArgument("out of range".into()));
            }
            let base = bytes.as_mut_ptr();
            let ptrs: Vec<*mut u8> = ranges
                .iter()
                .map(|&(a, _)| base.wrapping_add((a - BASE) as usize))
                .collect();
            f(&ptrs);
            Ok(())
        }
    }

    fn floats(memory: &Bytes) -> Vec<f32> {
        memory
            .0
            .borrow()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn twins_run_on_any_host_memory_in_place_and_strided() {
        let values: Vec<u8> = [
            1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        let memory = Bytes(std::cell::RefCell::new(values));
        // In place: `x` and `out` alias.
        run(&Kernel::scale(BASE, 10.0, BASE, 6), &memory).unwrap();
        // The transpose of the 2x3 matrix into the second half.
        let copy = Kernel::StridedCopy {
            width: 4,
            src: BASE,
            dst: BASE + 24,
            layout: Strided::new(&[3, 2], &[1, 3]).unwrap(),
            n: 6,
        };
        run(&copy, &memory).unwrap();
        assert_eq!(
            floats(&memory),
            [10., 20., 30., 40., 50., 60., 10., 40., 20., 50., 30., 60.]
        );
        let past_the_end = Kernel::Unary {
            op: UnaryOp::Neg,
            dtype: DType::F32,
            x: BASE,
            out: BASE + 4,
            n: 12,
            alpha: 0.0,
        };
        assert!(run(&past_the_end, &memory).is_err());
    }
}
