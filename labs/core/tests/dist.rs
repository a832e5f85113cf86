//! Collectives (`labs_core::dist`): on two and three simulated GPUs whatever the device
//! under test, and on the device under test's own group: under `LABS_DEVICE=cuda`,
//! NCCL over every GPU of the machine. The rendezvous and the launcher are tested in
//! `dist_launch.rs`.

use std::time::{Duration, Instant};

use half::{bf16, f16};
use labs_core::dist::{self, BenchOp, Communicator, ReduceOp};
use labs_core::testing::test_device;
use labs_core::{DType, Device, DeviceId, Error, Tensor};

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::U8,
];

fn sim_devices(first: usize, n: usize) -> Vec<Device> {
    // The tests use up to eight simulated GPUs (one process holds them all).
    labs_core::device::set_sim_device_count(8).unwrap();
    (first..first + n)
        .map(|i| Device::get(DeviceId::Sim(i)).unwrap())
        .collect()
}

/// The group of the device under test: every GPU through NCCL, or two simulated GPUs.
fn group_under_test() -> Vec<Communicator> {
    let d = test_device();
    if d.is_cuda() {
        let n = labs_core::cuda::device_count().unwrap();
        let gpus: Vec<Device> = (0..n)
            .map(|i| Device::get(DeviceId::Cuda(i)).unwrap())
            .collect();
        dist::nccl_group(&gpus).unwrap()
    } else {
        dist::sim_group(&sim_devices(0, 2)).unwrap()
    }
}

/// Runs `f` on every rank, each on its own thread, and returns their results in rank
/// order.
fn on_ranks<T: Send>(comms: Vec<Communicator>, f: impl Fn(&Communicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `rank`'s element `i`: small values, exact in every dtype (halves for floats,
/// non-negative for uint8).
fn value(dtype: DType, rank: usize, i: usize) -> f64 {
    let base = ((rank * 5 + i * 3) % 13) as f64;
    match dtype {
        DType::U8 => base,
        DType::I32 | DType::I64 => base - 6.0,
        _ => base - 6.0 + if i % 2 == 1 { 0.5 } else { 0.0 },
    }
}

/// `x` in `dtype`: rounded as a collective that combines in float64 and rounds once, or
/// wrapped.
fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::F32 => x as f32 as f64,
        // Integers wrap, as on the GPU (uint8 products overflow here).
        DType::U8 => (x as i64).rem_euclid(256) as f64,
        DType::I32 => x as i64 as i32 as f64,
        _ => x,
    }
}

