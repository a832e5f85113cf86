//! Lab 1's experiments and exercises, on the device under test.

use std::time::Duration;

use lab_01::exercises::{add_on_device_of, bytes_needed, time_device_work};
use lab_01::{async_timing, bandwidth, lazy_init, placement, raw_alloc};
use labs_core::testing::test_device;
use labs_core::{DType, Device, Tensor};

#[test]
fn lazy_init_times_are_measured() {
    let d = test_device();
    let m = lazy_init::measure(&d).unwrap();
    assert!(m.first_call > Duration::ZERO && m.first_launch > Duration::ZERO);
    assert_eq!(lazy_init::table(&d, &m).rows().len(), 4);
}

#[test]
fn placement_tables_show_every_device_and_the_mismatch() {
    let d = test_device();
    let created = placement::creation(&d).unwrap();
    assert_eq!(created.rows().len(), 6);
    assert!(created.rows().iter().any(|r| r[1] == d.id().to_string()));
    let to = placement::to_semantics(&d).unwrap();
    assert_eq!(to.rows()[0][1], "true");
    assert_eq!(to.rows()[1][1], "false");
    let msg = placement::mismatch_error(&d).unwrap();
    assert_eq!(
        msg,
        format!(
            "Expected all tensors to be on the same device, but found at least two \
             devices, {} and cpu!",
            d.id()
        )
    );
}

#[test]
fn raw_allocation_costs_are_measured_per_size() {
    let d = test_device();
    let sizes = raw_alloc::sizes(&d).unwrap();
    assert!(sizes.contains(&512) && sizes.contains(&(20 << 20)));
    let c = raw_alloc::measure(&d, 1 << 20, 3).unwrap();
    assert_eq!(c.bytes, 1 << 20);
    assert!(c.alloc > Duration::ZERO && c.free > Duration::ZERO);
}

#[test]
fn bandwidth_moves_the_bytes_intact() {
    let d = test_device();
    let b = bandwidth::measure(&d, 4 << 20, 2).unwrap();
    assert!(b.htod > Duration::ZERO && b.dtoh > Duration::ZERO);
    assert!(bandwidth::table(&d, &[b]).to_string().contains("GB/s"));
}

#[test]
fn timing_without_synchronize_misses_the_work() {
    let d = test_device();
    let m = async_timing::measure(&d, Duration::from_millis(60)).unwrap();
    // The launch returns long before the work is done; both correct methods agree.
    assert!(
        m.without_sync * 4 < m.with_sync,
        "{:?} vs {:?}",
        m.without_sync,
        m.with_sync
    );
    // Events time the device alone; the host clock adds whatever delays the host (on a
    // loaded machine, a lot), so only one direction is certain. The two are separate
    // runs of the same work, and on the simulated GPU a loaded host slows one run more
    // than the other, hence the margin.
    assert!(
        m.events.as_secs_f64() <= m.with_sync.as_secs_f64() * 2.0,
        "events {:?} vs clock {:?}",
        m.events,
        m.with_sync
    );
    assert!(
        m.events >= Duration::from_millis(10),
        "events {:?}",
        m.events
    );
}

#[test]
fn exercise_bytes_needed() {
    assert_eq!(bytes_needed(&[1000, 1000], DType::F32), 4_000_000);
    assert_eq!(bytes_needed(&[8, 3, 224, 224], DType::F16), 2_408_448);
    assert_eq!(bytes_needed(&[7], DType::U8), 7);
    assert_eq!(bytes_needed(&[], DType::I32), 4);
}

#[test]
fn exercise_add_on_device_of() {
    let d = test_device();
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap();
    let b = Tensor::from_slice(&[10.0f32, 20.0], &[2], &Device::cpu()).unwrap();
    let c = add_on_device_of(&a, &b).unwrap();
    assert_eq!(c.device().id(), d.id());
    assert_eq!(c.to_vec::<f32>().unwrap(), [11.0, 22.0]);
    let back = add_on_device_of(&b, &a).unwrap();
    assert_eq!(back.device().id(), labs_core::DeviceId::Cpu);
}

#[test]
fn exercise_time_device_work_includes_the_work() {
    let d = test_device();
    let x = Tensor::zeros(&[1 << 20], DType::F32, &d).unwrap();
    let it = async_timing::calibrate(&x, Duration::from_millis(40)).unwrap();
    let stream = d.default_stream().unwrap();
    let (start, end) = (d.new_event().unwrap(), d.new_event().unwrap());
    let took = time_device_work(&d, &mut || {
        stream.record(&start)?;
        x.spin_(it)?;
        stream.record(&end)
    })
    .unwrap();
    let device_ms = start.elapsed_ms(&end).unwrap() as f64;
    assert!(
        took.as_secs_f64() * 1e3 >= device_ms * 0.95,
        "{took:?} vs {device_ms} ms"
    );
}
