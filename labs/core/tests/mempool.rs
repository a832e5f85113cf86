//! Private memory pools (PyTorch's `torch.cuda.MemPool` and `use_mem_pool`): a pool's
//! allocations come from its own segments and its free blocks serve only it; its
//! figures add up with the device's; `empty_cache` keeps a live pool's segments and
//! gives back a released one's; a block alive in a released pool gives its segment back
//! when freed; scopes belong to threads. Each test drives an allocator of its own on the
//! device under test, so that its figures are its own.

use labs_core::alloc::{Allocation, Allocator, Config, MemPoolId, MemPoolStats};
use labs_core::testing::test_device;
use labs_core::{Device, Stream};

const MIB: usize = 1 << 20;

/// The configurations pools are tested under: PyTorch's defaults, the labs' preset
/// (parking, expandable segments that recycle idle pages), PyTorch's expandable segments.
const CONFIGS: [&str; 3] = ["", "preset:labs", "expandable_segments:True"];

fn allocator(device: &Device, conf: &str) -> Allocator {
    Allocator::new(device.backend_arc(), Config::parse(conf).unwrap()).unwrap()
}

fn setup(conf: &str) -> (Device, Stream, Allocator) {
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let a = allocator(&device, conf);
    (device, stream, a)
}

/// Allocates `size` bytes inside pool `pool`'s scope.
fn in_pool(a: &Allocator, pool: MemPoolId, size: usize, stream: &Stream) -> Allocation {
    let _scope = a.use_pool(pool).unwrap();
    a.malloc(size, stream).unwrap()
}

#[test]
fn a_pool_neither_takes_the_default_pools_free_blocks_nor_lends_its_own() {
    for conf in CONFIGS {
        for size in [512, 4 * MIB] {
            let (_device, stream, a) = setup(conf);
            let pool = a.create_pool();
            let d = a.malloc(size, &stream).unwrap();
            let default_ptr = d.ptr();
            a.free(d).unwrap();

            // Inside the scope: the default pool's free block of the right size is not used.
            let x = in_pool(&a, pool, size, &stream);
            assert_ne!(
                x.ptr(),
                default_ptr,
                "{conf:?} {size}: took the default block"
            );
            assert_eq!(a.pool_of(&x).unwrap(), pool);
            let pool_ptr = x.ptr();
            let pool_segments = a.pool_stats(pool).unwrap().segments;
            assert!(pool_segments >= 1, "{conf:?} {size}");
            a.free(x).unwrap();

            // Outside it: the pool's free block is not lent to the default pool.
            let y = a.malloc(size, &stream).unwrap();
            assert_eq!(a.pool_of(&y).unwrap(), MemPoolId::DEFAULT);
            assert_ne!(
                y.ptr(),
                pool_ptr,
                "{conf:?} {size}: default took a pool block"
            );
            let z = a.malloc(size, &stream).unwrap();
            assert_ne!(
                z.ptr(),
                pool_ptr,
                "{conf:?} {size}: default took a pool block"
            );

            // The pool's later allocations reuse its blocks: no new segment.
            let w = in_pool(&a, pool, size, &stream);
            assert_eq!(
                w.ptr(),
                pool_ptr,
                "{conf:?} {size}: the pool's block not reused"
            );
            assert_eq!(a.pool_stats(pool).unwrap().segments, pool_segments);
            a.check_invariants().unwrap();
            for b in [y, z, w] {
                a.free(b).unwrap();
            }
            a.release_pool(pool).unwrap();
            a.empty_cache().unwrap();
            assert_eq!(a.memory_reserved(), 0, "{conf:?} {size}");
        }
    }
}