fn tensor(dtype: DType, values: &[f64], device: &Device) -> Tensor {
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    Tensor::from_slice(&v, &[v.len()], device)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn read(t: &Tensor) -> Vec<f64> {
    let v = t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    v.into_iter().map(f64::from).collect()
}

fn reduce(op: ReduceOp, dtype: DType, world: usize, i: usize) -> f64 {
    let xs = (0..world).map(|r| value(dtype, r, i));
    let exact = match op {
        ReduceOp::Sum => xs.sum(),
        ReduceOp::Avg => xs.sum::<f64>() / world as f64,
        ReduceOp::Max => xs.fold(f64::MIN, f64::max),
        ReduceOp::Product => xs.product(),
        ReduceOp::Min => xs.fold(f64::MAX, f64::min),
    };
    round_to(dtype, exact)
}

/// Every collective in every dtype on `comms`, against the host's arithmetic.
fn check_every_collective(comms: Vec<Communicator>) {
    let world = comms.len();
    on_ranks(comms, |c| {
        let (rank, d) = (c.rank(), c.device().clone());
        for dtype in DTYPES {
            let n = 7;
            let mine: Vec<f64> = (0..n).map(|i| value(dtype, rank, i)).collect();
            let float = !matches!(dtype, DType::I32 | DType::I64 | DType::U8);
            let ops = [
                ReduceOp::Sum,
                ReduceOp::Avg,
                ReduceOp::Product,
                ReduceOp::Max,
                ReduceOp::Min,
            ];
            for op in ops {
                if op == ReduceOp::Avg && !float {
                    continue;
                }
                let t = tensor(dtype, &mine, &d);
                c.all_reduce(&t, op).unwrap().wait().unwrap();
                let want: Vec<f64> = (0..n).map(|i| reduce(op, dtype, world, i)).collect();
                let got = read(&t);
                let rounds_more = match op {
                    ReduceOp::Avg => !world.is_power_of_two(),
                    ReduceOp::Product => world > 2,
                    _ => false,
                };
                if float && d.is_cuda() && rounds_more {
                    // NCCL averages as a sum of x / n and multiplies rank after rank,
                    // rounding each step: within an ulp or two of rounding once.
                    let eps = match dtype {
                        DType::F16 => 1e-3,
                        DType::BF16 => 8e-3,
                        _ => 2e-7,
                    };
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 2.0 * eps * w.abs().max(1.0),
                            "{got:?} {want:?}"
                        );
                    }
                } else {
                    assert_eq!(got, want, "all_reduce({op}) {dtype} rank {rank}");
                }
            }
            let root = world - 1;
            let t = tensor(dtype, &mine, &d);
            c.broadcast(&t, root).unwrap().wait().unwrap();
            let want: Vec<f64> = (0..n).map(|i| value(dtype, root, i)).collect();
            assert_eq!(read(&t), want, "broadcast {dtype} rank {rank}");

            let out = Tensor::zeros(&[world, n], dtype, &d).unwrap();
            c.all_gather(&tensor(dtype, &mine, &d), &out)
                .unwrap()
                .wait()
                .unwrap();
            let want: Vec<f64> = (0..world * n).map(|j| value(dtype, j / n, j % n)).collect();
            assert_eq!(read(&out), want, "all_gather {dtype} rank {rank}");

            for op in [ReduceOp::Sum, ReduceOp::Max] {
                let input: Vec<f64> = (0..world * n).map(|i| value(dtype, rank, i)).collect();
                let out = Tensor::zeros(&[n], dtype, &d).unwrap();
                c.reduce_scatter(&tensor(dtype, &input, &d), &out, op)
                    .unwrap()
                    .wait()
                    .unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| reduce(op, dtype, world, rank * n + i))
                    .collect();
                assert_eq!(read(&out), want, "reduce_scatter({op}) {dtype} rank {rank}");
            }
        }
        c.barrier().unwrap();
    });
}

#[test]
fn every_collective_on_two_simulated_gpus() {
    check_every_collective(dist::sim_group(&sim_devices(0, 2)).unwrap());
}

#[test]
fn every_collective_on_three_simulated_gpus() {
    check_every_collective(dist::sim_group(&sim_devices(0, 3)).unwrap());
}

#[test]
fn every_collective_on_the_device_under_test() {
    let comms = group_under_test();
    assert_eq!(comms[0].device().is_cuda(), test_device().is_cuda());
    check_every_collective(comms);
}

#[test]
fn communicator_reports_its_place() {
    let comms = dist::group(&sim_devices(0, 3)).unwrap();
    for (r, c) in comms.iter().enumerate() {
        assert_eq!((c.rank(), c.world_size()), (r, 3));
        assert_eq!(c.device().id(), DeviceId::Sim(r));
        // Collectives go to a stream of their own, not the default stream.
        let default = c.device().default_stream().unwrap();
        assert_ne!(c.stream().handle(), default.handle());
    }
}

/// `set_stream` puts collectives on a stream of the caller's (here the default stream,
/// where no event is needed); a stream of another device is refused.
#[test]
fn collectives_run_on_a_chosen_stream() {
    let mut comms = dist::sim_group(&sim_devices(0, 2)).unwrap();
    let elsewhere = comms[1].device().default_stream().unwrap();
    assert!(matches!(
        comms[0].set_stream(Some(elsewhere)).err().unwrap(),
        Error::WrongDevice { .. }
    ));
    for c in comms.iter_mut() {
        let s = c.device().default_stream().unwrap();
        c.set_stream(Some(s.clone())).unwrap();
        assert_eq!(c.stream().handle(), s.handle());
    }
    on_ranks(comms, |c| {
        let t = Tensor::full(&[3], (c.rank() + 1) as f32, c.device()).unwrap();
        c.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0; 3]);
    });
}

