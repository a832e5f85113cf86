//! Lab 7: mixed precision. A training step under `autocast` (products in float16 or
//! bfloat16, softmax and losses in float32) with float32 master weights, gradients and
//! Adam state, and the gradient scaler that float16 needs. Each module is one
//! experiment of chapter 7; [`driver`] runs tutorial 004's step and GPT-2 through lab
//! 10's training driver, with PyTorch's figures beside ours ([`pytorch`]).

pub mod categories;
pub mod curves;
pub mod driver;
pub mod exercises;
pub mod full_vs_mixed;
pub mod gemm;
pub mod model;
pub mod pytorch;
pub mod scaler;

/// Bytes as MiB with two decimals, the unit of every memory table of the lab.
pub fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 20) as f64)
}
