//! Lab 6's experiments and exercises, on the device under test.

use std::time::Duration;

use lab_06::exercises::{make_wait, spin_both, time_with_events};
use lab_06::{busy_work, events, hazard, overlap, priorities, timing};
use labs_core::testing::test_device;
use labs_core::{DType, Tensor};

#[test]
fn an_event_completes_after_the_kernel_before_it() {
    let d = test_device();
    let m = events::lifecycle(&d, Duration::from_millis(30)).unwrap();
    assert!(!m.queried_right_after_record);
    assert!(m.queried_after_synchronize);
    assert!(m.elapsed > Duration::ZERO, "{:?}", m.elapsed);
}

#[test]
fn a_stream_that_waits_on_an_event_sees_the_producers_writes() {
    let d = test_device();
    let (n, _without, with) = events::ordering(&d, Duration::from_millis(20)).unwrap();
    assert_eq!(with, n);
}

#[test]
fn launches_return_before_the_work_is_done() {
    let d = test_device();
    let m = timing::measure(&d, Duration::from_millis(5), 8).unwrap();
    assert!(
        m.host_no_sync < m.host_sync / 2,
        "{:?} vs {:?}",
        m.host_no_sync,
        m.host_sync
    );
    assert!(
        m.events > m.host_no_sync,
        "{:?} vs {:?}",
        m.events,
        m.host_no_sync
    );
}

#[test]
fn overlap_and_priority_experiments_produce_tables() {
    let d = test_device();
    let o = overlap::measure(&d, Duration::from_millis(15)).unwrap();
    assert!(o.one_stream > Duration::ZERO && o.two_streams > Duration::ZERO);
    assert_eq!(overlap::table(&d, &o).rows().len(), 3);
    let p = priorities::measure(&d, Duration::from_millis(5), 3).unwrap();
    assert!(p.urgent_high > Duration::ZERO && p.backlog > Duration::ZERO);
    assert_eq!(priorities::table(&d, &p).rows().len(), 3);
}

#[test]
fn exercise_make_wait_orders_two_streams() {
    let d = test_device();
    let (a, b) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let (x, iterations) = busy_work(&d, &a, Duration::from_millis(30)).unwrap();
    x.spin_on(iterations, &a).unwrap();
    make_wait(&d, &a, &b).unwrap();
    let after = d.new_event().unwrap();
    b.record(&after).unwrap();
    assert!(!after.query().unwrap(), "the consumer did not wait");
    after.synchronize().unwrap();
    assert!(a.query().unwrap());
}

#[test]
fn exercise_time_with_events_measures_the_kernel() {
    let d = test_device();
    let s = d.new_stream().unwrap();
    let (x, iterations) = busy_work(&d, &s, Duration::from_millis(20)).unwrap();
    let t = time_with_events(&d, &s, &mut || x.spin_on(iterations, &s)).unwrap();
    assert!(t > Duration::ZERO && t < Duration::from_secs(2), "{t:?}");
}

#[test]
fn exercise_spin_both_runs_both_kernels() {
    let d = test_device();
    let s = d.new_stream().unwrap();
    let (_, iterations) = busy_work(&d, &s, Duration::from_millis(10)).unwrap();
    let a = Tensor::zeros(&[4096], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4096], DType::F32, &d).unwrap();
    // The zero fills run on the default stream; the kernels will run on others.
    d.synchronize().unwrap();
    spin_both(&d, &a, &b, iterations.min(100_000)).unwrap();
    assert!(a.to_vec::<f32>().unwrap().iter().all(|&v| v > 0.0));
    assert!(b.to_vec::<f32>().unwrap().iter().all(|&v| v > 0.0));
}

// ANCHOR: hazard_tests
#[test]
fn freeing_a_block_another_stream_reads_corrupts_it_without_record_stream() {
    let d = test_device();
    // B stays busy long enough that A's refill lands first even on a loaded host
    // running the simulator's streams as threads.
    let h = hazard::run(&d, Duration::from_millis(250), false).unwrap();
    assert!(h.reused, "the freed block was not handed out again at once");
    assert!(
        h.intact < h.n,
        "B read intact data although A overwrote the block"
    );
}

#[test]
fn record_stream_keeps_the_block_until_the_reader_is_done() {
    let d = test_device();
    let h = hazard::run(&d, Duration::from_millis(40), true).unwrap();
    assert!(
        !h.reused,
        "the block was reused while stream B still read it"
    );
    assert_eq!(h.intact, h.n);
}
// ANCHOR_END: hazard_tests