// ANCHOR: ordering_test
/// A slow producer on the default stream, the collective on the communication stream,
/// a consumer on the default stream: the collective sees the producer's values and the
/// consumer the collective's, because of the events between the streams.
#[test]
fn collective_is_ordered_between_producer_and_consumer() {
    let comms = group_under_test();
    let world = comms.len();
    on_ranks(comms, |c| {
        let d = c.device();
        let stream = d.default_stream().unwrap();
        let busy = Tensor::zeros(&[1024], DType::F32, d).unwrap();
        let spin =
            labs_core::timing::calibrate_spin(&busy, &stream, Duration::from_millis(50)).unwrap();
        for round in 0..3 {
            let base = Tensor::full(&[4096], (c.rank() + 1) as f32, d).unwrap();
            busy.spin_on(spin, &stream).unwrap();
            let produced = base.scale(2.0).unwrap(); // runs after the spin
            let work = c.all_reduce(&produced, ReduceOp::Sum).unwrap();
            work.wait().unwrap();
            let consumed = produced.scale(0.5).unwrap();
            // Each rank produced 2(r + 1); the sum over ranks, halved: Σ(r + 1).
            let want = (world * (world + 1) / 2) as f32;
            let got = consumed.to_vec::<f32>().unwrap();
            assert!(
                got.iter().all(|&v| v == want),
                "round {round} rank {}: {:?}",
                c.rank(),
                &got[..4]
            );
            work.synchronize().unwrap();
            assert!(work.is_completed().unwrap());
        }
    });
}
// ANCHOR_END: ordering_test

/// A tensor freed while its collective is in flight keeps its block until the default
/// stream waits for the collective, and gives it back then: at a point of the program,
/// whatever the collective's timing, so that two runs of one program reserve alike.
#[test]
fn a_collectives_tensors_are_held_until_it_is_waited_for() {
    let comms = group_under_test();
    on_ranks(comms, |c| {
        let d = c.device();
        let stream = d.default_stream().unwrap();
        let busy = Tensor::zeros(&[1024], DType::F32, d).unwrap();
        let spin =
            labs_core::timing::calibrate_spin(&busy, &stream, Duration::from_millis(20)).unwrap();
        // 4 MiB: a block of its own in the large pool.
        let n = 1 << 20;
        for round in 0..3 {
            busy.spin_on(spin, &stream).unwrap();
            let sent = Tensor::full(&[n], 1.0, d).unwrap();
            let place = sent.ptr();
            let work = c.all_reduce(&sent, ReduceOp::Sum).unwrap();
            drop(sent);
            let meanwhile = Tensor::zeros(&[n], DType::F32, d).unwrap();
            assert_ne!(
                meanwhile.ptr(),
                place,
                "round {round}: reused while in flight"
            );
            work.wait().unwrap();
            drop(meanwhile);
            let after = Tensor::zeros(&[n], DType::F32, d).unwrap();
            // Both blocks are free now; best fit takes either, so ask for both.
            let second = Tensor::zeros(&[n], DType::F32, d).unwrap();
            assert!(
                after.ptr() == place || second.ptr() == place,
                "round {round}: the block was not given back at wait"
            );
            stream.synchronize().unwrap();
        }
    });
}

fn distributed_message(e: Error) -> String {
    match e {
        Error::Distributed(m) => m,
        other => panic!("expected a distributed error, got {other:?}"),
    }
}

#[test]
fn ranks_that_disagree_fail_clearly_instead_of_hanging() {
    let comms = dist::sim_group(&sim_devices(0, 2)).unwrap();
    let started = Instant::now();
    let errors = on_ranks(comms, |c| {
        let t = Tensor::zeros(&[4 + c.rank()], DType::F32, c.device()).unwrap();
        let shapes = c.all_reduce(&t, ReduceOp::Sum).err().unwrap();
        let t = Tensor::zeros(&[4], DType::F32, c.device()).unwrap();
        let kinds = match c.rank() {
            0 => c.all_reduce(&t, ReduceOp::Sum),
            _ => c.broadcast(&t, 0),
        }
        .err()
        .unwrap();
        // The group still works once the ranks agree again.
        c.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        (distributed_message(shapes), distributed_message(kinds))
    });
    assert!(started.elapsed() < Duration::from_secs(10));
    for (shapes, kinds) in errors {
        assert!(shapes.contains("differs across ranks"), "{shapes}");
        assert!(
            shapes.contains("rank 0 called all_reduce(sum) of 4 float32")
                && shapes.contains("rank 1 called all_reduce(sum) of 5 float32"),
            "{shapes}"
        );
        assert!(kinds.contains("broadcast(root=0)"), "{kinds}");
    }
}

