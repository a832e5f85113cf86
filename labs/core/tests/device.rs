//! The device API on the device under test (`LABS_DEVICE`, default the simulator).

use std::time::{Duration, Instant};

use labs_core::device::{FillPattern, ENV_DEVICE};
use labs_core::testing::test_device;
use labs_core::{DType, Device, DeviceId, Error, Tensor};

#[test]
fn reports_properties_and_memory() {
    let d = test_device();
    let p = d.properties().unwrap();
    assert!(!p.name.is_empty());
    assert!(p.total_memory > 0);
    assert!(p.multiprocessors > 0);
    let info = d.mem_info().unwrap();
    assert_eq!(info.total, p.total_memory);
    assert!(info.free <= info.total);
    if let DeviceId::Cuda(_) = d.id() {
        assert!(p.compute_capability.0 >= 5, "{:?}", p.compute_capability);
    }
}

#[test]
fn raw_allocation_is_visible_in_free_memory() {
    let d = test_device();
    let before = d.mem_info().unwrap().free;
    let buf = d.raw_buffer(256 << 20).unwrap();
    let during = d.mem_info().unwrap().free;
    // Other tests run in parallel and allocate too, so only the direction is certain
    // on a GPU; the simulator's accounting is exact per allocation.
    assert!(during < before || d.is_cuda(), "{before} -> {during}");
    assert_eq!(buf.len(), 256 << 20);
    drop(buf);
}

#[test]
fn impossible_allocation_is_out_of_memory_not_a_panic() {
    let d = test_device();
    let total = d.mem_info().unwrap().total;
    let err = d.raw_buffer((total * 2) as usize).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("out of memory") && msg.contains(&d.id().to_string()),
        "{msg}"
    );
}

#[test]
fn copies_round_trip_through_device_memory() {
    let d = test_device();
    let stream = d.default_stream().unwrap();
    let a = d.raw_buffer(1 << 20).unwrap();
    let b = d.raw_buffer(1 << 20).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 253) as u8).collect();
    d.backend().copy_htod(a.ptr(), &data, &stream).unwrap();
    d.backend()
        .copy_dtod(b.ptr(), a.ptr(), 1 << 20, &stream)
        .unwrap();
    let mut back = vec![0u8; 1 << 20];
    d.backend().copy_dtoh(&mut back, b.ptr(), &stream).unwrap();
    assert!(back == data);
}

#[test]
fn fills_write_each_width() {
    let d = test_device();
    let s = d.default_stream().unwrap();
    let buf = d.raw_buffer(64).unwrap();
    for (pattern, expect) in [
        (FillPattern::U8(0xAB), vec![0xABu8; 64]),
        (FillPattern::U16(0x1234), [0x34u8, 0x12].repeat(32)),
        (
            FillPattern::U32(0xDEADBEEF),
            [0xEFu8, 0xBE, 0xAD, 0xDE].repeat(16),
        ),
    ] {
        d.backend()
            .fill(buf.ptr(), pattern, 64 / pattern.width(), &s)
            .unwrap();
        let mut back = vec![0u8; 64];
        d.backend().copy_dtoh(&mut back, buf.ptr(), &s).unwrap();
        assert_eq!(back, expect, "{pattern:?}");
    }
}

/// An iteration count for `spin_` that keeps the device busy for about `at_least`.
fn busy(x: &Tensor, at_least: Duration) -> u32 {
    let stream = x.device().default_stream().unwrap();
    labs_core::timing::calibrate_spin(x, &stream, at_least).unwrap()
}

#[test]
fn launches_are_asynchronous_and_events_see_completion() {
    let d = test_device();
    let x = Tensor::zeros(&[1 << 18], DType::F32, &d).unwrap();
    let it = busy(&x, Duration::from_millis(40));
    // A stream of its own: other tests may be using the default stream meanwhile.
    let stream = d.new_stream().unwrap();
    let (start, end) = (d.new_event().unwrap(), d.new_event().unwrap());
    stream.record(&start).unwrap();
    let spin = labs_core::kernels::Kernel::Spin {
        x: x.ptr(),
        n: x.numel(),
        iterations: it,
    };
    let t = Instant::now();
    d.backend().launch(&spin, &stream).unwrap();
    let launch = t.elapsed();
    stream.record(&end).unwrap();
    assert!(
        !end.query().unwrap(),
        "work finished before the launch returned?"
    );
    end.synchronize().unwrap();
    let waited = t.elapsed();
    assert!(end.query().unwrap());
    assert!(stream.query().unwrap());
    let ms = start.elapsed_ms(&end).unwrap();
    // The events saw most of the time the host waited (the work itself), however long
    // a loaded machine made it; a calibration made under other load may miss 40 ms.
    assert!(
        ms >= 0.5 * waited.as_secs_f32() * 1e3 && ms >= 5.0,
        "events measured {ms} ms of {waited:?}"
    );
    assert!(
        launch.as_secs_f32() * 1e3 < ms / 2.0,
        "launch took {launch:?}"
    );
}

