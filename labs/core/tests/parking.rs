//! Parked blocks (a freed block kept whole for the next request of its size) and the
//! page mappings of a training loop's steady state, on the device under test.

use labs_core::alloc::{Allocator, BlockState, Config};
use labs_core::testing::test_device;
use labs_core::Device;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn allocator(device: &Device, conf: &str) -> Allocator {
    Allocator::new(device.backend_arc(), Config::parse(conf).unwrap()).unwrap()
}

/// A freed small block is parked and handed back whole to the next request of its
/// size; any other request merges it first, and the statistics read as if it had been
/// merged at once.
#[test]
fn a_freed_small_block_is_reused_whole_and_otherwise_merged() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "expandable_segments:False");
    let keep = a.malloc(512, &stream).unwrap();
    let b = a.malloc(3000, &stream).unwrap();
    let ptr = b.ptr();
    a.free(b).unwrap();
    a.check_invariants().unwrap();
    let again = a.malloc(3000, &stream).unwrap();
    assert_eq!(again.ptr(), ptr);
    assert_eq!(a.stats().num_parked_hits, 1);
    a.free(again).unwrap();
    // Merged with the free tail: one free block after `keep`, as without parking.
    let s = a.stats();
    assert_eq!((s.inactive_split.current, s.num_parked_hits), (1, 1));
    let blocks = &a.segments()[0].blocks;
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(blocks[1].state, BlockState::Free);
    // A request of another size is served by best fit, right after `keep`.
    a.free(a.malloc(3000, &stream).unwrap()).unwrap();
    let other = a.malloc(8192, &stream).unwrap();
    assert_eq!(other.ptr(), ptr);
    assert_eq!(a.stats().num_parked_hits, 1);
    a.check_invariants().unwrap();
    for b in [keep, other] {
        a.free(b).unwrap();
    }
    a.check_invariants().unwrap();
}

/// A freed large block is handed back whole only where best fit would have put the
/// request anyway; when a tighter free block exists, the request goes there.
#[test]
fn a_parked_large_block_yields_to_a_tighter_fit() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "expandable_segments:False");
    // One 20 MiB segment: A 6 MiB, B 4 MiB, C 4 MiB, then 6 MiB free.
    let blocks: Vec<_> = [6, 4, 4]
        .iter()
        .map(|&m| a.malloc(m << 20, &stream).unwrap())
        .collect();
    let (pa, pc) = (blocks[0].ptr(), blocks[2].ptr());
    assert_eq!(pc, pa + (10 << 20), "one segment, in order");
    let mut it = blocks.into_iter();
    let (ba, bb, bc) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    // Freed alone, C comes back for the next 4 MiB request: best fit would take the
    // merged C + tail at C's address too.
    a.free(bc).unwrap();
    a.check_invariants().unwrap();
    let c = a.malloc(4 << 20, &stream).unwrap();
    assert_eq!((c.ptr(), a.stats().num_parked_hits), (pc, 1));
    // With A free as well, A's 6 MiB is the tighter fit for 4 MiB.
    a.free(ba).unwrap();
    a.free(c).unwrap();
    a.check_invariants().unwrap();
    let d = a.malloc(4 << 20, &stream).unwrap();
    assert_eq!(d.ptr(), pa);
    assert_eq!(a.stats().num_parked_hits, 1);
    a.check_invariants().unwrap();
    for b in [bb, d] {
        a.free(b).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
}

