//! Lab 9: memory leaks and graph lifetimes. What a tensor that still has a graph keeps
//! alive on the device, what `no_grad`, `detach` and `item` change, what dropping a
//! reference frees (and what it does not), and the leak guard naming the op and the
//! line behind each leaked block. Each module is one experiment of chapter 9.

pub mod drops;
pub mod eval;
pub mod exercises;
pub mod model;
pub mod planted;
pub mod running_loss;
pub mod unused_result;

/// Bytes as MiB with two decimals, the unit of every table of the lab.
pub fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 20) as f64)
}
