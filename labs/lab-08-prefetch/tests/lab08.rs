//! Lab 8's experiments, loader and exercises, on the device under test.

use std::time::Duration;

use lab_08::exercises::{expected_step, pinned_bytes_in_flight, upload_async};
use lab_08::loader::{sample_value, Fill, HostLoader, LoaderConfig, PrefetchLoader};
use lab_08::{bandwidth, bench, non_blocking, training};
use labs_core::host::HostAllocator;
use labs_core::kernels::Kernel;
use labs_core::testing::test_device;
use labs_core::timing::calibrate_spin;
use labs_core::{DType, Tensor};

fn config(batches: usize, workers: usize, depth: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size: 8,
        sample_elems: 512,
        batches,
        workers,
        prefetch_depth: depth,
        fill: Fill::Full,
    }
}

fn expected(config: &LoaderConfig, index: usize) -> Vec<f32> {
    (0..config.batch_size)
        .flat_map(|s| {
            (0..config.sample_elems).map(move |j| sample_value(index * config.batch_size + s, j))
        })
        .collect()
}

#[test]
fn host_loader_delivers_every_batch_in_order() {
    let d = test_device();
    let c = config(9, 3, 4);
    let indices: Vec<usize> = HostLoader::new(&d, c)
        .map(|b| {
            let b = b.unwrap();
            let values: Vec<f32> = b
                .data
                .as_slice()
                .chunks(4)
                .map(|x| f32::from_ne_bytes(x.try_into().unwrap()))
                .collect();
            assert_eq!(values, expected(&c, b.index));
            b.index
        })
        .collect();
    assert_eq!(indices, (0..9).collect::<Vec<_>>());
}

#[test]
fn prefetch_loader_batches_arrive_intact_while_compute_runs() {
    let d = test_device();
    let c = config(10, 2, 2);
    let compute = d.new_stream().unwrap();
    let x = Tensor::zeros(&[1 << 12], DType::F32, &d).unwrap();
    let spin = calibrate_spin(&x, &compute, Duration::from_millis(2)).unwrap();
    let mut loader = PrefetchLoader::new(&d, c).unwrap();
    let mut seen = Vec::new();
    while let Some(batch) = loader.next_batch(&compute).unwrap() {
        // Work on the compute stream, then read the batch back on the same stream:
        // the read is ordered after the copy only through the loader's event.
        x.spin_on(spin, &compute).unwrap();
        let mut back = vec![0u8; batch.elems * 4];
        d.backend()
            .copy_dtoh(&mut back, batch.ptr, &compute)
            .unwrap();
        let values: Vec<f32> = back
            .chunks(4)
            .map(|x| f32::from_ne_bytes(x.try_into().unwrap()))
            .collect();
        assert_eq!(values, expected(&c, batch.index), "batch {}", batch.index);
        seen.push(batch.index);
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    drop(loader);
    // Every pinned buffer went back to the pool once its copy was done.
    let a = HostAllocator::get(&d);
    a.process_events().unwrap();
    assert_eq!(a.recount(), a.stats());
}

#[test]
fn the_prefetcher_runs_a_spin_loop_with_step_times() {
    let d = test_device();
    let mut c = bench::loader_config(&d, true);
    c.batches = 8;
    let t = training::measure(&d, c, false).unwrap();
    assert!(t.copy_ms > 0.0 && t.compute_ms > 0.0);
    assert!(t.naive_step_ms > 0.0 && t.prefetch_step_ms > 0.0);
    let json = serde_json::to_value(t).unwrap();
    for key in ["naive_step_ms", "prefetch_step_ms", "copy_ms", "compute_ms"] {
        assert!(json[key].is_number(), "{key}");
    }
    // Kernels ran on the batches: a spin kernel never leaves zeros behind.
    let probe = Tensor::zeros(&[16], DType::F32, &d).unwrap();
    d.launch(&Kernel::Spin {
        x: probe.ptr(),
        n: 16,
        iterations: t.spin_iterations.min(1000),
    })
    .unwrap();
    assert!(probe.to_vec::<f32>().unwrap().iter().all(|&v| v > 0.0));
}

#[test]
fn bandwidth_is_measured() {
    let d = test_device();
    let rows = bandwidth::measure(&d, &[64 << 10, 1 << 20]).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows
        .iter()
        .all(|r| r.pinned_htod_gbps > 0.0 && r.pageable_dtoh_gbps > 0.0));
    assert_eq!(bandwidth::table(&d, &rows).rows().len(), 2);
}

#[test]
fn non_blocking_returns_early_only_from_pinned_memory() {
    let d = test_device();
    // On a GPU, large enough that the driver cannot stage a pageable copy at once (the
    // simulator stages every pageable copy synchronously, whatever its size).
    let size = if d.is_cuda() { 64 << 20 } else { 4 << 20 };
    let m = non_blocking::measure(&d, size, Duration::from_millis(40)).unwrap();
    // (returned, done): the pinned call returns long before the queued kernel ends;
    // the pageable one only once the copy behind it is done.
    assert!(m.pinned.0 * 2 < m.pinned.1, "{:?}", m.pinned);
    assert!(m.pageable.0 * 5 >= m.pageable.1 * 4, "{:?}", m.pageable);
    assert_eq!(non_blocking::table(&d, &m).rows().len(), 2);
}

#[test]
fn exercise_upload_returns_before_the_copy_runs() {
    let d = test_device();
    let stream = d.new_stream().unwrap();
    let x = Tensor::zeros(&[1 << 16], DType::F32, &d).unwrap();
    let spin = calibrate_spin(&x, &stream, Duration::from_millis(40)).unwrap();
    let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    x.spin_on(spin, &stream).unwrap();
    let t = upload_async(&data, &d, &stream).unwrap();
    assert!(
        !stream.query().unwrap(),
        "upload_async waited for the stream"
    );
    stream.synchronize().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), data);
}

#[test]
fn exercise_step_times_and_pinned_bytes() {
    let (a, b) = (Duration::from_millis(3), Duration::from_millis(5));
    assert_eq!(expected_step(a, b, false), Duration::from_millis(8));
    assert_eq!(expected_step(a, b, true), b);
    assert_eq!(pinned_bytes_in_flight(5000, 2, 4), 4 * 8192);
    assert_eq!(pinned_bytes_in_flight(1 << 20, 4, 2), 4 << 20);
}
