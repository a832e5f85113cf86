//! Reading a tensor's values back, for the test suites.

use crate::tensor::{DType, Tensor};

/// The values of a floating-point tensor as float64 (a float16 or bfloat16 tensor read
/// through float32).
pub fn host(t: &Tensor) -> Vec<f64> {
    let read = |t: &Tensor| t.to_vec::<f32>().unwrap();
    let values = if t.dtype() == DType::F32 {
        read(t)
    } else {
        read(&t.to_dtype(DType::F32).unwrap())
    };
    values.into_iter().map(f64::from).collect()
}
