//! Lab 5: out of memory. An out-of-memory error provoked and read part by part,
//! fragmentation that `expandable_segments` avoids, a free pending on another stream
//! that the retry ladder waits for, recovery inside a training loop, an automatic
//! batch-size finder, two processes sharing one GPU under memory fractions, and the
//! largest batch that fits a GPU of a given size, found on the dry-run device before
//! running. Each module is one experiment of chapter 5.

pub mod exercises;
pub mod explain;
pub mod finder;
pub mod fit;
pub mod fit_train;
pub mod fragmentation;
pub mod model;
pub mod pending_free;
pub mod recovery;
pub mod share;

use labs_core::alloc::{Allocator, Config};
use labs_core::{Device, Error, Result};

/// Bytes as MiB with two decimals, the unit of the lab's tables.
pub fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 20) as f64)
}

/// A private allocator on `device` with settings `conf`, capped at about `bytes` with a
/// memory fraction: an experiment that must run out of memory does so after a few
/// hundred MiB on any device, instead of filling an 80 GB GPU.
pub fn capped(device: &Device, bytes: u64, conf: &str) -> Result<Allocator> {
    let a = Allocator::new(device.backend_arc(), Config::parse(conf)?)?;
    let total = device.mem_info()?.total;
    // Half a byte over, so that the limit (the device's size times the fraction, rounded
    // down) is `bytes` exactly whatever the device's size: a GPU's is no power of two,
    // and a limit a few bytes short of 400 MiB holds one 20 MiB segment fewer.
    a.set_memory_fraction(((bytes as f64 + 0.5) / total as f64).min(1.0))?;
    Ok(a)
}

/// The first sentence of an error's message: for tables, where the whole report is too
/// long.
pub fn first_sentence(e: &Error) -> String {
    let text = e.to_string();
    match text.find(". ") {
        Some(i) => text[..=i].to_string(),
        None => text,
    }
}