#[test]
fn a_stream_waits_for_an_event_of_another() {
    let d = test_device();
    let producer = d.new_stream().unwrap();
    let consumer = d.new_stream().unwrap();
    let n = 1 << 18;
    let src = d.raw_buffer(n * 4).unwrap();
    let dst = d.raw_buffer(n * 4).unwrap();
    let x = Tensor::zeros(&[1 << 18], DType::F32, &d).unwrap();
    let it = busy(&x, Duration::from_millis(30));
    let be = d.backend();
    be.fill(dst.ptr(), FillPattern::U32(0), n, &consumer)
        .unwrap();
    // The producer is busy, then writes 7s; the consumer copies only after the event.
    let spin = labs_core::kernels::Kernel::Spin {
        x: x.ptr(),
        n: x.numel(),
        iterations: it,
    };
    be.launch(&spin, &producer).unwrap();
    be.fill(src.ptr(), FillPattern::U32(7f32.to_bits()), n, &producer)
        .unwrap();
    let ready = d.new_event().unwrap();
    producer.record(&ready).unwrap();
    consumer.wait(&ready).unwrap();
    be.copy_dtod(dst.ptr(), src.ptr(), n * 4, &consumer)
        .unwrap();
    let mut back = vec![0u8; n * 4];
    be.copy_dtoh(&mut back, dst.ptr(), &consumer).unwrap();
    let values: Vec<f32> = back
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(values.iter().all(|&v| v == 7.0));
    d.synchronize().unwrap();
}

#[test]
fn the_device_under_test_is_the_one_asked_for() {
    let d = test_device();
    match std::env::var(ENV_DEVICE) {
        Ok(v) if !v.is_empty() => assert_eq!(d.id(), v.parse::<DeviceId>().unwrap()),
        _ => assert_eq!(d.id(), DeviceId::Sim(0)),
    }
    // The registry hands out one device per id.
    assert!(Device::get(d.id()).unwrap().same(&d));
}

#[test]
fn bad_device_names_are_clear_errors() {
    let err: Error = "tpu:0".parse::<DeviceId>().unwrap_err().into();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(err
        .to_string()
        .contains("expected cpu, cuda, cuda:N, sim, sim:N, dry or dry:N"));
}

