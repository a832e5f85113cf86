//! Experiment 8: the memory no caching allocator sees. `memory_reserved()` counts what
//! the allocator took from the driver; `nvidia-smi` counts everything the process holds
//! on the GPU, and the difference is made elsewhere: the CUDA context (the driver's own
//! state and the kernels' code, made at the device's first use), and NCCL's
//! communicator (its buffers and channels to every peer, made when the communicator is
//! created and when its first collective runs). Measured here with the driver's count
//! of the device's used memory (`cudaMemGetInfo`'s total less its free) at each step,
//! beside the allocator's reserved bytes.
//!
//! Run it in a process of its own (`lab-04 --device cuda outside`): the first step is
//! the device's first use, and any other work before it would be counted as context.

use anyhow::{Context, Result};
use labs_core::dist::{self, ReduceOp};
use labs_core::table::Table;
use labs_core::{DType, Device, Tensor};

use crate::mib;

/// One device's used memory after each step, bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub device: String,
    /// After the device's first use: the CUDA context (and other processes' memory).
    pub context: u64,
    /// After the communicator of every device was made.
    pub communicator: u64,
    /// After a first all-reduce of 1 MiB on every rank.
    pub first_collective: u64,
    /// The caching allocator's reserved bytes then.
    pub reserved: u64,
}

impl Row {
    /// Used memory the allocator did not take.
    pub fn outside(&self) -> u64 {
        self.first_collective.saturating_sub(self.reserved)
    }
}

fn used(d: &Device) -> Result<u64> {
    let m = d.mem_info()?;
    Ok(m.total - m.free)
}

// ANCHOR: outside
/// The steps, on every device of `devices` (one rank each, threads of this process).
pub fn run(devices: &[Device]) -> Result<Vec<Row>> {
    let context: Vec<u64> = devices.iter().map(used).collect::<Result<_>>()?;
    let comms = dist::group(devices).context("making the communicators")?;
    let communicator: Vec<u64> = devices.iter().map(used).collect::<Result<_>>()?;
    std::thread::scope(|s| -> Result<()> {
        let ranks: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || -> Result<()> {
                    let device = comm.device();
                    let t = Tensor::zeros(&[1 << 18], DType::F32, device)?;
                    comm.all_reduce(&t, ReduceOp::Sum)?.wait()?;
                    device.synchronize()?;
                    Ok(())
                })
            })
            .collect();
        for r in ranks {
            r.join().expect("a rank's thread panicked")?;
        }
        Ok(())
    })?;
    let mut rows = Vec::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        rows.push(Row {
            device: d.id().to_string(),
            context: context[i],
            communicator: communicator[i],
            first_collective: used(d)?,
            reserved: d.allocator()?.stats().reserved.current,
        });
    }
    drop(comms);
    Ok(rows)
}
// ANCHOR_END: outside

/// The rows as the chapter's table: each step's increase, in MiB.
pub fn table(rows: &[Row]) -> String {
    let mut t = Table::new(
        "Memory outside the caching allocator, used per device after each step",
        &[
            "device",
            "context MiB",
            "+ communicator MiB",
            "+ first all-reduce MiB",
            "allocator reserved MiB",
            "outside the allocator MiB",
        ],
    );
    for r in rows {
        t.row(vec![
            r.device.clone(),
            mib(r.context),
            mib(r.communicator.saturating_sub(r.context)),
            mib(r.first_collective.saturating_sub(r.communicator)),
            mib(r.reserved),
            mib(r.outside()),
        ]);
    }
    t.to_string()
}
