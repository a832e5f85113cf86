//! The training run on several devices, one rank each, as `torchrun --nproc_per_node N`
//! runs PyTorch's twin: every rank trains the same model on its own micro-batches
//! (seeded `seed + rank`) with DDP or ZeRO-1; rank 0 reports, with every rank's peaks.
//!
//! Two ways to have the ranks: processes (one per GPU, started by `dist::launch`, each
//! joining the group through `init_process_group`: [`run_launched_rank`]) or threads of
//! this process over simulated or dry-run devices, through the in-process exchange
//! ([`run_in_process`]).

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use indicatif::ProgressBar;
use labs_core::dist::{self, Communicator};
use labs_core::{DType, Device, Tensor};

use super::report::RankFigures;
use super::step::{DataParallel, Trainer};
use super::{run_trainer, TrainConfig, TrainReport};

/// The name the JSON gives `how`.
pub fn name(how: DataParallel) -> &'static str {
    match how {
        DataParallel::Ddp => "ddp",
        DataParallel::Zero1 => "zero1",
        DataParallel::Zero2 => "zero2",
        DataParallel::Zero3 => "zero3",
    }
}

/// One rank's run over `comm`'s group, on its device.
pub fn run_rank(
    config: &TrainConfig,
    comm: Arc<Communicator>,
    how: DataParallel,
    bar: &ProgressBar,
) -> Result<TrainReport> {
    let device = comm.device().clone();
    let world = comm.world_size();
    let mut report = run_trainer(config, &device, bar, world, || {
        Trainer::data_parallel(config, &device, comm, how)
    })?;
    report.data_parallel = Some(name(how).to_string());
    Ok(report)
}

/// The figures of a rank's report.
fn figures(rank: usize, r: &TrainReport) -> RankFigures {
    RankFigures {
        rank,
        peak_allocated: r.peak_allocated,
        peak_reserved: r.peak_reserved,
        step_ms: r.step_ms,
    }
}

/// Every rank on `devices` (simulated or dry-run ones), each on a thread of this
/// process: rank 0's report, with every rank's figures.
pub fn run_in_process(
    config: &TrainConfig,
    devices: &[Device],
    how: DataParallel,
    bar: &ProgressBar,
) -> Result<TrainReport> {
    let comms = dist::group(devices).context("forming the group")?;
    // A rank whose thread cannot start is the error; the ranks already started find
    // their communicators' peers gone (the unstarted ones are dropped) and end.
    let results: Vec<Result<TrainReport>> = std::thread::scope(|s| -> Result<_> {
        let handles = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let hidden = ProgressBar::hidden();
                std::thread::Builder::new()
                    .name(format!("rank {rank}"))
                    .spawn_scoped(s, move || {
                        let bar = if rank == 0 { bar } else { &hidden };
                        run_rank(config, Arc::new(comm), how, bar)
                    })
                    .with_context(|| format!("cannot start the thread of rank {rank}"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a rank's thread panicked")))
            })
            .collect())
    })?;
    // A rank that fails leaves the group, and every other rank then fails in its next
    // collective ("... left the group"): the error worth reporting is the one of a
    // rank that failed on its own, if any did.
    let cause = results
        .iter()
        .position(|r| matches!(r, Err(e) if !format!("{e:#}").contains("left the group")));
    if let Some(rank) = cause {
        let r = results
            .into_iter()
            .nth(rank)
            .expect("a position of results");
        return r.with_context(|| format!("rank {rank}"));
    }
    let mut reports = Vec::with_capacity(results.len());
    for (rank, r) in results.into_iter().enumerate() {
        reports.push(r.with_context(|| format!("rank {rank}"))?);
    }
    let ranks = reports
        .iter()
        .enumerate()
        .map(|(rank, r)| figures(rank, r))
        .collect();
    let mut report = reports.swap_remove(0);
    report.ranks = Some(ranks);
    Ok(report)
}

/// Rank 0 of a dry run of `world` ranks on `device` (a dry-run device), the other ranks
/// not run ([`dist::dry_lone_rank`]): rank 0's report, equal to [`run_in_process`]'s on
/// `world` dry-run devices, with no thread started (the book's calculator runs it in the
/// browser). `ranks` is null: the others were not measured.
pub fn run_lone_rank(
    config: &TrainConfig,
    device: &Device,
    world: usize,
    how: DataParallel,
) -> Result<TrainReport> {
    let comm = dist::dry_lone_rank(device, world).context("forming the group")?;
    run_rank(config, Arc::new(comm), how, &ProgressBar::hidden())
}

/// This process's rank of a job `dist::launch` (or `torchrun`) started: joins the group
/// on `device`, trains, and gathers every rank's figures. Rank 0's report, `None` on
/// the other ranks.
pub fn run_launched_rank(
    config: &TrainConfig,
    device: Device,
    how: DataParallel,
    bar: &ProgressBar,
) -> Result<Option<TrainReport>> {
    let comm = dist::init_process_group_with(dist::ProcessGroupOptions {
        device: Some(device),
        ..Default::default()
    })
    .context("joining the process group")?;
    let comm = Arc::new(comm);
    let rank = comm.rank();
    let mut report = run_rank(config, comm.clone(), how, bar)?;
    let ranks = gather_figures(&comm, &report)?;
    if rank != 0 {
        return Ok(None);
    }
    report.ranks = Some(ranks);
    Ok(Some(report))
}

/// Every rank's peaks and step time, on every rank: an all-gather of three int64 (the
/// step in nanoseconds, -1 for none), as PyTorch's twin gathers them.
fn gather_figures(comm: &Communicator, report: &TrainReport) -> Result<Vec<RankFigures>> {
    let device = comm.device();
    let step_ns = report.step_ms.map_or(-1, |ms| (ms * 1e6).round() as i64);
    let mine = [
        report.peak_allocated as i64,
        report.peak_reserved as i64,
        step_ns,
    ];
    let mine = Tensor::from_slice(&mine, &[3], device)?;
    let every = Tensor::zeros(&[3 * comm.world_size()], DType::I64, device)?;
    comm.all_gather(&mine, &every)?.synchronize()?;
    let every = every.to_vec::<i64>()?;
    Ok(every
        .chunks(3)
        .enumerate()
        .map(|(rank, v)| RankFigures {
            rank,
            peak_allocated: v[0] as u64,
            peak_reserved: v[1] as u64,
            step_ms: (v[2] >= 0).then(|| v[2] as f64 / 1e6),
        })
        .collect())
}
