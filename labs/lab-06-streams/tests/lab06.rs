//! Lab 6's experiments and exercises, on the device under test.

use std::time::Duration;

use lab_06::exercises::{make_wait, spin_both, time_with_events, StreamPool};
use lab_06::{busy_work, events, hazard, overlap, priorities, timing};
use labs_core::device::FillPattern;
use labs_core::kernels::Kernel;
use labs_core::testing::test_device;
use labs_core::{DType, Device, Stream, Tensor};

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

// Exercise 4: the stream rule in a pool of its own. Each test queues work on the
// simulated GPU's (or the GPU's) streams, frees a block while another stream still
// has work queued on it, and checks that the pool does not hand the block out again
// before that work is done, nor blocks the host to find out.

/// Elements of the pool's blocks (f32).
const POOL_N: usize = 100_003;

/// Streams A and B; B is kept busy for `busy`, then reads a block of `pool`, allocated
/// on A and filled with 1.0 there, into `out` (`out = 2 x block`). Returns the block.
fn read_on_b(
    d: &Device,
    pool: &mut StreamPool,
    (a, b): (&Stream, &Stream),
    out: &Tensor,
    busy: Duration,
) -> u64 {
    let (x, iterations) = busy_work(d, b, busy).unwrap();
    let block = pool.malloc(a).unwrap();
    let backend = d.backend();
    backend
        .fill(block, FillPattern::U32(1.0f32.to_bits()), POOL_N, a)
        .unwrap();
    let filled = d.new_event().unwrap();
    a.record(&filled).unwrap();
    b.wait(&filled).unwrap();
    x.spin_on(iterations, b).unwrap();
    backend
        .launch(&Kernel::scale(block, 2.0, out.ptr(), POOL_N), b)
        .unwrap();
    block
}

/// An event on `stream` now: complete once the work queued on it so far is done.
fn reached(d: &Device, stream: &Stream) -> labs_core::Event {
    let e = d.new_event().unwrap();
    stream.record(&e).unwrap();
    e
}

#[test]
fn exercise_stream_pool_holds_a_block_until_the_reader_is_done() {
    let d = test_device();
    let (a, b) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let out = Tensor::zeros(&[POOL_N], DType::F32, &d).unwrap();
    d.synchronize().unwrap();
    let mut pool = StreamPool::new(&d, POOL_N * 4);
    let block = read_on_b(&d, &mut pool, (&a, &b), &out, Duration::from_millis(300));
    pool.record_stream(block, &b).unwrap();
    pool.free(block).unwrap();
    let read_done = reached(&d, &b);
    let next = pool.malloc(&a).unwrap();
    let reader_was_done = read_done.query().unwrap();
    assert!(
        next != block || reader_was_done,
        "the block was handed out again while stream B had still to read it"
    );
    assert!(
        !reader_was_done,
        "stream B was already done: free or malloc waited for it, blocking the host"
    );
    d.backend()
        .fill(next, FillPattern::U32(7.0f32.to_bits()), POOL_N, &a)
        .unwrap();
    b.synchronize().unwrap();
    a.synchronize().unwrap();
    let intact = out.to_vec::<f32>().unwrap();
    assert!(
        intact.iter().all(|&v| v == 2.0),
        "stream B read a block that A had refilled"
    );
    // B is done: the next allocation on A gets the block back, from no new memory.
    assert_eq!(
        pool.malloc(&a).unwrap(),
        block,
        "a block held back for good"
    );
    assert_eq!((pool.blocks(), pool.pending()), (2, 0));
}

#[test]
fn exercise_stream_pool_reuses_a_block_at_once_on_its_own_stream() {
    let d = test_device();
    let a = d.new_stream().unwrap();
    let (x, iterations) = busy_work(&d, &a, Duration::from_millis(100)).unwrap();
    let mut pool = StreamPool::new(&d, POOL_N * 4);
    let block = pool.malloc(&a).unwrap();
    x.spin_on(iterations, &a).unwrap();
    // Later work on A runs after the free: the block is reusable at once, even while
    // A is busy, and recording A itself changes nothing.
    pool.free(block).unwrap();
    assert_eq!(pool.malloc(&a).unwrap(), block);
    pool.record_stream(block, &a).unwrap();
    pool.free(block).unwrap();
    assert_eq!(
        pool.pending(),
        0,
        "a block used by its own stream only waited"
    );
    assert_eq!(pool.malloc(&a).unwrap(), block);
    assert_eq!(pool.blocks(), 1);
    // A block of another stream is not A's to reuse.
    let other = d.new_stream().unwrap();
    assert_ne!(pool.malloc(&other).unwrap(), block);
    a.synchronize().unwrap();
}

#[test]
fn exercise_stream_pool_waits_for_every_stream_that_used_the_block() {
    let d = test_device();
    let (a, b, c) = (
        d.new_stream().unwrap(),
        d.new_stream().unwrap(),
        d.new_stream().unwrap(),
    );
    let out = Tensor::zeros(&[POOL_N], DType::F32, &d).unwrap();
    d.synchronize().unwrap();
    let mut pool = StreamPool::new(&d, POOL_N * 4);
    let block = read_on_b(&d, &mut pool, (&a, &b), &out, Duration::from_millis(300));
    pool.record_stream(block, &c).unwrap();
    pool.record_stream(block, &b).unwrap();
    pool.record_stream(block, &c).unwrap();
    pool.free(block).unwrap();
    let read_done = reached(&d, &b);
    // C has nothing queued: its part of the wait is over at once, B's is not.
    c.synchronize().unwrap();
    let next = pool.malloc(&a).unwrap();
    assert!(
        next != block || read_done.query().unwrap(),
        "the block was handed out again once C was done, while B had still to read it"
    );
    b.synchronize().unwrap();
    pool.free(next).unwrap();
    let mut again = [pool.malloc(&a).unwrap(), pool.malloc(&a).unwrap()];
    again.sort_unstable();
    let mut both = [block, next];
    both.sort_unstable();
    assert_eq!(again, both, "both blocks are A's again once B is done");
    assert_eq!((pool.blocks(), pool.pending()), (2, 0));
    a.synchronize().unwrap();
}

#[test]
fn exercise_stream_pool_refuses_a_block_it_did_not_hand_out() {
    let d = test_device();
    let a = d.new_stream().unwrap();
    let mut pool = StreamPool::new(&d, 4096);
    let block = pool.malloc(&a).unwrap();
    pool.free(block).unwrap();
    assert!(pool.free(block).is_err(), "a block freed twice");
    assert!(
        pool.record_stream(block, &a).is_err(),
        "a freed block recorded"
    );
    assert!(
        pool.free(block + 1).is_err(),
        "a pointer the pool never gave"
    );
}
