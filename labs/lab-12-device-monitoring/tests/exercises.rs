//! Grades the workshop exercises (`src/exercises/`): the growth outside the allocator
//! against scripted readings and against a loop on the simulated GPU that takes memory
//! from the driver at known steps, and the peak sampler against scripted values and
//! against a buffer held and freed between two polls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lab_12::exercises::{outside_growth, PeakSampler, Reading};
use lab_12::smi::{self, Source};
use labs_core::{DType, Device, Tensor};

const MIB: u64 = 1 << 20;

fn r(reserved: u64, process: Option<u64>) -> Reading {
    Reading { reserved, process }
}

#[test]
fn outside_growth_on_scripted_readings() {
    assert_eq!(outside_growth(&[]), vec![]);
    assert_eq!(outside_growth(&[r(10, Some(50))]), vec![]);
    // The allocator grows and NVML's line with it: nothing outside.
    assert_eq!(
        outside_growth(&[r(10, Some(50)), r(30, Some(70)), r(90, Some(130))]),
        vec![]
    );
    // Growth outside at reading 2, a reading without the line (skipped), growth at 4
    // measured against reading 2, a shrink at 5 (not listed).
    let readings = [
        r(10, Some(50)),
        r(20, Some(60)),
        r(20, Some(75)),
        r(40, None),
        r(40, Some(105)),
        r(40, Some(90)),
    ];
    assert_eq!(outside_growth(&readings), vec![(2, 15), (4, 10)]);
    // Before the first listed reading there is nothing to compare with.
    assert_eq!(
        outside_growth(&[r(0, None), r(10, Some(12)), r(10, Some(13))]),
        vec![(2, 1)]
    );
}

/// A loop on a simulated GPU of its own: every step makes a larger tensor through the
/// allocator (so that reserved memory grows at every step), and steps 2 and 4 also take
/// 8 MiB from the driver directly, as a library calling cudaMalloc would; step 5 gives
/// one back.
#[test]
fn outside_growth_finds_the_direct_allocations_of_a_loop() {
    let d = Device::new_sim(2 << 30);
    let source = Source::for_device(&d, true).unwrap();
    let (mut kept, mut direct, mut readings) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..6 {
        kept.push(Tensor::zeros(&[(step + 1) * (3 << 20)], DType::F32, &d).unwrap());
        if step == 2 || step == 4 {
            direct.push(d.raw_buffer(8 << 20).unwrap());
        }
        if step == 5 {
            direct.pop();
        }
        let report = source.sample_one().unwrap();
        readings.push(Reading {
            reserved: d.allocator().unwrap().memory_reserved(),
            process: smi::this_process(&report).and_then(|p| p.used),
        });
    }
    assert!(readings.windows(2).all(|w| w[1].reserved > w[0].reserved));
    assert_eq!(outside_growth(&readings), vec![(2, 8 * MIB), (4, 8 * MIB)]);
}

/// A value the test sets, read by the sampler, with the number of reads.
fn scripted() -> (
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    impl FnMut() -> u64 + Send + 'static,
) {
    let value = Arc::new(AtomicU64::new(10));
    let reads = Arc::new(AtomicU64::new(0));
    let (v, n) = (value.clone(), reads.clone());
    (value, reads, move || {
        n.fetch_add(1, Ordering::SeqCst);
        v.load(Ordering::SeqCst)
    })
}

fn pause() {
    std::thread::sleep(Duration::from_millis(150));
}

#[test]
fn the_sampler_keeps_the_peak_between_polls() {
    let (value, reads, read) = scripted();
    let sampler = PeakSampler::start(Duration::from_millis(1), read);
    // It read once before returning.
    assert!(reads.load(Ordering::SeqCst) >= 1);
    assert_eq!(sampler.take_peak(), 10);
    pause();
    value.store(100, Ordering::SeqCst);
    pause();
    value.store(20, Ordering::SeqCst);
    pause();
    // 100 came and went between the polls.
    assert_eq!(sampler.take_peak(), 100);
    pause();
    // A new window: 100 is forgotten.
    assert_eq!(sampler.take_peak(), 20);
    value.store(5, Ordering::SeqCst);
    pause();
    // The window starts from the value read at the last poll.
    assert_eq!(sampler.take_peak(), 20);
    pause();
    assert_eq!(sampler.take_peak(), 5);
    let n = sampler.stop();
    assert!(n > 10, "{n} reads in about a second at 1 ms");
    assert_eq!(reads.load(Ordering::SeqCst), n);
    pause();
    assert_eq!(reads.load(Ordering::SeqCst), n, "read after stop");
}

#[test]
fn the_sampler_sees_a_buffer_freed_before_the_poll() {
    let d = Device::new_sim(2 << 30);
    let dev = d.clone();
    let used = move || {
        let m = dev.mem_info().unwrap();
        m.total - m.free
    };
    let before = used();
    let sampler = PeakSampler::start(Duration::from_millis(1), used);
    assert_eq!(sampler.take_peak(), before);
    let buffer = d.raw_buffer(64 << 20).unwrap();
    pause();
    drop(buffer);
    pause();
    // Both polls would read `before`; the sampler saw the 64 MiB in between.
    assert_eq!(sampler.take_peak(), before + 64 * MIB);
    pause();
    assert_eq!(sampler.take_peak(), before);
    sampler.stop();
}
