//! Lab 11's experiments on the device under test: the relations each one shows, the
//! data each one moves arriving intact, and clear errors for sizes that cannot be.

use lab_11::{bandwidth, check_kernel_size, managed, mapped, pin_cost};
use labs_core::host::MappedBuffer;
use labs_core::kernels::Kernel;
use labs_core::testing::test_device;

/// The tests of this file share the process's device and read its free memory, so
/// they run one at a time: another test's buffers would otherwise come and go between
/// a test's two readings.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
use labs_core::{DType, Tensor};

const MIB: usize = 1 << 20;

#[test]
fn the_size_ladders_stop_at_the_largest_size_asked_for() {
    assert_eq!(bandwidth::sizes_up_to(MIB), vec![64 << 10, MIB]);
    assert_eq!(bandwidth::sizes_up_to(MIB - 1), vec![64 << 10]);
    assert!(bandwidth::sizes_up_to((64 << 10) - 1).is_empty());
    assert_eq!(bandwidth::sizes_up_to(usize::MAX), bandwidth::SIZES);
    assert_eq!(
        pin_cost::sizes_up_to(16 * MIB),
        vec![64 << 10, MIB, 16 * MIB]
    );
    let _one_at_a_time = serial();
    let d = test_device();
    let expected = if d.is_cuda() { 1 << 30 } else { 64 * MIB };
    assert_eq!(bandwidth::default_max(&d, false), expected);
    assert_eq!(bandwidth::default_max(&d, true), MIB);
}

/// Pinned copies skip the staging a pageable copy goes through: on a GPU the copy
/// engine reads them directly, and the simulated GPU models the staging (two memcpys
/// against one). At 1 MiB the difference is large on both; the median of 20 copies is
/// taken, and a host busy with other work gets three tries.
#[test]
fn pinned_copies_are_faster_than_pageable_ones_at_a_mebibyte() {
    let _one_at_a_time = serial();
    let d = test_device();
    let mut last = None;
    for _ in 0..3 {
        let rows = bandwidth::measure(&d, &[MIB]).unwrap();
        let r = rows[0];
        assert_eq!(r.bytes, MIB);
        assert!(
            r.pageable_htod_gbps > 0.0 && r.pageable_dtoh_gbps > 0.0,
            "{r:?}"
        );
        if r.pinned_htod_gbps > r.pageable_htod_gbps && r.pinned_dtoh_gbps > r.pageable_dtoh_gbps {
            return;
        }
        last = Some(r);
    }
    panic!("pinned copies were not faster in three tries: {last:?}");
}

#[test]
fn the_bandwidth_table_and_its_last_line_show_every_size() {
    let _one_at_a_time = serial();
    let d = test_device();
    let rows = bandwidth::measure(&d, &[64 << 10, MIB]).unwrap();
    let table = bandwidth::table(&d, &rows);
    assert_eq!(table.rows().len(), 2);
    assert_eq!(table.rows()[1][0], "1.00 MiB");
    let line = bandwidth::largest_line(&rows).unwrap();
    assert!(
        line.starts_with("At the largest size, 1.00 MiB: pinned "),
        "{line}"
    );
    assert!(bandwidth::largest_line(&[]).is_none());
}

#[test]
fn a_copy_larger_than_the_free_memory_is_refused_before_anything_is_allocated() {
    let _one_at_a_time = serial();
    let d = test_device();
    let free = d.mem_info().unwrap().free as usize;
    let e = bandwidth::measure(&d, &[64 << 10, free + MIB]).unwrap_err();
    assert!(format!("{e:#}").contains("does not fit"), "{e:#}");
}