#[test]
fn a_rank_that_leaves_or_never_comes_is_an_error() {
    let mut comms = dist::sim_group(&sim_devices(0, 2)).unwrap();
    drop(comms.pop());
    let t = Tensor::zeros(&[4], DType::F32, comms[0].device()).unwrap();
    let e = distributed_message(comms[0].all_reduce(&t, ReduceOp::Sum).err().unwrap());
    assert!(e.contains("rank 1 left the group"), "{e}");

    let comms =
        dist::sim_group_with_timeout(&sim_devices(0, 2), Duration::from_millis(200)).unwrap();
    let started = Instant::now();
    let e = distributed_message(comms[0].all_reduce(&t, ReduceOp::Sum).err().unwrap());
    assert!(e.contains("timed out") && e.contains("[1]"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn bad_arguments_are_refused_before_any_exchange() {
    let comms = dist::sim_group(&sim_devices(0, 2)).unwrap();
    let c = &comms[0];
    let d = c.device();
    let invalid = |e: Error| match e {
        Error::InvalidArgument(m) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let x = Tensor::zeros(&[4], DType::F32, d).unwrap();
    let wrong = Tensor::zeros(&[7], DType::F32, d).unwrap();
    let e = invalid(c.all_gather(&x, &wrong).err().unwrap());
    assert!(
        e.contains("output has 7 elements") && e.contains("needs 8"),
        "{e}"
    );
    let e = invalid(c.reduce_scatter(&wrong, &x, ReduceOp::Sum).err().unwrap());
    assert!(
        e.contains("input has 7 elements") && e.contains("needs 8"),
        "{e}"
    );
    let m = Tensor::zeros(&[2, 3], DType::F32, d)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let e = invalid(c.all_reduce(&m, ReduceOp::Sum).err().unwrap());
    assert!(e.contains("contiguous"), "{e}");
    let elsewhere = Tensor::zeros(&[4], DType::F32, comms[1].device()).unwrap();
    let e = invalid(c.all_reduce(&elsewhere, ReduceOp::Sum).err().unwrap());
    assert!(e.contains("sim:1") && e.contains("sim:0"), "{e}");
    let e = invalid(c.broadcast(&x, 2).err().unwrap());
    assert!(e.contains("root 2"), "{e}");
    let ints = Tensor::zeros(&[4], DType::I32, d).unwrap();
    assert!(matches!(
        c.all_reduce(&ints, ReduceOp::Avg).err().unwrap(),
        Error::DType {
            op: "all_reduce",
            ..
        }
    ));
    let halves = Tensor::zeros(&[8], DType::F16, d).unwrap();
    assert!(matches!(
        c.all_gather(&x, &halves).err().unwrap(),
        Error::DTypeMismatch { .. }
    ));
    // None of these reached the exchange: the group is still in step.
    on_ranks(comms, |c| {
        let t = Tensor::full(&[2], 1.0f32, c.device()).unwrap();
        c.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
    });
}

/// Dry runs meet and check each other, without values: memory is all they predict.
#[test]
fn dry_runs_form_groups_without_data() {
    let dry: Vec<Device> = (0..2)
        .map(|i| Device::get(DeviceId::Dry(i)).unwrap())
        .collect();
    let errors = on_ranks(dist::sim_group(&dry).unwrap(), |c| {
        let t = Tensor::empty(&[1 << 20], DType::BF16, c.device()).unwrap();
        c.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
        let out = Tensor::empty(&[2 << 20], DType::BF16, c.device()).unwrap();
        c.all_gather(&t, &out).unwrap().wait().unwrap();
        let odd = Tensor::empty(&[1 + c.rank()], DType::BF16, c.device()).unwrap();
        c.all_reduce(&odd, ReduceOp::Sum).err().unwrap()
    });
    for e in errors {
        assert!(e.to_string().contains("differs across ranks"), "{e}");
    }
}

#[test]
fn groups_refuse_devices_their_transport_cannot_serve() {
    let dry = Device::get(DeviceId::Dry(0)).unwrap();
    let sim = Device::get(DeviceId::Sim(0)).unwrap();
    let e = dist::sim_group(&[sim.clone(), dry]).err().unwrap();
    assert!(e.to_string().contains("dry:0"), "{e}");
    let e = dist::sim_group(&[sim.clone(), sim.clone()]).err().unwrap();
    assert!(e.to_string().contains("listed twice"), "{e}");
    let e = dist::nccl_group(&[sim]).err().unwrap();
    assert!(e.to_string().contains("sim_group"), "{e}");
    assert!(dist::group(&[]).is_err());
}

#[test]
fn nccl_is_found_or_named_when_missing() {
    match labs_core::cuda::nccl::unique_id() {
        Ok(id) => {
            assert!(id.iter().any(|&b| b != 0));
            // bfloat16 and ReduceOp::Avg need NCCL 2.10 (version code 21000) or later.
            let version = labs_core::cuda::nccl::version().unwrap();
            assert!(version >= 21000, "NCCL version code {version}");
        }
        Err(e) => {
            assert!(!test_device().is_cuda(), "NCCL is needed on the GPU: {e}");
            assert!(e.to_string().contains("libnccl.so.2"), "{e}");
        }
    }
}

#[test]
fn benchmark_times_and_scales_bandwidth() {
    assert_eq!(dist::bus_bandwidth_factor(BenchOp::AllReduce, 4), 1.5);
    assert_eq!(dist::bus_bandwidth_factor(BenchOp::AllGather, 4), 0.75);
    assert_eq!(dist::bus_bandwidth_factor(BenchOp::ReduceScatter, 2), 0.5);
    assert_eq!(dist::bus_bandwidth_factor(BenchOp::Broadcast, 8), 1.0);
    let comms = group_under_test();
    let world = comms.len();
    let rows = on_ranks(comms, |c| {
        let ops = [
            BenchOp::AllReduce,
            BenchOp::AllGather,
            BenchOp::ReduceScatter,
            BenchOp::Broadcast,
        ];
        ops.map(|op| dist::time_collective(c, op, 1 << 16, DType::BF16, 1, 3).unwrap())
    });
    for row in rows.iter().flatten() {
        assert_eq!(row.world_size, world);
        assert_eq!(row.bytes, 1 << 16);
        assert!(row.time > Duration::ZERO, "{row:?}");
        let seconds = row.time.as_secs_f64();
        assert!(
            (row.algbw * seconds / row.bytes as f64 - 1.0).abs() < 1e-6,
            "{row:?}"
        );
        let factor = dist::bus_bandwidth_factor(row.op, world);
        assert!((row.busbw - row.algbw * factor).abs() <= 1e-9 * row.algbw.max(1.0));
    }
}

/// A large group whose ranks all disagree: the error names a few calls and counts the
/// rest, on one short line.
#[test]
fn a_large_groups_disagreement_is_one_short_line() {
    let dry: Vec<Device> = (0..48).map(|_| Device::new_dry(64 << 20)).collect();
    let errors = on_ranks(dist::sim_group(&dry).unwrap(), |c| {
        let odd = Tensor::empty(&[1 + c.rank()], DType::BF16, c.device()).unwrap();
        distributed_message(c.all_reduce(&odd, ReduceOp::Sum).err().unwrap())
    });
    for e in errors {
        assert!(e.contains("differs across ranks"), "{e}");
        assert!(
            e.contains("rank 0 called all_reduce(sum) of 1 bfloat16"),
            "{e}"
        );
        assert!(e.len() < 400 && !e.contains('\n'), "{} bytes: {e}", e.len());
        assert!(e.contains("44 more ranks made 44 other calls"), "{e}");
    }
}
