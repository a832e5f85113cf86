//! The twins of the mixed-dtype binary kernels of `kernels/mixed.cu`: each operand read
//! in its own float dtype and widened to `f32`, the op's twin, the `f32` result stored.

use half::{bf16, f16};

use super::cpu::{access, strided_get, strided_range, FloatElement, HostAccess, Raw};
use super::{MixedBinary, MixedForm};
use crate::dtype::DType;
use crate::error::Result;

/// Runs `$body` with `$T` the Rust type of the float `$dtype` (validated before).
macro_rules! by_float {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            _ => {
                type $T = bf16;
                $body
            }
        }
    };
}

/// The twin of `m`'s kernel.
pub(super) fn run(m: &MixedBinary, memory: &dyn HostAccess) -> Result<()> {
    m.validate()?;
    by_float!(m.a_dtype, A => by_float!(m.b_dtype, B => mixed::<A, B>(m, memory)))
}

fn mixed<A: FloatElement, B: FloatElement>(m: &MixedBinary, memory: &dyn HostAccess) -> Result<()> {
    let n = m.n;
    if n == 0 {
        return Ok(());
    }
    let twin = m.op.cpu();
    let f = |x: A, y: B| twin(x.widen(), y.widen(), m.alpha);
    let (wa, wb) = (std::mem::size_of::<A>(), std::mem::size_of::<B>());
    let out_range = (m.out, n * 4);
    match m.form {
        MixedForm::Dense => access(memory, &[(m.a, n * wa), (m.b, n * wb), out_range], |p| {
            // SAFETY (every `Raw::new` here): `p[k]` is valid for the k-th range asked.
            let (a, b) = unsafe { (Raw::<A>::new(p[0], n), Raw::<B>::new(p[1], n)) };
            let out = unsafe { Raw::<f32>::new(p[2], n) };
            for i in 0..n {
                out.set(i, f(a.get(i), b.get(i)));
            }
        }),
        MixedForm::Rows { cols, row_first } => {
            let (a_len, b_len) = if row_first { (cols, n) } else { (n, cols) };
            let ranges = [(m.a, a_len * wa), (m.b, b_len * wb), out_range];
            access(memory, &ranges, |p| {
                let (a, b) = unsafe { (Raw::<A>::new(p[0], a_len), Raw::<B>::new(p[1], b_len)) };
                let out = unsafe { Raw::<f32>::new(p[2], n) };
                for i in 0..n {
                    let (ia, ib) = if row_first {
                        (i % cols, i)
                    } else {
                        (i, i % cols)
                    };
                    out.set(i, f(a.get(ia), b.get(ib)));
                }
            })
        }
        MixedForm::Strided { a_layout, b_layout } => {
            let (a_start, a_count, a_shift) = strided_range(m.a, &a_layout, n, wa)?;
            let (b_start, b_count, b_shift) = strided_range(m.b, &b_layout, n, wb)?;
            let ranges = [(a_start, a_count * wa), (b_start, b_count * wb), out_range];
            access(memory, &ranges, |p| {
                let a = unsafe { Raw::<A>::new(p[0], a_count) };
                let b = unsafe { Raw::<B>::new(p[1], b_count) };
                let out = unsafe { Raw::<f32>::new(p[2], n) };
                for i in 0..n {
                    let x = strided_get(&a, &a_layout, a_shift, i);
                    let y = strided_get(&b, &b_layout, b_shift, i);
                    out.set(i, f(x, y));
                }
            })
        }
    }
}
