//! Lazy initialisation: naming a GPU costs nothing; the first real use creates its
//! context, and the first launch of a kernel compiles it. Run this first, before
//! anything else touches the device.

use std::time::{Duration, Instant};

use labs_core::format::duration;
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

pub struct LazyInit {
    pub first_call: Duration,
    pub second_call: Duration,
    pub first_launch: Duration,
    pub second_launch: Duration,
}

// ANCHOR: lazy
/// Times the first and second use of a freshly selected device.
pub fn measure(device: &Device) -> Result<LazyInit> {
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
        let start = Instant::now();
        f()?;
        Ok(start.elapsed())
    };
    // On a GPU the first call creates the context (hundreds of milliseconds).
    let first_call = timed(&mut || device.mem_info().map(drop))?;
    let second_call = timed(&mut || device.mem_info().map(drop))?;
    // The first launch of a kernel also compiles it with NVRTC; later ones reuse it.
    let x = Tensor::zeros(&[1024], labs_core::DType::F32, device)?;
    let first_launch = timed(&mut || {
        x.spin_(1)?;
        device.synchronize()
    })?;
    let second_launch = timed(&mut || {
        x.spin_(1)?;
        device.synchronize()
    })?;
    Ok(LazyInit {
        first_call,
        second_call,
        first_launch,
        second_launch,
    })
}
// ANCHOR_END: lazy

pub fn table(device: &Device, m: &LazyInit) -> Table {
    let mut t = Table::new(
        format!("Lazy initialisation on {device}"),
        &["step", "time"],
    );
    t.row([
        "first device call (creates the context)",
        &duration(m.first_call),
    ]);
    t.row(["second device call", &duration(m.second_call)]);
    t.row([
        "first kernel launch + sync (compiles the kernel)",
        &duration(m.first_launch),
    ]);
    t.row(["second kernel launch + sync", &duration(m.second_launch)]);
    t
}
