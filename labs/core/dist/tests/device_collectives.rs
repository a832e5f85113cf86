//! The collectives of the device contract, through the device layer alone: two
//! simulated GPUs on two threads run each collective in a least exchange written here,
//! dry devices meet without moving data, and a simulated GPU refuses what only NCCL
//! offers.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use labs_base::dtype::DType;
use labs_base::error::Result;
use labs_device::backend::{CollectiveCall, CollectiveKind, Exchange, Inputs, ReduceOp};
use labs_device::Device;
use labs_tensor::Tensor;

/// Each rank's signature and input to one collective, once deposited.
type Deposits = Vec<Option<(String, Vec<u8>)>>;

/// The least exchange: every rank's input to a collective once all have come, and
/// the ranks that left.
struct Meeting {
    world: usize,
    rounds: Mutex<HashMap<u64, Deposits>>,
    left: Mutex<Vec<usize>>,
    arrived: Condvar,
}

impl Meeting {
    fn new(world: usize) -> Arc<Meeting> {
        Arc::new(Meeting {
            world,
            rounds: Mutex::default(),
            left: Mutex::default(),
            arrived: Condvar::new(),
        })
    }
}

impl Exchange for Meeting {
    fn exchange(&self, rank: usize, seq: u64, sig: &str, input: Vec<u8>) -> Result<Inputs> {
        let mut rounds = self.rounds.lock().unwrap();
        let round = rounds.entry(seq).or_insert_with(|| vec![None; self.world]);
        round[rank] = Some((sig.to_string(), input));
        self.arrived.notify_all();
        loop {
            let round = &rounds[&seq];
            if round.iter().all(Option::is_some) {
                let sigs: Vec<&str> = round.iter().flatten().map(|(s, _)| &**s).collect();
                assert!(sigs.iter().all(|s| *s == sig), "{sigs:?}");
                return Ok(Arc::new(
                    round.iter().flatten().map(|d| d.1.clone()).collect(),
                ));
            }
            rounds = self.arrived.wait(rounds).unwrap();
        }
    }

    fn leave(&self, rank: usize) {
        self.left.lock().unwrap().push(rank);
    }
}

