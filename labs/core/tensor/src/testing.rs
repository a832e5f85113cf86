//! Reading a tensor's values back, for the test suites.

use half::{bf16, f16};

use crate::tensor::{DType, Tensor};

/// The values of a tensor of any dtype as float64, each read in its own dtype (no cast
/// on the device, so a test that counts launches or allocations counts none here).
pub fn host(t: &Tensor) -> Vec<f64> {
    fn read<T: crate::tensor::Element>(t: &Tensor, widen: impl Fn(T) -> f64) -> Vec<f64> {
        t.to_vec::<T>().unwrap().into_iter().map(widen).collect()
    }
    match t.dtype() {
        DType::F32 => read(t, |v: f32| v as f64),
        DType::F16 => read(t, |v: f16| v.to_f64()),
        DType::BF16 => read(t, |v: bf16| v.to_f64()),
        DType::I32 => read(t, |v: i32| v as f64),
        DType::I64 => read(t, |v: i64| v as f64),
        DType::U8 => read(t, |v: u8| v as f64),
    }
}
