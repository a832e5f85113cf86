//! Threads and processes the runtime starts: one the system cannot start is an error
//! naming it, never a panic, and a launcher that fails stops the ranks it started.

use labs_base::testing::fail_thread_spawns;
use labs_device::Device;
use labs_dist::dist::{self, OutputStream};
use labs_tensor::Tensor;

#[test]
fn a_stream_worker_that_cannot_start_is_an_error() {
    fail_thread_spawns(1);
    let device = Device::new_sim(64 << 20);
    let e = Tensor::full(&[4], 1.0, &device)
        .and_then(|t| t.to_vec::<f32>())
        .expect_err("work on a stream without its worker is an error");
    let e = e.to_string();
    assert!(e.contains("cannot start a stream worker"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    // The next try starts it.
    let t = Tensor::full(&[4], 2.0, &device).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.0; 4]);
}

fn sh(script: &str) -> Vec<String> {
    vec!["-c".into(), script.into()]
}

/// Whether process `pid` exists (running or not yet reaped).
fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_launcher_that_panics_stops_and_reaps_its_ranks() {
    let pids = std::sync::Mutex::new(Vec::new());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dist::launch_with(2, "sh", &sh("echo $$; exec sleep 60"), |line| {
            assert_eq!(line.stream, OutputStream::Stdout, "{line}");
            let mut pids = pids.lock().unwrap();
            pids.push(line.text.trim().parse::<u32>().unwrap());
            if pids.len() == 2 {
                panic!("the output handler fails");
            }
        })
    }));
    assert!(outcome.is_err(), "the panic went through");
    let pids = pids.into_inner().unwrap_or_else(|e| e.into_inner());
    assert_eq!(pids.len(), 2);
    for pid in pids {
        assert!(!exists(pid), "rank process {pid} outlived its launcher");
    }
}

#[test]
fn a_launcher_whose_output_reader_cannot_start_stops_its_ranks() {
    fail_thread_spawns(3);
    let e = dist::launch_with(2, "sh", &sh("exit 0"), |_| {}).expect_err("an error");
    let e = e.to_string();
    assert!(e.contains("cannot start"), "{e}");
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn a_launch_of_too_many_ranks_is_refused_before_any_starts() {
    let started = std::time::Instant::now();
    let e = dist::launch_with(100_000, "sh", &sh("exit 0"), |_| {})
        .expect_err("an error")
        .to_string();
    assert!(e.contains("100000") && e.contains("1024"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn simulated_gpu_counts_are_bounded() {
    let e = labs_device::device::set_sim_device_count(100_000)
        .expect_err("an error")
        .to_string();
    assert!(e.contains("100000") && e.contains("1024"), "{e}");
    labs_device::device::set_sim_device_count(1024).unwrap();
}