/// A block from the allocator's cache is a lookup; a fresh pinned block means the
/// driver (or, on the simulated GPU, the simulator) touching every page.
#[test]
fn a_cache_hit_is_cheaper_than_pinning_a_new_block() {
    let _one_at_a_time = serial();
    let d = test_device();
    let c = pin_cost::measure(&d, MIB).unwrap();
    assert_eq!(c.bytes, MIB);
    assert!(c.cache_hit < c.host_alloc, "{c:?}");
    assert!(c.pageable > std::time::Duration::ZERO, "{c:?}");
    let json = serde_json::to_value(c).unwrap();
    for key in [
        "host_alloc_ms",
        "host_free_ms",
        "cache_hit_ms",
        "pageable_ms",
    ] {
        assert!(json[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {json}");
    }
    assert_eq!(pin_cost::table(&d, &[c]).rows().len(), 1);
}

#[test]
fn a_kernel_reads_and_writes_host_memory_through_a_mapped_pointer() {
    let _one_at_a_time = serial();
    let d = test_device();
    let n = 1 << 16;
    let values: Vec<f32> = (0..n).map(mapped::value).collect();
    let mut host = MappedBuffer::new(&d, n * 4).unwrap();
    host.as_mut_slice().copy_from_slice(
        &values
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect::<Vec<_>>(),
    );
    let out = Tensor::zeros(&[n], DType::F32, &d).unwrap();
    d.synchronize().unwrap();
    d.launch(&Kernel::scale(host.device_ptr(), 3.0, out.ptr(), n))
        .unwrap();
    d.synchronize().unwrap();
    mapped::check_output(&out, 3.0, "read through the mapped pointer").unwrap();
    // The check is not vacuous: the same output is not twice the input.
    let e = mapped::check_output(&out, 2.0, "wrong factor").unwrap_err();
    assert!(e.to_string().contains("element 1 is 3, not 2"), "{e}");
    // The other way: the kernel writes, the host reads without a copy.
    d.launch(&Kernel::scale(out.ptr(), 2.0, host.device_ptr(), n))
        .unwrap();
    d.synchronize().unwrap();
    let back: Vec<f32> = host
        .as_slice()
        .chunks(4)
        .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert!(back.iter().zip(&values).all(|(b, v)| *b == 6.0 * v));
}

#[test]
fn the_mapped_experiment_checks_its_data_and_times_three_ways() {
    let _one_at_a_time = serial();
    let d = test_device();
    let m = mapped::measure(&d, MIB, 2).unwrap();
    assert_eq!((m.bytes, m.samples), (MIB, 2));
    for t in [m.device_memory, m.mapped_host, m.copy_then_kernel] {
        assert!(t > std::time::Duration::ZERO, "{m:?}");
    }
    let table = mapped::table(&d, &m);
    let names: Vec<&str> = table.rows().iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "device memory",
            "mapped pinned host memory",
            "pinned host memory, copied first"
        ]
    );
}

#[test]
fn managed_memory_keeps_its_data_wherever_its_pages_go() {
    let _one_at_a_time = serial();
    let d = test_device();
    // The experiment reads the data back after every placement and fails otherwise.
    let m = managed::measure(&d, MIB, 2).unwrap();
    assert_eq!((m.bytes, m.samples), (MIB, 2));
    for t in [m.pages_on_host, m.prefetched, m.preferred_host] {
        assert!(t > std::time::Duration::ZERO, "{m:?}");
    }
    assert_eq!(managed::table(&d, &m).rows().len(), 3);
    // Nothing left behind: a second run frees its managed buffer too (a leaked one
    // would take at least its own size off the free memory).
    let free_before = d.mem_info().unwrap().free;
    let again = managed::measure(&d, MIB, 1).unwrap();
    assert_eq!(again.bytes, MIB);
    let free_after = d.mem_info().unwrap().free;
    assert!(
        free_after + (MIB as u64) / 2 > free_before,
        "{free_before} free before, {free_after} after"
    );
}

/// Linux's rules, on the GPU and on the simulated GPU: no fallback into host memory
/// for device memory, and the labs never oversubscribe managed memory.
#[test]
fn requests_beyond_the_device_fail_with_out_of_memory() {
    let _one_at_a_time = serial();
    let d = test_device();
    let info = d.mem_info().unwrap();
    let rows = managed::beyond_device(&d).unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0].managed && rows[0].bytes > info.free, "{rows:?}");
    assert!(!rows[1].managed && rows[1].bytes > info.total, "{rows:?}");
    for r in &rows {
        let e = r
            .refused
            .as_deref()
            .unwrap_or_else(|| panic!("served: {r:?}"));
        assert!(e.to_lowercase().contains("out of memory"), "{e}");
    }
    let table = managed::beyond_table(&d, &rows);
    assert_eq!(table.rows()[0][2], "refused: the labs do not oversubscribe");
    assert_eq!(
        table.rows()[1][2],
        "out of memory: no fallback to host memory"
    );
    // Refusing allocated nothing.
    assert!(d.mem_info().unwrap().free + (MIB as u64) / 2 > info.free);
}

#[test]
fn kernel_sizes_are_whole_floats_that_fit_the_device() {
    let _one_at_a_time = serial();
    let d = test_device();
    check_kernel_size(&d, "--size", MIB, 2).unwrap();
    let message = |size, buffers| {
        format!(
            "{:#}",
            check_kernel_size(&d, "--size", size, buffers).unwrap_err()
        )
    };
    assert!(message(0, 2).contains("more than 0 bytes"));
    assert!(message(6, 2).contains("multiple of 4 bytes"));
    let free = d.mem_info().unwrap().free as usize;
    let m = message(free / 2 + 4096, 2);
    assert!(m.starts_with("--size ") && m.contains("free"), "{m}");
}
