//! Experiment 7: the memory and time of one training step, three ways, on the same
//! model (a two-layer MLP trained with Adam) and the same batch per device:
//!
//! - DataParallel-style replication: the model, its gradients and Adam's state on the
//!   first device; each step broadcasts the parameters to every device, each replica
//!   runs forward and backward on its share of the batch, and the gradients are summed
//!   back on the first device, which steps. (PyTorch's `DataParallel` also gathers the
//!   outputs on the first device and computes the loss there; here each replica
//!   computes its own share of the loss, so the first device's extra is the reduced
//!   gradients and the optimizer, not the outputs.)
//! - DDP: one replica per device, gradients averaged in buckets during backward,
//!   Adam replicated: every device holds the same.
//! - ZeRO-1: one replica per device, gradients reduce-scattered, Adam's state (and its
//!   copy of the parameters) split across the devices.
//!
//! Each figure is a device's peak during the steps, above what it held before.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use labs_core::alloc::Category;
use labs_core::dist::{self, DistributedDataParallel, ZeroRedundancyOptimizer};
use labs_core::nn::{Mlp, Module, Rng, Sequential};
use labs_core::optim::{Adam, Optimizer};
use labs_core::table::Table;
use labs_core::tensor::no_grad;
use labs_core::{Device, Tensor};

/// The model (`width → hidden → width`) and each device's batch rows.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub width: usize,
    pub hidden: usize,
    pub rows: usize,
    pub steps: usize,
}

impl Sizes {
    /// 2048 → 8192 → 2048 (128 MiB of parameters) and 4096 rows per GPU on GPUs; 256
    /// → 1024 → 256 and 256 rows on simulated ones; 64 → 256 → 64 and 64 rows with
    /// `quick`.
    pub fn for_devices(devices: &[Device], quick: bool) -> Sizes {
        if quick {
            Sizes {
                width: 64,
                hidden: 256,
                rows: 64,
                steps: 3,
            }
        } else if devices[0].is_cuda() {
            Sizes {
                width: 2048,
                hidden: 8192,
                rows: 4096,
                steps: 4,
            }
        } else {
            Sizes {
                width: 256,
                hidden: 1024,
                rows: 256,
                steps: 3,
            }
        }
    }
}

/// How the step shares the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Replicate,
    Ddp,
    Zero1,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Replicate, Mode::Ddp, Mode::Zero1];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Replicate => "DataParallel-style",
            Mode::Ddp => "DDP",
            Mode::Zero1 => "ZeRO-1",
        }
    }
}

/// One device's figures under one mode.
#[derive(Debug, Clone)]
pub struct Row {
    pub mode: Mode,
    pub device: String,
    /// The peak above what the device held before, bytes.
    pub peak: u64,
    /// Adam's state on this device at the end, bytes.
    pub optimizer_state: u64,
    /// The median step time after the first, ms (the slowest device's for DDP).
    pub step_ms: f64,
}

fn model(s: Sizes, device: &Device) -> Result<Sequential> {
    Ok(Mlp::new(
        &[s.width, s.hidden, s.width],
        &mut Rng::seeded(0),
        device,
    )?)
}

/// Device `rank`'s batch of step `step`: inputs and targets.
fn batch(s: Sizes, rank: usize, step: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let _input = Category::Input.scope();
    let seed = 100 * step as u64 + 2 * rank as u64;
    Ok((
        Tensor::randn(&[s.rows, s.width], seed, device)?,
        Tensor::randn(&[s.rows, s.width], seed + 1, device)?,
    ))
}

fn state_bytes(device: &Device) -> Result<u64> {
    Ok(
        device.allocator()?.memory_by_category()[Category::OptimizerState.index()]
            .1
            .current,
    )
}

fn median(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    match ms.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => ms[n / 2],
        n => (ms[n / 2 - 1] + ms[n / 2]) / 2.0,
    }
}

/// Resets every device's peak; returns what each holds now.
fn start(devices: &[Device]) -> Result<Vec<u64>> {
    devices
        .iter()
        .map(|d| {
            d.synchronize()?;
            let a = d.allocator()?;
            a.reset_peak_memory_stats();
            Ok(a.memory_allocated())
        })
        .collect()
}