/// Runs `kind` on two new simulated GPUs, each rank on its own thread with `input`
/// of its rank and an output of `out_len` elements; returns each rank's output.
fn on_two(kind: CollectiveKind, input: fn(usize) -> Vec<f32>, out_len: usize) -> Vec<Vec<f32>> {
    let devices = [Device::new_sim(64 << 20), Device::new_sim(64 << 20)];
    let meeting = Meeting::new(2);
    let outputs = std::thread::scope(|s| {
        let ranks: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, d)| {
                let meeting = meeting.clone();
                s.spawn(move || {
                    let transport = d.comm_exchange(rank, 2, meeting).unwrap();
                    let values = input(rank);
                    let send = Tensor::from_slice(&values, &[values.len()], d).unwrap();
                    let recv = Tensor::zeros(&[out_len], DType::F32, d).unwrap();
                    let call = CollectiveCall {
                        kind,
                        dtype: DType::F32,
                        send: send.ptr(),
                        recv: recv.ptr(),
                        count: match kind {
                            CollectiveKind::ReduceScatter(_) => out_len,
                            _ => values.len(),
                        },
                    };
                    transport.run(&call, &d.default_stream().unwrap()).unwrap();
                    recv.to_vec::<f32>().unwrap()
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Both transports are gone: each left the exchange.
    let mut left = meeting.left.lock().unwrap().clone();
    left.sort();
    assert_eq!(left, [0, 1]);
    outputs
}

#[test]
fn simulated_gpus_run_each_collective_through_the_device_layer() {
    let input = |rank: usize| vec![1.0 + rank as f32, 10.0 * (rank as f32 + 1.0)];
    let sum = on_two(CollectiveKind::AllReduce(ReduceOp::Sum), input, 2);
    assert_eq!(sum, [[3.0, 30.0], [3.0, 30.0]]);
    let max = on_two(CollectiveKind::AllReduce(ReduceOp::Max), input, 2);
    assert_eq!(max, [[2.0, 20.0], [2.0, 20.0]]);
    let root = on_two(CollectiveKind::Broadcast { root: 1 }, input, 2);
    assert_eq!(root, [[2.0, 20.0], [2.0, 20.0]]);
    let gathered = on_two(CollectiveKind::AllGather, input, 4);
    assert_eq!(gathered, [[1.0, 10.0, 2.0, 20.0], [1.0, 10.0, 2.0, 20.0]]);
    let scattered = on_two(CollectiveKind::ReduceScatter(ReduceOp::Sum), input, 1);
    assert_eq!(scattered, [[3.0], [30.0]]);
}

#[test]
fn dry_runs_meet_without_moving_data() {
    let devices = [Device::new_dry(64 << 20), Device::new_dry(64 << 20)];
    let meeting = Meeting::new(2);
    std::thread::scope(|s| {
        for (rank, d) in devices.iter().enumerate() {
            let meeting = meeting.clone();
            s.spawn(move || {
                let transport = d.comm_exchange(rank, 2, meeting).unwrap();
                let t = Tensor::zeros(&[3], DType::F32, d).unwrap();
                let call = CollectiveCall {
                    kind: CollectiveKind::AllReduce(ReduceOp::Sum),
                    dtype: DType::F32,
                    send: t.ptr(),
                    recv: t.ptr(),
                    count: 3,
                };
                transport.run(&call, &d.default_stream().unwrap()).unwrap();
            });
        }
    });
    let rounds = meeting.rounds.lock().unwrap();
    let deposits = &rounds[&0];
    for (sig, bytes) in deposits.iter().flatten() {
        assert_eq!(sig, "all_reduce(sum) of 3 float32 elements");
        assert!(bytes.is_empty(), "a dry run sent {} bytes", bytes.len());
    }
    assert_eq!(deposits.iter().flatten().count(), 2);
}

#[test]
fn simulated_gpus_refuse_nccl_and_ranks_outside_the_group() {
    let d = Device::new_sim(64 << 20);
    let id = [0u8; labs_device::backend::UNIQUE_ID_BYTES];
    let errors = [
        d.comm_unique_id().err().unwrap(),
        d.comm_init_rank(0, 1, &id).err().unwrap(),
        Device::comm_init_all(std::slice::from_ref(&d))
            .err()
            .unwrap(),
    ];
    for e in errors {
        let e = e.to_string();
        assert!(
            e.contains("NCCL runs on GPUs") && e.contains(&d.id().to_string()),
            "{e}"
        );
    }
    let e = d
        .comm_exchange(2, 2, Meeting::new(2))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("rank 2 is not a rank of a group of 2"), "{e}");
    assert!(Device::comm_init_all(&[]).is_err());
}

#[test]
fn tensor_collectives_refuse_what_the_transport_cannot_read() {
    let d = Device::new_sim(64 << 20);
    let transport = d.comm_exchange(0, 1, Meeting::new(1)).unwrap();
    let stream = d.default_stream().unwrap();
    let sum = CollectiveKind::AllReduce(ReduceOp::Sum);
    let run = |send: &Tensor, recv: &Tensor, count| {
        labs_tensor::tensor::run_collective(&*transport, sum, send, recv, count, &stream)
            .unwrap_err()
            .to_string()
    };
    let square = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let strided = square.transpose(0, 1).unwrap();
    assert!(run(&strided, &strided, 6).contains("not contiguous"));
    let halves = Tensor::zeros(&[6], DType::F16, &d).unwrap();
    let e = run(&square, &halves, 6);
    assert!(e.contains("float32") && e.contains("float16"), "{e}");
    let e = run(&square, &square, 7);
    assert!(e.contains("7 elements"), "{e}");
    let other = Device::new_sim(64 << 20);
    let elsewhere = Tensor::zeros(&[6], DType::F32, &other).unwrap();
    assert!(run(&elsewhere, &elsewhere, 6).contains("sim"));
    // Within bounds, the one rank's all-reduce leaves its values.
    let ones = Tensor::from_slice(&[1.0f32; 6], &[6], &d).unwrap();
    labs_tensor::tensor::run_collective(&*transport, sum, &ones, &ones, 6, &stream).unwrap();
    assert_eq!(ones.to_vec::<f32>().unwrap(), [1.0; 6]);
}
