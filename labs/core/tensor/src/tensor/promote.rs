//! Type promotion, as PyTorch's `torch.result_type`: which dtype an op on operands of
//! different dtypes computes in. Operands are cast to it before the kernel runs, except
//! two float operands of different dtypes, which one kernel reads each in its own dtype
//! (`mixed.rs`).
//!
//! PyTorch ranks operands in three tiers: tensors with dimensions, zero-dimensional
//! tensors, and Python scalars ("wrapped numbers"). A lower tier changes the result
//! only when it is of a higher category (integer < float): `int_tensor + 2.5` is
//! float32 (the default float dtype), `half_tensor + 2.5` stays float16, and a
//! zero-dimensional float32 tensor does not widen a float16 tensor. uint8 is promoted
//! as PyTorch's uint8 (the labs have no separate bool dtype).

use super::{DType, Tensor};

/// A Python number as an operand: its type, not its value, decides promotion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A Python `int` (promotes like int64, but never widens an integer tensor).
    Int(i64),
    /// A Python `float` (promotes like the default dtype, float32).
    Float(f64),
}

impl Scalar {
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Int(v) => v as f64,
            Scalar::Float(v) => v,
        }
    }

    /// The dtype PyTorch gives the scalar when wrapping it as a tensor.
    fn wrapped_dtype(self) -> DType {
        match self {
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::F32,
        }
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}
impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(v as f64)
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}
impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(v as i64)
    }
}

/// Whether `dtype` is a floating-point type.
pub fn is_floating_point(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// The smallest dtype both `a` and `b` convert to (`torch.promote_types`): floats beat
/// integers; two different float types meet at float32 (float16 + bfloat16 included);
/// integers widen (uint8 + int32 is int32).
pub fn promote_types(a: DType, b: DType) -> DType {
    if a == b {
        return a;
    }
    match (is_floating_point(a), is_floating_point(b)) {
        (true, true) => DType::F32,
        (true, false) => a,
        (false, true) => b,
        (false, false) => {
            let rank = |d| match d {
                DType::U8 => 0,
                DType::I32 => 1,
                _ => 2,
            };
            if rank(a) >= rank(b) {
                a
            } else {
                b
            }
        }
    }
}

fn promote(acc: Option<DType>, d: DType) -> Option<DType> {
    Some(acc.map_or(d, |a| promote_types(a, d)))
}

/// PyTorch's `combine_categories`: the higher tier wins unless the lower one is a float
/// and the higher one is not.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (Some(h), Some(l)) if !is_floating_point(h) && is_floating_point(l) => {
            Some(promote_types(h, l))
        }
        (Some(h), _) => Some(h),
        (None, l) => l,
    }
}

/// The result dtype of an op on `tensors` and `scalars` (`torch.result_type`).
pub fn result_type(tensors: &[&Tensor], scalars: &[Scalar]) -> DType {
    let (mut dim, mut zero, mut wrapped) = (None, None, None);
    for t in tensors {
        if t.shape().is_empty() {
            zero = promote(zero, t.dtype());
        } else {
            dim = promote(dim, t.dtype());
        }
    }
    for s in scalars {
        wrapped = promote(wrapped, s.wrapped_dtype());
    }
    combine(dim, combine(zero, wrapped)).unwrap_or(DType::F32)
}

impl Tensor {
    /// The dtype `self op other` computes in (`torch.result_type(self, other)`).
    pub fn result_type(&self, other: &Tensor) -> DType {
        result_type(&[self, other], &[])
    }

    /// The dtype `self op scalar` computes in (`torch.result_type(self, scalar)`).
    pub fn result_type_scalar(&self, scalar: impl Into<Scalar>) -> DType {
        result_type(&[self], &[scalar.into()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promote_types_follows_pytorch() {
        let table = [
            (F16, BF16, F32),
            (F32, F16, F32),
            (BF16, F32, F32),
            (I32, I64, I64),
            (U8, I32, I32),
            (U8, I64, I64),
            (I64, F16, F16),
            (U8, BF16, BF16),
            (I32, F32, F32),
        ];
        for (a, b, want) in table {
            assert_eq!(promote_types(a, b), want, "{a} + {b}");
            assert_eq!(promote_types(b, a), want, "{b} + {a}");
        }
    }

    #[test]
    fn lower_tiers_only_change_the_category() {
        // (dimensioned, zero-dimensional, scalars) -> result, as torch.result_type gives.
        let f = |h, l| combine(h, l);
        let python_float = Scalar::Float(0.5).wrapped_dtype();
        assert_eq!(f(Some(I32), Some(python_float)), Some(F32));
        assert_eq!(f(Some(F16), Some(F32)), Some(F16));
        assert_eq!(f(Some(U8), Some(I64)), Some(U8));
        assert_eq!(f(Some(I32), Some(F16)), Some(F16));
        assert_eq!(f(None, Some(I64)), Some(I64));
    }
}