/// The allocation pattern of lab 3's training loop (an MLP with Adam: activations saved
/// in the forward pass and freed in reverse, temporaries, gradients, moments made at
/// the first step). Pages freed in one place are found again where the next step needs
/// them, so from the third step on the loop makes no driver call and no device-wide
/// synchronisation.
#[test]
fn a_training_loop_settles_after_its_second_step() {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, "expandable_segments:True");
    let m = |bytes: u64| a.malloc(bytes as usize, &stream).unwrap();
    let (act, weight, loss) = (8 * MIB, 16 * MIB, 4096);
    let weights: Vec<_> = (0..4).map(|_| m(weight)).collect();
    let mut moments = Vec::new();
    let mut counts = Vec::new();
    for step in 0..8 {
        let mut saved = vec![m(act)];
        for _ in 0..4 {
            let t = m(act);
            saved.push(m(act));
            a.free(t).unwrap();
        }
        let l = m(loss);
        let mut grad = m(act);
        let mut grads = Vec::new();
        for _ in 0..4 {
            let x = saved.pop().unwrap();
            let g = m(act);
            a.free(grad).unwrap();
            grad = g;
            grads.push(m(weight));
            a.free(x).unwrap();
        }
        for b in saved.drain(..).chain([grad]) {
            a.free(b).unwrap();
        }
        if step == 0 {
            moments = (0..8).map(|_| m(weight)).collect();
        }
        for _ in 0..4 {
            let sq = m(weight);
            a.free(sq).unwrap();
        }
        for b in grads.into_iter().chain([l]) {
            a.free(b).unwrap();
        }
        a.check_invariants().unwrap();
        let s = a.stats();
        counts.push((s.num_maps, s.num_unmaps, s.num_sync_all_streams));
    }
    assert!(
        counts[2..].iter().all(|c| *c == counts[2]),
        "driver calls after the second step: {counts:?}"
    );
    for b in weights.into_iter().chain(moments) {
        a.free(b).unwrap();
    }
}

#[derive(Debug, Clone)]
enum LargeOp {
    Alloc(u64),
    Free(usize),
    EmptyCache,
}

fn large_op() -> impl Strategy<Value = LargeOp> {
    let size = prop_oneof![
        prop::sample::select(vec![2 << 20, 4 << 20, 6 << 20, 20 << 20, 48 << 20]),
        ((1u64 << 20) + 1)..(64 << 20),
    ];
    prop_oneof![
        6 => size.prop_map(LargeOp::Alloc),
        5 => (0usize..64).prop_map(LargeOp::Free),
        1 => Just(LargeOp::EmptyCache),
    ]
}

/// Runs `ops` on a fresh simulated GPU; returns every address handed out and the
/// final statistics.
fn run_large_ops(conf: &str, ops: &[LargeOp]) -> (Vec<u64>, labs_core::alloc::Stats) {
    use labs_core::device::sim_backend;
    let a = Allocator::new(sim_backend(16 << 30), Config::parse(conf).unwrap()).unwrap();
    let (mut live, mut addrs) = (Vec::new(), Vec::new());
    for op in ops {
        match *op {
            LargeOp::Alloc(size) => {
                let b = a.malloc_on(size, 0).unwrap();
                addrs.push(b.ptr());
                live.push(b);
            }
            LargeOp::Free(i) if !live.is_empty() => {
                let b = live.remove(i % live.len());
                a.free(b).unwrap();
            }
            LargeOp::EmptyCache => {
                a.empty_cache().unwrap();
            }
            _ => {}
        }
        a.check_invariants().unwrap();
    }
    (addrs, a.stats())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A parked large block is handed back only where best fit would have put the
    /// request: an allocator that parks and one that does not hand out the same
    /// addresses, map the same pages and reach the same peaks. (Two allocators are
    /// compared address for address, which needs two identical address spaces: two
    /// fresh simulated GPUs, whatever `LABS_DEVICE` says.)
    #[test]
    fn parking_large_blocks_changes_no_decision(ops in prop::collection::vec(large_op(), 1..120)) {
        for conf in ["expandable_segments:True", "expandable_segments:False"] {
            let (with, s1) = run_large_ops(conf, &ops);
            let (without, s2) = run_large_ops(&format!("{conf},park_freed_blocks:False"), &ops);
            prop_assert_eq!(&with, &without, "{}", conf);
            prop_assert_eq!(
                (s1.reserved.peak, s1.allocated.peak, s1.num_maps, s1.num_unmaps, s1.device_allocs),
                (s2.reserved.peak, s2.allocated.peak, s2.num_maps, s2.num_unmaps, s2.device_allocs)
            );
            prop_assert_eq!(s2.num_parked_hits, 0);
        }
    }
}
