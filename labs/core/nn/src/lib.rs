//! Modules with PyTorch's parameter names and layouts, safetensors state dicts (`nn`),
//! and optimizers with one fused kernel per step and a gradient scaler (`optim`), on the
//! public tensor API of `labs-tensor`.

pub mod nn;
pub mod optim;
pub mod testing;

// The lower crates' modules under the paths this crate's files name them by.
use labs_base::{dtype, error, format, input};
use labs_device::device;
use labs_tensor::{autograd, tensor};