#[test]
fn pool_figures_add_up_with_the_devices() {
    for conf in CONFIGS {
        let (_device, stream, a) = setup(conf);
        let pools = [a.create_pool(), a.create_pool()];
        let mut live: Vec<(MemPoolId, Allocation)> = Vec::new();
        for (i, size) in [3000, 2 * MIB, 700, 25 * MIB, 64 * 1024, 9 * MIB]
            .into_iter()
            .enumerate()
        {
            for pool in [MemPoolId::DEFAULT, pools[0], pools[1]] {
                let b = if pool == MemPoolId::DEFAULT {
                    a.malloc(size + i, &stream).unwrap()
                } else {
                    in_pool(&a, pool, size + i, &stream)
                };
                live.push((pool, b));
            }
        }
        // Free every third block, so that the pools hold free memory too.
        for i in (0..live.len()).rev().step_by(3) {
            let (_, b) = live.swap_remove(i);
            a.free(b).unwrap();
        }
        let mut sum = MemPoolStats::default();
        for pool in [MemPoolId::DEFAULT, pools[0], pools[1]] {
            let s = a.pool_stats(pool).unwrap();
            let mine: Vec<_> = live.iter().filter(|e| e.0 == pool).map(|e| e.1).collect();
            assert_eq!(s.allocated, mine.iter().map(|b| b.size()).sum::<u64>());
            assert_eq!(s.requested, mine.iter().map(|b| b.requested()).sum::<u64>());
            assert_eq!(s.blocks, mine.len() as u64);
            let segments: Vec<_> = a
                .segments()
                .into_iter()
                .filter(|g| g.pool_id == pool)
                .collect();
            assert_eq!(s.segments, segments.len() as u64, "{conf:?} {pool}");
            assert_eq!(s.reserved, segments.iter().map(|g| g.mapped()).sum::<u64>());
            sum.reserved += s.reserved;
            sum.allocated += s.allocated;
            sum.segments += s.segments;
        }
        let stats = a.stats();
        assert_eq!(sum.reserved, stats.reserved.current, "{conf:?}");
        assert_eq!(sum.allocated, stats.allocated.current, "{conf:?}");
        assert_eq!(sum.segments, stats.segments.all.current, "{conf:?}");
        assert_eq!(
            a.private_pools_reserved(),
            sum.reserved - a.pool_stats(MemPoolId::DEFAULT).unwrap().reserved
        );
        a.check_invariants().unwrap();
        for (_, b) in live {
            a.free(b).unwrap();
        }
    }
}

#[test]
fn empty_cache_keeps_a_live_pools_segments_and_gives_back_a_released_ones() {
    for conf in CONFIGS {
        let (_device, stream, a) = setup(conf);
        let pool = a.create_pool();
        let d = a.malloc(6 * MIB, &stream).unwrap();
        let x = in_pool(&a, pool, 6 * MIB, &stream);
        let small = in_pool(&a, pool, 4096, &stream);
        a.free(d).unwrap();
        a.free(x).unwrap();
        a.free(small).unwrap();
        let held = a.pool_stats(pool).unwrap();
        assert!(held.reserved >= 6 * MIB as u64, "{conf:?}: {held:?}");

        a.empty_cache().unwrap();
        assert_eq!(
            a.pool_stats(pool).unwrap().reserved,
            held.reserved,
            "{conf:?}"
        );
        assert_eq!(
            a.pool_stats(MemPoolId::DEFAULT).unwrap().reserved,
            0,
            "{conf:?}"
        );
        assert_eq!(a.memory_reserved(), held.reserved, "{conf:?}");

        // Released, with nothing alive: every segment goes back at once.
        let released = a.release_pool(pool).unwrap();
        assert_eq!(released, held.reserved, "{conf:?}");
        assert_eq!(a.memory_reserved(), 0, "{conf:?}");
        let after = a.pool_stats(pool).unwrap();
        assert!(after.released && after.segments == 0, "{conf:?}: {after:?}");
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_block_alive_in_a_released_pool_gives_its_segment_back_when_freed() {
    for conf in CONFIGS {
        let (_device, stream, a) = setup(conf);
        let pool = a.create_pool();
        let other = a.create_pool();
        let keep = in_pool(&a, pool, 30 * MIB, &stream);
        let gone = in_pool(&a, pool, 3000, &stream);
        let neighbour = in_pool(&a, other, 30 * MIB, &stream);
        a.free(gone).unwrap();
        let before = a.pool_stats(pool).unwrap();
        let released = a.release_pool(pool).unwrap();
        // The small segment, wholly free, goes now; the live block's stays.
        let now = a.pool_stats(pool).unwrap();
        assert!(
            released > 0 && now.reserved >= keep.size(),
            "{conf:?}: {now:?}"
        );
        assert_eq!(now.reserved + released, before.reserved, "{conf:?}");
        assert!(a.begin_allocate_to_pool(pool).is_err(), "{conf:?}");
        a.check_invariants().unwrap();

        a.free(keep).unwrap();
        assert_eq!(a.pool_stats(pool).unwrap().reserved, 0, "{conf:?}");
        assert_eq!(a.pool_stats(pool).unwrap().segments, 0, "{conf:?}");
        // The other pool is untouched.
        assert!(a.pool_stats(other).unwrap().reserved >= neighbour.size());
        a.check_invariants().unwrap();
        a.free(neighbour).unwrap();
        assert!(a.pool_stats(other).unwrap().reserved >= neighbour.size());
    }
}

#[test]
fn two_pools_never_share_a_segment() {
    for conf in CONFIGS {
        let (_device, stream, a) = setup(conf);
        let pools = [a.create_pool(), a.create_pool()];
        let mut live = Vec::new();
        for i in 0..40 {
            let pool = pools[i % 2];
            let size = [512, 3000, 100_000, 3 * MIB][i % 4];
            live.push((pool, in_pool(&a, pool, size, &stream)));
        }
        let segments = a.segments();
        for (pool, b) in &live {
            let seg = segments
                .iter()
                .find(|s| s.base <= b.ptr() && b.ptr() < s.base + s.size)
                .unwrap();
            assert_eq!(seg.pool_id, *pool, "{conf:?}: block {:#x}", b.ptr());
        }
        for s in &segments {
            let pools_in: Vec<_> = live
                .iter()
                .filter(|(_, b)| s.base <= b.ptr() && b.ptr() < s.base + s.size)
                .map(|(p, _)| *p)
                .collect();
            assert!(pools_in.windows(2).all(|w| w[0] == w[1]), "{conf:?}");
        }
        for (_, b) in live {
            a.free(b).unwrap();
        }
        a.check_invariants().unwrap();
    }
}

#[test]
fn scopes_belong_to_the_thread_that_opens_them_and_nest() {
    let (_device, stream, a) = setup("");
    let (p, q) = (a.create_pool(), a.create_pool());
    let outer = a.use_pool(p).unwrap();
    assert_eq!(a.current_pool(), p);
    // Another thread allocates from the default pool meanwhile.
    let theirs = std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(a.current_pool(), MemPoolId::DEFAULT);
            a.malloc(1024, &stream).unwrap()
        })
        .join()
        .unwrap()
    });
    assert_eq!(a.pool_of(&theirs).unwrap(), MemPoolId::DEFAULT);
    let mine = a.malloc(1024, &stream).unwrap();
    assert_eq!(a.pool_of(&mine).unwrap(), p);
    {
        let _inner = a.use_pool(q).unwrap();
        let b = a.malloc(1024, &stream).unwrap();
        assert_eq!(a.pool_of(&b).unwrap(), q);
        a.free(b).unwrap();
    }
    assert_eq!(a.current_pool(), p);
    // A pool in a scope cannot be released.
    assert!(a.release_pool(p).is_err());
    drop(outer);
    assert_eq!(a.current_pool(), MemPoolId::DEFAULT);
    assert!(a.end_allocate_to_pool(p).is_err());
    let after = a.malloc(1024, &stream).unwrap();
    assert_eq!(a.pool_of(&after).unwrap(), MemPoolId::DEFAULT);
    for b in [theirs, mine, after] {
        a.free(b).unwrap();
    }
    a.release_pool(p).unwrap();
    assert!(a.release_pool(p).is_err(), "released twice");
    assert!(a.use_pool(p).is_err());
    assert!(a.use_pool(MemPoolId::DEFAULT).is_err());
    assert!(a.pool_stats(MemPoolId(99)).is_err());
    a.check_invariants().unwrap();
}