#[test]
fn a_missing_gpu_index_is_an_error() {
    match Device::get(DeviceId::Cuda(4096)) {
        Err(Error::NoSuchDevice { available, .. }) => assert!(available < 4096),
        Err(Error::NoDriver(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A second device of another id than the one under test: a simulated GPU registered
/// under a fresh `sim:N`.
fn another_device() -> Device {
    let other = Device::new_sim(1 << 30);
    assert_ne!(other.id(), test_device().id());
    other
}

#[test]
fn streams_and_events_know_their_device() {
    let d = test_device();
    assert_eq!(d.default_stream().unwrap().device(), d.id());
    assert_eq!(d.new_stream().unwrap().device(), d.id());
    assert_eq!(d.new_event().unwrap().device(), d.id());
}

#[test]
fn a_stream_of_another_device_is_refused_by_every_operation() {
    let d = test_device();
    let foreign = another_device().new_stream().unwrap();
    let expected = format!("stream of {} used on {}", foreign.device(), d.id());
    let buf = d.raw_buffer(4096).unwrap();
    let mut host = vec![0u8; 4096];
    let be = d.backend();
    let errors = [
        be.copy_htod(buf.ptr(), &host.clone(), &foreign)
            .unwrap_err(),
        be.copy_dtoh(&mut host, buf.ptr(), &foreign).unwrap_err(),
        be.copy_dtod(buf.ptr(), buf.ptr(), 16, &foreign)
            .unwrap_err(),
        be.fill(buf.ptr(), FillPattern::U8(1), 16, &foreign)
            .unwrap_err(),
        be.raw_alloc_async(512, &foreign).unwrap_err(),
        d.allocator().unwrap().malloc(512, &foreign).unwrap_err(),
    ];
    for e in errors {
        assert!(
            matches!(e, Error::WrongDevice { what: "stream", .. }),
            "{e:?}"
        );
        assert_eq!(e.to_string(), expected);
    }
    // A block's cross-stream use must be on its own device too.
    let a = d.allocator().unwrap();
    let block = a.malloc(512, &d.default_stream().unwrap()).unwrap();
    let e = a.record_stream(&block, &foreign).unwrap_err();
    assert_eq!(e.to_string(), expected);
    a.free(block).unwrap();
    // Nothing was enqueued anywhere: the device is still usable.
    d.synchronize().unwrap();
}

#[test]
fn an_event_is_recorded_only_on_its_own_device() {
    let d = test_device();
    let other = another_device();
    let foreign_event = other.new_event().unwrap();
    let e = d
        .default_stream()
        .unwrap()
        .record(&foreign_event)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("event of {} used on {}", other.id(), d.id())
    );
    // Timing two events of different devices is meaningless, and refused.
    let mine = d.new_event().unwrap();
    d.default_stream().unwrap().record(&mine).unwrap();
    mine.synchronize().unwrap();
    assert!(matches!(
        mine.elapsed_ms(&foreign_event),
        Err(Error::WrongDevice { what: "event", .. })
    ));
}

#[test]
fn physical_memory_moves_between_mappings_without_a_new_allocation() {
    let d = test_device();
    let be = d.backend();
    let page = be.vm_granularity().unwrap();
    let (a, b) = (
        be.vm_reserve(2 * page).unwrap(),
        be.vm_reserve(2 * page).unwrap(),
    );
    let memory = be.vm_create(2 * page).unwrap();
    assert_eq!(memory.bytes(), 2 * page);
    be.vm_map_memory(a, memory).unwrap();
    be.vm_set_access(a, 2 * page).unwrap();
    // The mapping is real memory: a fill and a copy back see it.
    let stream = d.default_stream().unwrap();
    be.fill(a, FillPattern::U32(0xdead_beef), 2 * page / 4, &stream)
        .unwrap();
    let mut back = vec![0u8; 8];
    be.copy_dtoh(&mut back, a + page as u64, &stream).unwrap();
    assert_eq!(back, [0xef, 0xbe, 0xad, 0xde, 0xef, 0xbe, 0xad, 0xde]);
    d.synchronize().unwrap();
    // Unmapped, the memory stays allocated; mapped elsewhere, it is usable there.
    let memory = be.vm_unmap_memory(a, 2 * page).unwrap();
    be.vm_map_memory(b, memory).unwrap();
    be.vm_set_access(b, 2 * page).unwrap();
    be.fill(b, FillPattern::U8(7), 2 * page, &stream).unwrap();
    be.copy_dtoh(&mut back, b, &stream).unwrap();
    assert_eq!(back, [7; 8]);
    // Unmapping what is not one mapping is an error, not a partial unmap.
    assert!(be.vm_unmap_memory(b + page as u64, page).is_err());
    let memory = be.vm_unmap_memory(b, 2 * page).unwrap();
    be.vm_free_memory(memory).unwrap();
    be.vm_release(a, 2 * page).unwrap();
    be.vm_release(b, 2 * page).unwrap();
}

#[test]
fn one_access_call_covers_neighbouring_mappings() {
    let d = test_device();
    let be = d.backend();
    let page = be.vm_granularity().unwrap();
    let base = be.vm_reserve(3 * page).unwrap();
    for i in 0..2u64 {
        let memory = be.vm_create(page).unwrap();
        be.vm_map_memory(base + i * page as u64, memory).unwrap();
    }
    // The third page is not mapped: access to a range that includes it is refused.
    assert!(be.vm_set_access(base, 3 * page).is_err());
    be.vm_set_access(base, 2 * page).unwrap();
    let stream = d.default_stream().unwrap();
    be.fill(base, FillPattern::U8(3), 2 * page, &stream)
        .unwrap();
    let mut back = vec![0u8; 4];
    be.copy_dtoh(&mut back, base + 2 * page as u64 - 4, &stream)
        .unwrap();
    assert_eq!(back, [3; 4]);
    d.synchronize().unwrap();
    for i in 0..2u64 {
        be.vm_unmap(base + i * page as u64, page).unwrap();
    }
    be.vm_release(base, 3 * page).unwrap();
}

#[test]
fn physical_memory_counts_from_create_to_free_not_while_mapped() {
    // A device of its own, so that no other test's memory moves the figures.
    let d = Device::new_sim(1 << 30);
    let be = d.backend();
    let page = be.vm_granularity().unwrap();
    let free = || d.mem_info().unwrap().free;
    let before = free();
    let base = be.vm_reserve(page).unwrap();
    assert_eq!(free(), before, "reserving addresses takes no memory");
    let memory = be.vm_create(page).unwrap();
    assert_eq!(before - free(), page as u64);
    be.vm_map_memory(base, memory).unwrap();
    let memory = be.vm_unmap_memory(base, page).unwrap();
    assert_eq!(
        before - free(),
        page as u64,
        "unmapped memory is still held"
    );
    be.vm_free_memory(memory).unwrap();
    assert_eq!(free(), before);
    // More than the device has is out of memory, before anything is made.
    assert!(be.vm_create(2 << 30).unwrap_err().is_out_of_memory());
    be.vm_release(base, page).unwrap();
}
