//! Experiment 3: a free pending on another stream (PyTorch issue 189504). A block used
//! by a second stream and marked with `record_stream` is freed while that stream is
//! still busy: the allocator may not reuse it until the stream's event completes. A
//! request that only this block could serve then arrives. PyTorch's allocator, once it
//! has waited for the pending events, asks only the driver for new memory and does not
//! search its pool again (chapter 2 has the whole chain): under a cap it can raise
//! out-of-memory with the fitting block in its pool. The retry ladder here searches
//! again after waiting, and serves the request with the very block that was freed,
//! without releasing any cache.

use std::time::{Duration, Instant};

use labs_core::device::FillPattern;
use labs_core::format::{bytes, duration};
use labs_core::{Device, Result, Tensor};

use crate::capped;

pub const CAP: u64 = 256 << 20;
pub const BLOCK: u64 = 192 << 20;

#[derive(Debug, Clone)]
pub struct Pending {
    /// Frees deferred behind another stream's event (`num_deferred_frees`), before the
    /// request.
    pub deferred_before: u64,
    /// Whether the request succeeded, and whether it got the freed block back.
    pub served: bool,
    pub same_block: bool,
    /// How long the request took: the rest of the other stream's work.
    pub waited: Duration,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
}

// ANCHOR: pending
pub fn run(device: &Device, busy: Duration) -> Result<Pending> {
    let a = capped(device, CAP, "expandable_segments:False")?;
    let (main, side) = (device.new_stream()?, device.new_stream()?);
    let x = Tensor::zeros(&[1 << 10], labs_core::DType::F32, device)?;
    let iterations = labs_core::timing::calibrate_spin(&x, &side, busy)?;

    let block = a.malloc(BLOCK as usize, &main)?;
    main.synchronize()?;
    x.spin_on(iterations, &side)?; // the side stream is busy...
    let words = (BLOCK / 4) as usize; // ...then writes the block
    device
        .backend()
        .fill(block.ptr(), FillPattern::U32(0), words, &side)?;
    a.record_stream(&block, &side)?;
    let freed = block.ptr();
    a.free(block)?; // pending until the side stream passes this point
    let deferred_before = a.stats().num_deferred_frees;

    let start = Instant::now();
    let again = a.malloc(BLOCK as usize, &main); // only the pending block fits the cap
    let waited = start.elapsed();
    // ANCHOR_END: pending
    let stats = a.stats();
    let (served, same_block) = match again {
        Ok(b) => {
            let same = b.ptr() == freed;
            a.free(b)?;
            (true, same)
        }
        Err(e) if e.is_out_of_memory() => (false, false),
        Err(e) => return Err(e),
    };
    side.synchronize()?;
    Ok(Pending {
        deferred_before,
        served,
        same_block,
        waited,
        num_alloc_retries: stats.num_alloc_retries,
        num_ooms: stats.num_ooms,
    })
}

pub fn print(device: &Device, p: &Pending, busy: Duration) {
    println!("3. A block freed on another stream and still pending (record_stream), on {device}");
    println!(
        "(a private allocator capped at {}; the block is {}, so a second one fits only in \
         its place; the side stream is busy for about {})\n",
        bytes(CAP),
        bytes(BLOCK),
        duration(busy)
    );
    println!("  pending frees before the request  {}", p.deferred_before);
    println!(
        "  the request                       {}",
        if p.served { "served" } else { "out of memory" }
    );
    println!("  got the freed block back          {}", p.same_block);
    println!("  waited for the pending free       {}", duration(p.waited));
    println!(
        "  num_alloc_retries                 {}",
        p.num_alloc_retries
    );
    println!("  num_ooms                          {}\n", p.num_ooms);
}