#[test]
fn a_pool_on_two_streams_keeps_each_streams_blocks_apart() {
    let (device, stream, a) = setup("");
    let side = device.new_stream().unwrap();
    let pool = a.create_pool();
    let x = in_pool(&a, pool, 4 * MIB, &stream);
    let x_ptr = x.ptr();
    a.free(x).unwrap();
    // The pool's block freed on one stream serves the pool's requests on that stream only.
    let y = in_pool(&a, pool, 4 * MIB, &side);
    assert_ne!(y.ptr(), x_ptr);
    assert_eq!(a.pool_of(&y).unwrap(), pool);
    let z = in_pool(&a, pool, 4 * MIB, &stream);
    assert_eq!(z.ptr(), x_ptr);
    a.check_invariants().unwrap();
    a.free(y).unwrap();
    a.free(z).unwrap();
}

#[test]
fn the_summary_has_a_row_for_the_private_pools_once_one_exists() {
    let (_device, stream, a) = setup("");
    assert!(!a.memory_summary().contains("Private pools"));
    let pool = a.create_pool();
    let x = in_pool(&a, pool, 4 * MIB, &stream);
    let summary = a.memory_summary();
    let row = summary
        .lines()
        .find(|l| l.contains("Private pools"))
        .unwrap_or_else(|| panic!("{summary}"));
    let held = labs_core::format::bytes(a.pool_stats(pool).unwrap().reserved);
    assert!(row.contains(&format!("1 made, {held} reserved")), "{row}");
    assert_eq!(
        row.len(),
        summary.lines().next().unwrap().len(),
        "{summary}"
    );
    assert!(summary.trim_end().ends_with("=|"), "{summary}");
    a.free(x).unwrap();
}

