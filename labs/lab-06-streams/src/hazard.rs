//! The caching allocator's stream rule. A block belongs to the stream it was allocated
//! on: freeing it makes it reusable at once for later work on that stream, which is
//! safe for that stream alone. If another stream still reads the block, the free is a
//! bug, unless the block was marked with `record_stream`: then the allocator records
//! an event on the reader's stream and reuses the block only once it has passed.

use std::time::Duration;

use labs_core::device::FillPattern;
use labs_core::kernels::Kernel;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

pub struct Hazard {
    pub record_stream: bool,
    /// Did the next allocation on the first stream get the freed block back?
    pub reused: bool,
    /// Results the reading stream computed from intact data, out of `n`.
    pub intact: usize,
    pub n: usize,
}

/// An odd element count, so that no block of another experiment has the same size and
/// the allocator's choice for the second allocation is the freed block or a new one.
const N: usize = 300_007;

// ANCHOR: stream_hazard
/// Stream A allocates and fills a block with 1.0; stream B, after some work of its
/// own, reads it (`out = 2 * data`). A frees the block while B has not read it yet, and
/// allocates again: the new block is filled with 7.0 on A.
pub fn run(device: &Device, busy: Duration, record_stream: bool) -> Result<Hazard> {
    let allocator = device.allocator()?;
    let backend = device.backend();
    let (a, b) = (device.new_stream()?, device.new_stream()?);
    let (x, iterations) = crate::busy_work(device, &b, busy)?;
    let out = Tensor::zeros(&[N], DType::F32, device)?;
    device.synchronize()?;

    let data = allocator.malloc(N * 4, &a)?;
    backend.fill(data.ptr(), FillPattern::U32(1.0f32.to_bits()), N, &a)?;
    let filled = device.new_event()?;
    a.record(&filled)?;
    b.wait(&filled)?;
    x.spin_on(iterations, &b)?; // B is busy: its read of `data` comes later
    backend.launch(&Kernel::scale(data.ptr(), 2.0, out.ptr(), N), &b)?;
    if record_stream {
        allocator.record_stream(&data, &b)?; // the cure: B uses this block too
    }
    let freed = data.ptr();
    allocator.free(data)?; // fine for A, whose work on the block is queued before

    let next = allocator.malloc(N * 4, &a)?;
    backend.fill(next.ptr(), FillPattern::U32(7.0f32.to_bits()), N, &a)?;
    let reused = next.ptr() == freed;
    b.synchronize()?;
    a.synchronize()?;
    allocator.free(next)?;
    // ANCHOR_END: stream_hazard
    let intact = out.to_vec::<f32>()?.iter().filter(|&&v| v == 2.0).count();
    Ok(Hazard {
        record_stream,
        reused,
        intact,
        n: N,
    })
}

pub fn table(device: &Device, rows: &[Hazard]) -> Table {
    let mut t = Table::new(
        format!("A block freed on stream A while stream B still reads it, on {device}"),
        &[
            "record_stream",
            "block reused at once",
            "B's results intact",
        ],
    );
    for h in rows {
        t.row([
            h.record_stream.to_string(),
            h.reused.to_string(),
            format!("{} of {}", h.intact, h.n),
        ]);
    }
    t
}
