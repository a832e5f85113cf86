//! CPU twins of the CUDA kernels, run by the simulated GPU and the host device. They
//! work through raw pointers because, like GPU kernels, their arguments may alias
//! (an in-place `scale` reads and writes the same buffer).

use super::Kernel;
use crate::dtype::FillPattern;
use crate::error::Result;
use crate::sim::SimMemory as Memory;

const F: usize = std::mem::size_of::<f32>();

pub(crate) fn run(kernel: &Kernel, memory: &Memory) -> Result<()> {
    match *kernel {
        Kernel::Add { a, b, out, n } => binary(memory, a, b, out, n, |x, y| x + y),
        Kernel::Mul { a, b, out, n } => binary(memory, a, b, out, n, |x, y| x * y),
        Kernel::Scale { x, alpha, out, n } => memory.access(&[(x, n * F), (out, n * F)], |p| {
            let (x, out) = (p[0] as *const f32, p[1] as *mut f32);
            for i in 0..n {
                unsafe {
                    out.add(i)
                        .write_unaligned(alpha * x.add(i).read_unaligned())
                }
            }
        }),
        Kernel::Axpy { alpha, x, y, n } => memory.access(&[(x, n * F), (y, n * F)], |p| {
            let (x, y) = (p[0] as *const f32, p[1] as *mut f32);
            for i in 0..n {
                unsafe {
                    let v = alpha * x.add(i).read_unaligned() + y.add(i).read_unaligned();
                    y.add(i).write_unaligned(v)
                }
            }
        }),
        Kernel::Randn {
            out,
            n,
            seed,
            offset,
        } => memory.access(&[(out, n * F)], |p| {
            let out = p[0] as *mut f32;
            for i in 0..n {
                unsafe { out.add(i).write_unaligned(randn(seed, offset + i as u64)) }
            }
        }),
        Kernel::Spin { x, n, iterations } => memory.access(&[(x, n * F)], |p| {
            let x = p[0] as *mut f32;
            for i in 0..n {
                unsafe {
                    let mut v = x.add(i).read_unaligned();
                    for _ in 0..iterations {
                        v = v * 0.999999 + 0.000001;
                    }
                    x.add(i).write_unaligned(v)
                }
            }
        }),
    }
}

// ANCHOR: cpu_binary
fn binary(
    memory: &Memory,
    a: u64,
    b: u64,
    out: u64,
    n: usize,
    op: impl Fn(f32, f32) -> f32,
) -> Result<()> {
    memory.access(&[(a, n * F), (b, n * F), (out, n * F)], |p| {
        let (a, b, out) = (p[0] as *const f32, p[1] as *const f32, p[2] as *mut f32);
        for i in 0..n {
            unsafe {
                let v = op(a.add(i).read_unaligned(), b.add(i).read_unaligned());
                out.add(i).write_unaligned(v)
            }
        }
    })
}
// ANCHOR_END: cpu_binary

/// # Safety
/// `dst` must be valid for `count * pattern.width()` bytes.
pub(crate) unsafe fn fill(dst: *mut u8, pattern: FillPattern, count: usize) {
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
