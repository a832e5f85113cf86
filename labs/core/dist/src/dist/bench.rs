//! Timing one collective the way `nccl-tests` does: `iters` back-to-back calls between
//! two events, the result checked once beforehand, and the two bandwidths of its table.
//! The algorithm bandwidth is the size over the time; the bus bandwidth scales it by
//! what each rank must send and receive, so that it compares with the links' speed
//! whatever the number of ranks.

use std::time::Duration;

use super::communicator::{Communicator, ReduceOp};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The collectives the benchmark times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
}

impl std::fmt::Display for BenchOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
        })
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveTiming {
    pub op: BenchOp,
    pub dtype: DType,
    /// `nccl-tests`' size: the buffer of `all_reduce` and `broadcast`, the whole output
    /// of `all_gather`, the whole input of `reduce_scatter`.
    pub bytes: usize,
    pub world_size: usize,
    /// Per call.
    pub time: Duration,
    /// Bytes per second: `bytes / time`.
    pub algbw: f64,
    /// Bytes per second: `algbw` times [`bus_bandwidth_factor`].
    pub busbw: f64,
}

// ANCHOR: bus_factor
/// `nccl-tests`' factor from algorithm to bus bandwidth on `n` ranks: all-reduce moves
/// each byte out and back in (2(n-1)/n), all-gather and reduce-scatter once ((n-1)/n),
/// broadcast once (1).
pub fn bus_bandwidth_factor(op: BenchOp, n: usize) -> f64 {
    let n = n as f64;
    match op {
        BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
        BenchOp::AllGather | BenchOp::ReduceScatter => (n - 1.0) / n,
        BenchOp::Broadcast => 1.0,
    }
}
// ANCHOR_END: bus_factor

/// Times `op` on `bytes` of `dtype` (a float dtype; rounded down to whole elements per
/// rank): every rank calls it together.
/// Checks the result of one call against the host's arithmetic, then times `iters`
/// calls after `warmup` untimed ones.
pub fn time_collective(
    comm: &Communicator,
    op: BenchOp,
    bytes: usize,
    dtype: DType,
    warmup: usize,
    iters: usize,
) -> Result<CollectiveTiming> {
    let n = comm.world_size();
    let rank = comm.rank();
    let per_rank = match op {
        BenchOp::AllReduce | BenchOp::Broadcast => bytes,
        BenchOp::AllGather | BenchOp::ReduceScatter => bytes / n,
    } / dtype.size();
    if per_rank == 0 || !crate::tensor::is_floating_point(dtype) {
        return Err(Error::InvalidArgument(format!(
            "time_collective: {bytes} bytes of {dtype} is not a float buffer of at least \
             one element per rank"
        )));
    }
    // The size actually timed: whole elements, a whole share per rank.
    let bytes = match op {
        BenchOp::AllReduce | BenchOp::Broadcast => per_rank,
        BenchOp::AllGather | BenchOp::ReduceScatter => per_rank * n,
    } * dtype.size();
    let device = comm.device();
    // Small integers, exact in every float dtype: rank r contributes r + 1.
    let value = (rank + 1) as f32;
    let (input, output, expected) = match op {
        BenchOp::AllReduce => (per_rank, None, (n * (n + 1) / 2) as f32),
        BenchOp::Broadcast => (per_rank, None, 1.0),
        BenchOp::AllGather => (per_rank, Some(per_rank * n), f32::NAN),
        BenchOp::ReduceScatter => (per_rank * n, Some(per_rank), (n * (n + 1) / 2) as f32),
    };
    let x = Tensor::full(&[input], value, device)?.to_dtype(dtype)?;
    let y = match output {
        Some(len) => Some(Tensor::zeros(&[len], dtype, device)?),
        None => None,
    };
    let run = || -> Result<()> {
        let work = match (op, &y) {
            (BenchOp::AllReduce, _) => comm.all_reduce(&x, ReduceOp::Sum)?,
            (BenchOp::Broadcast, _) => comm.broadcast(&x, 0)?,
            (BenchOp::AllGather, Some(y)) => comm.all_gather(&x, y)?,
            (BenchOp::ReduceScatter, Some(y)) => comm.reduce_scatter(&x, y, ReduceOp::Sum)?,
            _ => unreachable!("outputs are made for the collectives that have one"),
        };
        work.wait()
    };
    run()?;
    let got = y
        .as_ref()
        .unwrap_or(&x)
        .to_dtype(DType::F32)?
        .to_vec::<f32>()?;
    let wrong = got.iter().enumerate().find(|&(i, &v)| {
        let want = match op {
            BenchOp::AllGather => (i / per_rank + 1) as f32,
            _ => expected,
        };
        v != want
    });
    if let Some((i, v)) = wrong {
        return Err(Error::Distributed(format!(
            "{op} on rank {rank} of {n}: element {i} is {v}, not the expected value"
        )));
    }
    for _ in 0..warmup {
        run()?;
    }
    let stream = device.default_stream()?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    stream.record(&start)?;
    for _ in 0..iters.max(1) {
        run()?;
    }
    stream.record(&end)?;
    end.synchronize()?;
    let time = Duration::from_secs_f64(start.elapsed_ms(&end)? as f64 / 1e3 / iters.max(1) as f64);
    let algbw = bytes as f64 / time.as_secs_f64().max(1e-12);
    Ok(CollectiveTiming {
        op,
        dtype,
        bytes,
        world_size: n,
        time,
        algbw,
        busbw: algbw * bus_bandwidth_factor(op, n),
    })
}