/// An out-of-memory error while a pool holds memory says how much, as PyTorch's does
/// ("with ... allocated in private pools").
#[test]
fn out_of_memory_counts_what_private_pools_hold() {
    let (device, stream, a) = setup("");
    let pool = a.create_pool();
    let x = in_pool(&a, pool, 4 * MIB, &stream);
    let d = a.malloc(2 * MIB, &stream).unwrap();
    let held = a.pool_stats(pool).unwrap().allocated;
    assert_eq!(held, 4 * MIB as u64);
    // A cap just above what is reserved: the next large request fails for good.
    let total = device.properties().unwrap().total_memory;
    let reserved = a.memory_reserved();
    a.set_memory_fraction((reserved + MIB as u64) as f64 / total as f64)
        .unwrap();
    let e = a.malloc(64 * MIB, &stream).unwrap_err().to_string();
    assert!(e.contains("out of memory"), "{e}");
    assert!(
        e.contains(&format!(
            "with {} allocated in private pools",
            labs_core::format::bytes(held)
        )),
        "{e}"
    );
    a.free(d).unwrap();
    a.free(x).unwrap();
    // With no private pool holding memory, the sentence is not there.
    let e = a.malloc(64 * MIB, &stream).unwrap_err().to_string();
    assert!(!e.contains("private pools"), "{e}");
}

#[test]
fn a_pool_that_lends_on_out_of_memory_serves_the_default_pool_and_gets_its_block_back() {
    // Under expandable segments too: the pool's idle pages are its own, never recycled
    // for the default pool's growth.
    for conf in CONFIGS {
        for lends in [false, true] {
            let (device, stream, a) = setup(conf);
            let pool = a.create_pool_with(lends);
            // 32 MiB made in the pool, then freed: a free block that only the pool uses.
            let x = in_pool(&a, pool, 32 * MIB, &stream);
            let pool_ptr = x.ptr();
            a.free(x).unwrap();
            // A cap at what is reserved: the default pool cannot grow any more.
            let total = device.properties().unwrap().total_memory;
            a.set_memory_fraction(a.memory_reserved() as f64 / total as f64)
                .unwrap();
            let result = a.malloc(16 * MIB, &stream);
            if !lends {
                let e = match result {
                    Ok(y) => panic!(
                        "{conf:?}: served at {:#x} (pool's block {pool_ptr:#x}), pool {:?}, reserved {}",
                        y.ptr(),
                        a.pool_of(&y),
                        a.memory_reserved()
                    ),
                    Err(e) => e.to_string(),
                };
                assert!(e.contains("out of memory"), "{conf:?}: {e}");
                continue;
            }
            let y = result.unwrap_or_else(|e| panic!("{conf:?}: {e}"));
            // The block is the pool's: taken from its free memory, counted in it.
            assert_eq!(a.pool_of(&y).unwrap(), pool, "{conf:?}");
            assert_eq!(y.ptr(), pool_ptr, "{conf:?}");
            assert_eq!(a.pool_stats(pool).unwrap().allocated, 16 * MIB as u64);
            assert_eq!(a.stats().num_ooms, 0, "{conf:?}");
            // Freed, it goes back to the pool, whose scope finds it again.
            a.free(y).unwrap();
            assert_eq!(a.pool_stats(pool).unwrap().allocated, 0);
            let z = in_pool(&a, pool, 32 * MIB, &stream);
            assert_eq!(z.ptr(), pool_ptr, "{conf:?}");
            a.free(z).unwrap();
            a.check_invariants().unwrap();
        }
    }
}

/// Snapshots give each segment its pool, as PyTorch's `segment_pool_id`: `(0, 0)` for
/// the default pool, `(0, n)` for the n-th pool; the JSON keeps it.
#[test]
fn snapshots_name_each_segments_pool() {
    let (_device, stream, a) = setup("");
    let pool = a.create_pool();
    let x = in_pool(&a, pool, 4 * MIB, &stream);
    let d = a.malloc(4 * MIB, &stream).unwrap();
    let snap = a.snapshot();
    let pool_of = |ptr: u64| {
        snap.segments
            .iter()
            .find(|s| s.address <= ptr && ptr < s.address + s.total_size)
            .map(|s| s.segment_pool_id)
            .unwrap()
    };
    assert_eq!(pool_of(x.ptr()), (0, pool.0));
    assert_eq!(pool_of(d.ptr()), (0, 0));
    let json = serde_json::to_string(&snap).unwrap();
    let back: labs_core::snapshot::Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back.segments, snap.segments);
    a.free(d).unwrap();
    a.free(x).unwrap();
}

