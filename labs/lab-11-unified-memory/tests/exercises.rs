//! Grades the workshop exercises (`src/exercises/`): the staged copy on the device under
//! test, the other two against figures worked out by hand.

use std::time::Duration;

use lab_11::exercises::{copies_to_repay_pinning, mapped_is_faster, staged_copy};
use labs_core::host::HostAllocator;
use labs_core::testing::test_device;
use labs_core::timing::calibrate_spin;
use labs_core::{DType, Error, Tensor};

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn exercise_staged_copy_delivers_every_byte_through_the_staging_buffer() {
    let d = test_device();
    let stream = d.new_stream().unwrap();
    let x = Tensor::zeros(&[1 << 16], DType::F32, &d).unwrap();
    let spin = calibrate_spin(&x, &stream, Duration::from_millis(20)).unwrap();
    let pool = HostAllocator::get(&d);
    let mut staging = pool.allocate(64 << 10).unwrap();
    // Chunks of 64 KiB and a last, shorter one; a copy shorter than one chunk.
    for len in [(1 << 20) + 123, 1000] {
        let src = data(len);
        let dst = d.raw_buffer(len).unwrap();
        // Kernel work queued first: copies queued behind it read the staging buffer
        // only once the kernel is done, long after the call that queued them.
        x.spin_on(spin, &stream).unwrap();
        staged_copy(&src, dst.ptr(), &mut staging, &stream).unwrap();
        assert!(
            stream.query().unwrap(),
            "staged_copy returned before its copies were done"
        );
        let mut back = vec![0u8; len];
        d.backend()
            .copy_dtoh(&mut back, dst.ptr(), &stream)
            .unwrap();
        if let Some(i) = (0..len).find(|&i| back[i] != src[i]) {
            panic!(
                "{len} bytes: byte {i} on the device is {}, not {}",
                back[i], src[i]
            );
        }
        // The bytes went through the staging buffer: it holds the last chunk.
        let tail = len % staging.len();
        let tail = if tail == 0 { staging.len() } else { tail };
        assert_eq!(
            &staging.as_slice()[..tail],
            &src[len - tail..],
            "the staging buffer does not hold the last chunk: was it used?"
        );
    }
    // Nothing to copy is no error; nothing to copy through is.
    let dst = d.raw_buffer(16).unwrap();
    staged_copy(&[], dst.ptr(), &mut staging, &stream).unwrap();
    let mut empty = pool.allocate(0).unwrap();
    assert!(empty.is_empty());
    let e = staged_copy(&data(16), dst.ptr(), &mut empty, &stream).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

#[test]
fn exercise_copies_to_repay_pinning() {
    // 256 MiB: 31.2 ms pageable at 8.6 GB/s, 4.9 ms pinned at 54.7 GB/s, 26.3 ms saved
    // per copy: 95 ms of pinning is repaid by the fourth copy.
    let ms = Duration::from_millis;
    assert_eq!(
        copies_to_repay_pinning(256 << 20, ms(95), 8.6, 54.7),
        Some(4)
    );
    // 1 MiB: 0.134 ms saved per copy, 950 µs of pinning: 8 copies.
    assert_eq!(
        copies_to_repay_pinning(1 << 20, Duration::from_micros(950), 6.6, 42.3),
        Some(8)
    );
    // Pinning that costs nothing is repaid at once; one that saves nothing, never.
    assert_eq!(
        copies_to_repay_pinning(1 << 20, Duration::ZERO, 6.6, 42.3),
        Some(0)
    );
    assert_eq!(copies_to_repay_pinning(1 << 20, ms(1), 10.0, 10.0), None);
    assert_eq!(copies_to_repay_pinning(1 << 20, ms(1), 12.0, 10.0), None);
}

#[test]
fn exercise_mapped_or_copied() {
    const GIB: usize = 1 << 30;
    // The whole buffer, read once: the copy reads it over the bus too, then again.
    assert!(mapped_is_faster(GIB, GIB, 1, 55.0, 2000.0));
    // Read twice, each read over the bus costs more than the one copy.
    assert!(!mapped_is_faster(GIB, GIB, 2, 55.0, 2000.0));
    // A tenth of the buffer twenty times: twice the buffer over the bus.
    assert!(!mapped_is_faster(GIB, GIB / 10, 20, 55.0, 2000.0));
    // An embedding table of 200 GB and 10 MB of rows per step for 1,000 steps: the
    // rows cross the bus, never the table.
    assert!(mapped_is_faster(
        200_000_000_000,
        10_000_000,
        1000,
        55.0,
        2000.0
    ));
}
