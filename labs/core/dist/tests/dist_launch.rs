//! The rendezvous, process groups over it and the launcher (`labs_dist::dist`): ranks
//! on threads of this process, and ranks in processes the launcher starts (this test
//! binary itself, on the device under test's kind).

use std::time::{Duration, Instant};

use labs_base::Error;
use labs_device::testing::test_device;
use labs_device::{Device, DeviceId};
use labs_dist::dist::{self, DistEnv, OutputStream, ProcessGroupOptions, ReduceOp, Rendezvous};
use labs_tensor::{DType, Tensor};

fn distributed_message(e: Error) -> String {
    match e {
        Error::Distributed(m) => m,
        other => panic!("expected a distributed error, got {other:?}"),
    }
}

fn free_port() -> u16 {
    dist::free_loopback_port().unwrap()
}

fn env(rank: usize, world_size: usize, port: u16) -> DistEnv {
    DistEnv {
        rank,
        local_rank: rank,
        world_size,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        job_token: None,
    }
}

#[test]
fn rendezvous_hands_rank_zeros_id_to_every_rank() {
    let port = free_port();
    let ids = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                s.spawn(move || {
                    let (rv, id) =
                        Rendezvous::join(&env(rank, 3, port), Duration::from_secs(20), || {
                            assert_eq!(rank, 0, "only rank 0 makes the id");
                            Ok(std::array::from_fn(|i| i as u8 ^ 0x5a))
                        })
                        .unwrap();
                    assert_eq!((rv.rank(), rv.world_size()), (rank, 3));
                    id
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let want: [u8; 128] = std::array::from_fn(|i| i as u8 ^ 0x5a);
    assert!(ids.iter().all(|id| *id == want));
}

#[test]
fn rendezvous_fails_clearly_when_ranks_are_missing_or_vanish() {
    let zero = || Ok([0u8; 128]);
    let port = free_port();
    let short = Duration::from_millis(300);
    let e = distributed_message(
        Rendezvous::join(&env(0, 2, port), short, zero)
            .err()
            .unwrap(),
    );
    assert!(e.contains("never connected") && e.contains("[1]"), "{e}");
    let e = distributed_message(
        Rendezvous::join(&env(1, 2, port), short, zero)
            .err()
            .unwrap(),
    );
    assert!(e.contains("nothing listens"), "{e}");

    // A peer that says hello and then goes away.
    let port = free_port();
    let root = std::thread::spawn(move || {
        Rendezvous::join(&env(0, 2, port), Duration::from_secs(20), zero)
            .err()
            .unwrap()
    });
    let mut peer = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let hello = b"labs-rendezvous/2 rank=1 world=2 token=-";
    let mut frame = (hello.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(hello);
    std::io::Write::write_all(&mut peer, &frame).unwrap();
    drop(peer);
    let e = distributed_message(root.join().unwrap());
    assert!(e.contains("rank 1"), "{e}");
}

#[test]
fn process_group_of_simulated_gpus_over_tcp() {
    let port = free_port();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let c = dist::init_process_group_with(ProcessGroupOptions {
                        timeout: Duration::from_secs(20),
                        device: Some(sim(rank)),
                        env: Some(env(rank, 2, port)),
                    })
                    .unwrap();
                    let t = Tensor::full(&[3], (rank + 1) as f32, c.device()).unwrap();
                    c.all_reduce(&t, ReduceOp::Max).unwrap().wait().unwrap();
                    let out = Tensor::zeros(&[6], DType::F32, c.device()).unwrap();
                    c.all_gather(&t, &out).unwrap().wait().unwrap();
                    let bad = Tensor::zeros(&[1 + rank], DType::F32, c.device()).unwrap();
                    let e = c.all_reduce(&bad, ReduceOp::Sum).err().unwrap();
                    c.barrier().unwrap();
                    (out.to_vec::<f32>().unwrap(), distributed_message(e))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (gathered, mismatch) in results {
        assert_eq!(gathered, vec![2.0; 6]);
        assert!(mismatch.contains("differs across ranks"), "{mismatch}");
    }
}

/// Rank 1 joins, then stays silent past the timeout (`late`) or drops its communicator;
/// rank 0's next collective is the error.
fn rank_zero_error_when_rank_one(late: bool) -> String {
    let port = free_port();
    let timeout = Duration::from_secs(2);
    std::thread::scope(|s| {
        let join = move |rank: usize| {
            dist::init_process_group_with(ProcessGroupOptions {
                timeout,
                device: Some(sim(rank)),
                env: Some(env(rank, 2, port)),
            })
            .unwrap()
        };
        let one = s.spawn(move || {
            let c = join(1);
            if late {
                std::thread::sleep(timeout + Duration::from_millis(500));
            }
            drop(c);
        });
        let c = join(0);
        let t = Tensor::zeros(&[4], DType::F32, c.device()).unwrap();
        let started = Instant::now();
        let e = c.all_reduce(&t, ReduceOp::Sum).err().unwrap();
        assert!(started.elapsed() < timeout * 3, "waited too long");
        one.join().unwrap();
        distributed_message(e)
    })
}

#[test]
fn process_group_over_tcp_reports_a_rank_that_left_or_is_silent() {
    let e = rank_zero_error_when_rank_one(false);
    assert!(e.contains("rank 1 closed its connection"), "{e}");
    let e = rank_zero_error_when_rank_one(true);
    assert!(e.contains("timed out waiting for rank 1"), "{e}");
}

fn sh(script: &str) -> Vec<String> {
    vec!["-c".into(), script.into()]
}

#[test]
fn launcher_sets_the_environment_and_prefixes_output() {
    let mut lines = Vec::new();
    let script = "echo rank $RANK local $LOCAL_RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT; \
                  echo to stderr >&2";
    let status = dist::launch_with(3, "sh", &sh(script), |l| lines.push(l)).unwrap();
    assert!(status.success());
    for rank in 0..3 {
        let out: Vec<_> = lines.iter().filter(|l| l.rank == rank).collect();
        assert_eq!(out.len(), 2, "{lines:?}");
        let stdout = out
            .iter()
            .find(|l| l.stream == OutputStream::Stdout)
            .unwrap();
        assert!(
            stdout
                .text
                .starts_with(&format!("rank {rank} local {rank} of 3 at 127.0.0.1:")),
            "{stdout:?}"
        );
        assert!(stdout
            .to_string()
            .starts_with(&format!("[rank {rank}] rank {rank}")));
        assert!(out
            .iter()
            .any(|l| l.stream == OutputStream::Stderr && l.text == "to stderr"));
    }
}

#[test]
fn launcher_stops_the_others_when_a_rank_fails() {
    let started = Instant::now();
    let mut lines = Vec::new();
    let script = "if [ \"$RANK\" = 1 ]; then echo giving up >&2; exit 3; fi; exec sleep 60";
    let e = dist::launch_with(3, "sh", &sh(script), |l| lines.push(l))
        .err()
        .unwrap();
    let e = distributed_message(e);
    assert!(e.contains("rank 1 of 3 exited with code 3"), "{e}");
    assert!(e.contains("stopped"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the others were not stopped"
    );
    assert!(
        lines.iter().any(|l| l.rank == 1 && l.text == "giving up"),
        "{lines:?}"
    );
    assert!(dist::launch_with(0, "sh", &[], |_| {}).is_err());
}

/// Launched by a test below (the environment says so): one rank of a job, on the
/// device under test's kind.
fn launched_rank() {
    let local = DistEnv::from_env().unwrap().local_rank;
    launched_rank_on(if test_device().is_cuda() {
        Device::get(DeviceId::Cuda(local)).unwrap()
    } else {
        sim(local)
    });
}

/// One rank of a launched job on `device`: an all-reduce of `rank + 1`, printed.
fn launched_rank_on(device: Device) {
    let c = dist::init_process_group_with(ProcessGroupOptions {
        device: Some(device),
        ..Default::default()
    })
    .unwrap();
    let t = Tensor::full(&[5], (c.rank() + 1) as f32, c.device()).unwrap();
    c.all_reduce(&t, ReduceOp::Sum).unwrap().wait().unwrap();
    println!("all_reduce gave {}", t.to_vec::<f32>().unwrap()[0]);
    c.barrier().unwrap();
}

#[test]
fn launcher_runs_a_process_group() {
    if std::env::var_os("MASTER_PORT").is_some() {
        return launched_rank();
    }
    let nproc = if test_device().is_cuda() {
        labs_device::cuda::device_count().unwrap()
    } else {
        2
    };
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> = [
        "launcher_runs_a_process_group",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ]
    .map(String::from)
    .to_vec();
    let mut lines = Vec::new();
    let status = dist::launch_with(nproc, exe.to_str().unwrap(), &args, |l| lines.push(l));
    let sum = nproc * (nproc + 1) / 2;
    assert!(status.is_ok(), "{status:?}\n{lines:#?}");
    for rank in 0..nproc {
        assert!(
            lines
                .iter()
                .any(|l| l.rank == rank && l.text.contains(&format!("all_reduce gave {sum}"))),
            "{lines:#?}"
        );
    }
}

/// Simulated GPU `i`, with enough of them for every test here.
fn sim(i: usize) -> Device {
    labs_device::device::set_sim_device_count(8).unwrap();
    Device::get(DeviceId::Sim(i)).unwrap()
}

/// Launched by [`node`] (the environment says so): runs one rank on a simulated GPU and
/// says so; otherwise false, for the test to go on as the launcher.
fn ran_as_a_simulated_rank() -> bool {
    if std::env::var_os("MASTER_PORT").is_none() {
        return false;
    }
    launched_rank_on(sim(DistEnv::from_env().unwrap().local_rank));
    true
}

/// Node `node_rank` of a job of two nodes of two ranks each on loopback, each rank
/// this test binary running `test` (which, launched, is a rank on a simulated GPU: two
/// "machines" on one host cannot each have their own GPUs 0 and 1): its lines, and how
/// it ended.
fn node(
    test: &str,
    node_rank: usize,
    port: u16,
    timeout: Duration,
) -> (
    Vec<dist::OutputLine>,
    Result<std::process::ExitStatus, Error>,
) {
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> = [test, "--exact", "--nocapture", "--test-threads=1"]
        .map(String::from)
        .to_vec();
    let nodes = dist::Nodes {
        nnodes: 2,
        node_rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        job_token: "two-nodes-on-loopback".into(),
        timeout: Some(timeout),
    };
    let mut lines = Vec::new();
    let status =
        dist::launch_nodes_with(2, &nodes, exe.to_str().unwrap(), &args, |l| lines.push(l));
    (lines, status)
}

#[test]
fn two_launchers_make_one_job_across_nodes() {
    const NAME: &str = "two_launchers_make_one_job_across_nodes";
    if ran_as_a_simulated_rank() {
        return;
    }
    let port = free_port();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| node(NAME, 0, port, Duration::from_secs(30)));
        let b = s.spawn(|| node(NAME, 1, port, Duration::from_secs(30)));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (node_rank, (lines, status)) in [(0, a), (1, b)] {
        assert!(status.is_ok(), "node {node_rank}: {status:?}\n{lines:#?}");
        // Ranks 2n and 2n + 1 of 4; each sees 1 + 2 + 3 + 4.
        for rank in [2 * node_rank, 2 * node_rank + 1] {
            assert!(
                lines
                    .iter()
                    .any(|l| l.rank == rank && l.text.contains("all_reduce gave 10")),
                "node {node_rank}, rank {rank}: {lines:#?}"
            );
        }
    }
}

#[test]
fn a_node_that_never_comes_fails_the_other_within_the_timeout() {
    const NAME: &str = "a_node_that_never_comes_fails_the_other_within_the_timeout";
    if ran_as_a_simulated_rank() {
        return;
    }
    let start = Instant::now();
    let (lines, status) = node(NAME, 0, free_port(), Duration::from_secs(2));
    let err = distributed_message(status.unwrap_err());
    assert!(err.contains("(node 0)"), "{err}");
    // Rank 0 names the ranks of the missing node.
    let text: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    assert!(
        text.iter()
            .any(|t| t.contains("ranks never connected") && t.contains("2, 3")),
        "{text:#?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    // Nothing starts without a token, a node rank inside the job, or a port.
    let bad = |f: &dyn Fn(&mut dist::Nodes)| {
        let mut n = dist::Nodes {
            nnodes: 2,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            job_token: "t".into(),
            timeout: None,
        };
        f(&mut n);
        dist::launch_nodes_with(1, &n, "true", &[], |_| {})
            .unwrap_err()
            .to_string()
    };
    assert!(bad(&|n| n.job_token.clear()).contains("LABS_JOB_TOKEN"));
    assert!(bad(&|n| n.node_rank = 2).contains("--node-rank 2"));
    assert!(bad(&|n| n.master_port = 0).contains("--master-port 0"));
}