#[test]
fn a_streams_scope_takes_that_streams_allocations_from_every_thread_and_no_other() {
    for conf in CONFIGS {
        let (device, default, a) = setup(conf);
        let capture = device.new_stream().unwrap();
        let pool = a.create_pool();
        a.begin_allocate_stream_to_pool(pool, &capture).unwrap();
        // On the captured stream, from this thread and from another one: the pool's.
        let here = a.malloc(MIB, &capture).unwrap();
        assert_eq!(a.pool_of(&here).unwrap(), pool, "{conf:?}");
        let there =
            std::thread::scope(|s| s.spawn(|| a.malloc(MIB, &capture).unwrap()).join().unwrap());
        assert_eq!(a.pool_of(&there).unwrap(), pool, "{conf:?}");
        // On another stream of the same thread: the default pool's, and the thread's
        // current pool is still the default one.
        let other = a.malloc(MIB, &default).unwrap();
        assert_eq!(a.pool_of(&other).unwrap(), MemPoolId::DEFAULT, "{conf:?}");
        assert_eq!(a.current_pool(), MemPoolId::DEFAULT);
        // A pool in a capture's scope cannot be released; ending the scope twice fails.
        assert!(a.release_pool(pool).is_err());
        a.end_allocate_stream_to_pool(pool, &capture).unwrap();
        let again = a.end_allocate_stream_to_pool(pool, &capture).unwrap_err();
        assert!(again.to_string().contains("no scope sends"), "{again}");
        // After the scope: the stream allocates from the default pool.
        let after = a.malloc(MIB, &capture).unwrap();
        assert_eq!(a.pool_of(&after).unwrap(), MemPoolId::DEFAULT, "{conf:?}");
        assert_eq!(a.pool_stats(pool).unwrap().blocks, 2, "{conf:?}");
        for b in [here, there, other, after] {
            a.free(b).unwrap();
        }
        a.release_pool(pool).unwrap();
        assert_eq!(a.pool_stats(pool).unwrap().reserved, 0, "{conf:?}");
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_cross_stream_free_during_a_capture_waits_for_the_capture_to_end() {
    for conf in CONFIGS {
        let (device, default, a) = setup(conf);
        let (capture, other) = (device.new_stream().unwrap(), device.new_stream().unwrap());
        let pool = a.create_pool();
        let used = a.malloc(4 * MIB, &default).unwrap();
        let ptr = used.ptr();
        a.record_stream(&used, &other).unwrap();
        a.begin_allocate_stream_to_pool(pool, &capture).unwrap();
        a.free(used).unwrap();
        // No event was recorded for it (none may be while capturing), and the block is
        // not lent again, to this stream or any.
        assert_eq!(a.stats().num_deferred_frees, 0, "{conf:?}");
        let again = a.malloc(4 * MIB, &default).unwrap();
        assert_ne!(
            again.ptr(),
            ptr,
            "{conf:?}: reused a block other work may use"
        );
        a.check_invariants().unwrap();
        a.end_allocate_stream_to_pool(pool, &capture).unwrap();
        // With the capture over, its event is recorded; once the other stream's work is
        // done, the block serves its stream again.
        assert_eq!(a.stats().num_deferred_frees, 1, "{conf:?}");
        other.synchronize().unwrap();
        let later = a.malloc(4 * MIB, &default).unwrap();
        assert_eq!(later.ptr(), ptr, "{conf:?}");
        for b in [again, later] {
            a.free(b).unwrap();
        }
        a.release_pool(pool).unwrap();
        a.check_invariants().unwrap();
    }
}

#[test]
fn out_of_memory_in_a_capture_fails_at_once_and_gives_nothing_back() {
    let (device, default, a) = setup("");
    a.set_memory_fraction(64.0 * MIB as f64 / device.mem_info().unwrap().total as f64)
        .unwrap();
    let capture = device.new_stream().unwrap();
    // A cached segment of the default pool, free: outside a capture the ladder would
    // give it back to make room.
    let cached = a.malloc(40 * MIB, &default).unwrap();
    a.free(cached).unwrap();
    let reserved = a.memory_reserved();
    let pool = a.create_pool();
    a.begin_allocate_stream_to_pool(pool, &capture).unwrap();
    let err = a.malloc(40 * MIB, &capture).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(
        a.memory_reserved(),
        reserved,
        "the cache was given back in a capture"
    );
    a.end_allocate_stream_to_pool(pool, &capture).unwrap();
    // After it, the same request succeeds by giving the cached segment back.
    let fits = a.malloc(40 * MIB, &capture).unwrap();
    a.free(fits).unwrap();
    a.release_pool(pool).unwrap();
}