/// DataParallel's way, from one thread.
fn replicate(devices: &[Device], s: Sizes) -> Result<Vec<Row>> {
    let base = start(devices)?;
    let home = &devices[0];
    let m = model(s, home)?;
    let params = m.parameters();
    let mut adam = Adam::new(params.clone(), 1e-3);
    let mut times = Vec::new();
    for step in 0..s.steps {
        devices.iter().try_for_each(|d| d.synchronize())?;
        let t0 = Instant::now();
        let mut summed: Vec<Option<Tensor>> = vec![None; params.len()];
        for (rank, d) in devices.iter().enumerate() {
            // The broadcast: a fresh replica of every parameter on each device.
            let replica: Vec<Tensor> = {
                let _p = Category::Parameter.scope();
                let _off = no_grad();
                params
                    .iter()
                    .map(|p| Ok(p.to(d)?.detach().requires_grad_(true)))
                    .collect::<Result<_>>()?
            };
            let (x, y) = batch(s, rank, step, d)?;
            let h = x
                .matmul(&replica[0].transpose(0, 1)?)?
                .add(&replica[1])?
                .relu()?;
            let out = h.matmul(&replica[2].transpose(0, 1)?)?.add(&replica[3])?;
            out.mse_loss(&y)?.backward()?;
            // The reduction onto the first device.
            let _off = no_grad();
            for (acc, r) in summed.iter_mut().zip(&replica) {
                let g = r.grad().context("a replica without gradient")?.to(home)?;
                *acc = Some(match acc.take() {
                    None => g,
                    Some(a) => a.add(&g)?,
                });
            }
        }
        for (p, g) in params.iter().zip(summed) {
            let g = g
                .expect("every replica has one")
                .scale(1.0 / devices.len() as f32)?;
            g.set_category(Category::Gradient)?;
            *p.grad_slot().expect("a parameter").lock().unwrap() = Some(g);
        }
        adam.step()?;
        adam.zero_grad(true)?;
        devices.iter().try_for_each(|d| d.synchronize())?;
        if step > 0 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let step_ms = median(times);
    let mut rows = Vec::new();
    for (d, b) in devices.iter().zip(base) {
        rows.push(Row {
            mode: Mode::Replicate,
            device: d.id().to_string(),
            peak: d.allocator()?.max_memory_allocated().saturating_sub(b),
            optimizer_state: state_bytes(d)?,
            step_ms,
        });
    }
    Ok(rows)
}

/// DDP, with Adam replicated or sharded (ZeRO-1), one thread per device.
fn distributed(devices: &[Device], s: Sizes, zero: bool) -> Result<Vec<Row>> {
    let base = start(devices)?;
    let comms = dist::group(devices).context("forming the group")?;
    let results: Vec<Result<(u64, f64)>> = std::thread::scope(|sc| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                // A thread that cannot start drops its communicator: the other ranks
                // see that rank leave.
                std::thread::Builder::new().spawn_scoped(sc, move || -> Result<(u64, f64)> {
                    let comm = Arc::new(c);
                    let (rank, d) = (comm.rank(), comm.device().clone());
                    let m = model(s, &d)?;
                    // ZeRO-1 reduces the gradients itself (a reduce-scatter): no DDP.
                    let (ddp, mut opt): (_, Box<dyn Optimizer>) = if zero {
                        let z =
                            ZeroRedundancyOptimizer::new(m.parameters(), comm.clone(), |shard| {
                                Box::new(Adam::new(shard, 1e-3))
                            })?;
                        (None, Box::new(z))
                    } else {
                        let named = m.named_parameters();
                        let ddp = DistributedDataParallel::new(named, comm.clone())?;
                        (Some(ddp), Box::new(Adam::new(m.parameters(), 1e-3)))
                    };
                    let mut times = Vec::new();
                    // ANCHOR: ddp_step
                    for step in 0..s.steps {
                        comm.barrier()?;
                        let t0 = Instant::now();
                        let (x, y) = batch(s, rank, step, &d)?;
                        m.forward(&x)?.mse_loss(&y)?.backward()?;
                        if let Some(ddp) = &ddp {
                            ddp.finish()?;
                        }
                        opt.step()?;
                        opt.zero_grad(true)?;
                        // ANCHOR_END: ddp_step
                        d.synchronize()?;
                        if step > 0 {
                            times.push(t0.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    Ok((state_bytes(&d)?, median(times)))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| bail!("a rank's thread panicked")),
                Err(e) => bail!("cannot start the rank's thread: {e}"),
            })
            .collect()
    });
    let mut figures = Vec::new();
    for (rank, r) in results.into_iter().enumerate() {
        figures.push(r.with_context(|| format!("rank {rank}"))?);
    }
    let step_ms = figures.iter().map(|f| f.1).fold(0.0, f64::max);
    let mode = if zero { Mode::Zero1 } else { Mode::Ddp };
    let mut rows = Vec::new();
    for ((d, b), (state, _)) in devices.iter().zip(base).zip(figures) {
        rows.push(Row {
            mode,
            device: d.id().to_string(),
            peak: d.allocator()?.max_memory_allocated().saturating_sub(b),
            optimizer_state: state,
            step_ms,
        });
    }
    Ok(rows)
}

/// Every mode on `devices`, one after the other.
pub fn measure(devices: &[Device], s: Sizes) -> Result<Vec<Row>> {
    if s.steps < 2 {
        bail!("the step time needs at least two steps (the first is a warm-up)");
    }
    let mut rows = replicate(devices, s)?;
    rows.extend(distributed(devices, s, false)?);
    rows.extend(distributed(devices, s, true)?);
    Ok(rows)
}

pub fn table(s: Sizes, rows: &[Row]) -> Table {
    let params = (2 * s.width * s.hidden + s.hidden + s.width) as u64 * 4;
    let mut t = Table::new(
        format!(
            "7. One training step three ways (MiB): a {}x{}x{} MLP ({} MiB of parameters) \
             with Adam, {} rows per device",
            s.width,
            s.hidden,
            s.width,
            crate::mib(params),
            s.rows
        ),
        &[
            "mode",
            "device",
            "peak allocated",
            "optimizer state",
            "step (ms)",
        ],
    );
    for r in rows {
        t.row([
            r.mode.name().to_string(),
            r.device.clone(),
            crate::mib(r.peak),
            crate::mib(r.optimizer_state),
            format!("{:.2}", r.step_ms),
        ]);
    }
    t
}
