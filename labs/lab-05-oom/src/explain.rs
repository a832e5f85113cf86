//! Experiment 1: an out-of-memory error provoked and read part by part. A private
//! allocator holds parameters and activations (counted under their categories, with
//! backtraces recorded) and is asked for more than the device has left; an observer,
//! as `torch._C._cuda_attach_out_of_memory_observer` attaches one, runs before the
//! error returns. Twice: on the whole device, then under a memory fraction of 0.25.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use labs_core::alloc::{Allocation, Allocator, Category, Config};
use labs_core::format::bytes;
use labs_core::oom_report::OomReport;
use labs_core::{Device, Error, Result, Stream};

/// One provoked failure: the error, its report, and what the observer saw.
pub struct Explained {
    pub fraction: f64,
    pub error: Error,
    pub requested: u64,
    pub free: u64,
    pub total: u64,
    pub report: OomReport,
    /// Times the observer ran, and `memory_allocated` as it read it.
    pub observer_calls: u64,
    pub observer_saw_allocated: u64,
}

/// Allocates `bytes` from a function of its own, so that the backtrace names it.
#[inline(never)]
fn allocate_parameters(a: &Allocator, bytes: u64, stream: &Stream) -> Result<Allocation> {
    let _c = Category::Parameter.scope();
    a.malloc(bytes as usize, stream)
}

#[inline(never)]
fn allocate_activations(a: &Allocator, bytes: u64, stream: &Stream) -> Result<Allocation> {
    let _c = Category::Activation.scope();
    a.malloc(bytes as usize, stream)
}

// ANCHOR: provoke
/// Parameters of an eighth of the limit and four activations of a sixth each, then a
/// request for a quarter: more than is left. With `fraction` 1 the limit is the
/// device (the driver refuses); below 1 it is the fraction.
pub fn provoke(device: &Device, fraction: f64) -> Result<Explained> {
    let a = Allocator::new(
        device.backend_arc(),
        Config::parse("expandable_segments:False")?,
    )?;
    a.set_memory_fraction(fraction)?;
    a.record_memory_history(10_000, true);
    let calls = Arc::new(AtomicU64::new(0));
    let saw = Arc::new(AtomicU64::new(0));
    let (c, s) = (calls.clone(), saw.clone());
    a.attach_out_of_memory_observer(move |alloc, _error| {
        // The allocator's lock is not held: an observer may read it, or dump a snapshot.
        c.fetch_add(1, Ordering::SeqCst);
        s.store(alloc.memory_allocated(), Ordering::SeqCst);
    });
    let stream = device.default_stream()?;
    let limit = (device.mem_info()?.total as f64 * fraction) as u64;
    let unit = |n: u64| (limit / n) >> 21 << 21; // whole 2 MiB pages
    let mut held = vec![allocate_parameters(&a, unit(8), &stream)?];
    for _ in 0..4 {
        held.push(allocate_activations(&a, unit(6), &stream)?);
    }
    let requested = unit(4);
    let error = a
        .malloc(requested as usize, &stream)
        .expect_err("a quarter more than is left");
    // ANCHOR_END: provoke
    for b in held {
        a.free(b)?;
    }
    let Error::OutOfMemory {
        requested,
        free,
        total,
        report: Some(report),
        ..
    } = &error
    else {
        return Err(error);
    };
    Ok(Explained {
        fraction,
        requested: *requested,
        free: *free,
        total: *total,
        report: (**report).clone(),
        observer_calls: calls.load(Ordering::SeqCst),
        observer_saw_allocated: saw.load(Ordering::SeqCst),
        error: error.clone(),
    })
}

/// The message in full, then each part and what it means.
pub fn print(device: &Device, e: &Explained) {
    if e.fraction < 1.0 {
        println!(
            "1b. The same under a memory fraction of {} (set_per_process_memory_fraction), on {device}\n",
            e.fraction
        );
    } else {
        println!("1. An out-of-memory error, explained, on {device}\n");
    }
    println!("The error, in full:\n{}\n", e.error);
    let r = &e.report;
    println!("Its parts:");
    println!(
        "  Tried to allocate {:>12}  the request that failed, after the retry ladder",
        bytes(e.requested)
    );
    println!(
        "  total capacity    {:>12}  the device's memory (cudaMemGetInfo's total)",
        bytes(e.total)
    );
    println!(
        "  free              {:>12}  what the driver had left for anyone",
        bytes(e.free)
    );
    if r.fraction < 1.0 {
        println!(
            "  fraction limit    {:>12}  this process's cap: {} of the device",
            bytes(r.limit),
            r.fraction
        );
    }
    println!(
        "  allocated         {:>12}  live tensors (memory_allocated)",
        bytes(r.allocated)
    );
    println!(
        "  reserved, unused  {:>12}  cached by the allocator (memory_reserved - memory_allocated)",
        bytes(r.reserved - r.allocated)
    );
    println!(
        "  free pieces       {:>12}  how the cached memory is split (largest {})",
        r.free_pieces,
        bytes(r.largest_free)
    );
    println!(
        "  activations       {:>12}  saved for backward, among the allocated",
        bytes(r.activations)
    );
    println!(
        "  suggestion        {:>12?}  chosen from the figures above",
        r.suggestion
    );
    println!("  largest live allocations, with what they hold and where they were made:");
    for l in &r.largest_live {
        println!(
            "    {:>12} {:<10} {}",
            bytes(l.size),
            l.category,
            l.site.as_deref().unwrap_or("(no backtrace)")
        );
    }
    println!(
        "The observer ran {} time(s) before the error returned; it read memory_allocated = {}.\n",
        e.observer_calls,
        bytes(e.observer_saw_allocated)
    );
}

/// What became of one request made alone on a fresh allocator.
pub struct Alone {
    pub what: &'static str,
    pub bytes: u64,
    pub error: Option<Error>,
}

// ANCHOR: too_large
/// Tutorial 000's `torch.randn(100000, 100000)` (float32), and a request of one and a
/// half times the device, each alone on a fresh allocator: on Linux a request past the
/// device's memory fails; nothing spills into host memory.
pub fn too_large(device: &Device) -> Result<Vec<Alone>> {
    let total = device.mem_info()?.total;
    let mut out = Vec::new();
    for (what, bytes) in [
        ("randn(100000, 100000), float32", 100_000u64 * 100_000 * 4),
        ("1.5 x the device", total + total / 2),
    ] {
        let a = Allocator::new(device.backend_arc(), Config::parse("")?)?;
        let error = match a.malloc(bytes as usize, &device.default_stream()?) {
            Ok(b) => {
                a.free(b)?;
                None
            }
            Err(e) if e.is_out_of_memory() => Some(e),
            Err(e) => return Err(e),
        };
        out.push(Alone { what, bytes, error });
    }
    Ok(out)
}
// ANCHOR_END: too_large

pub fn print_too_large(device: &Device, rows: &[Alone]) {
    println!("1c. Requests larger than the device, each alone, on {device}\n");
    for r in rows {
        match &r.error {
            None => println!("{} ({}): served", r.what, bytes(r.bytes)),
            Some(e) => println!("{} ({}): {e}", r.what, bytes(r.bytes)),
        }
    }
    println!();
}
