//! The alloc+free pair on each path (`cargo bench -p labs-core`); `LABS_DEVICE=cuda`
//! measures the GPU. `lab-02 bench` prints the same figures side by side in one run.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use labs_core::alloc::{Allocator, Config};
use labs_core::testing::test_device;

const SIZES: [(u64, &str); 3] = [(512, "512B"), (1 << 20, "1MiB"), (20 << 20, "20MiB")];

fn pairs(c: &mut Criterion) {
    let device = test_device();
    let stream = device.default_stream().unwrap().handle();
    let mut group = c.benchmark_group("alloc_free_pair");
    for (size, label) in SIZES {
        let alone = Allocator::new(device.backend_arc(), Config::default()).unwrap();
        group.bench_function(BenchmarkId::new("cached", label), |b| {
            b.iter(|| {
                let block = alone.malloc_on(size, stream).unwrap();
                alone.free(block).unwrap();
            })
        });

        let busy = Allocator::new(device.backend_arc(), Config::default()).unwrap();
        let live: Vec<_> = (0..1000u64)
            .map(|i| busy.malloc_on(512 << (i * 7919 % 14), stream).unwrap())
            .collect();
        group.bench_function(BenchmarkId::new("cached_1000_live", label), |b| {
            b.iter(|| {
                let block = busy.malloc_on(size, stream).unwrap();
                busy.free(block).unwrap();
            })
        });
        for block in live {
            busy.free(block).unwrap();
        }

        let backend = device.backend();
        group.bench_function(BenchmarkId::new("raw_driver", label), |b| {
            b.iter(|| {
                let p = backend.raw_alloc(size as usize).unwrap();
                backend.raw_free(p).unwrap();
            })
        });
    }
    group.finish();
}

/// What the statistics' neighbours cost: the 512 B pair with the memory history
/// recorded (with and without backtraces), and with parking off.
fn variants(c: &mut Criterion) {
    let device = test_device();
    let stream = device.default_stream().unwrap().handle();
    let mut group = c.benchmark_group("alloc_free_pair_512B");
    let cases: [(&str, &str, Option<bool>); 4] = [
        ("default", "", None),
        ("history", "", Some(false)),
        ("history_with_backtraces", "", Some(true)),
        ("no_parking", "park_freed_blocks:False", None),
    ];
    for (name, conf, history) in cases {
        let a = Allocator::new(device.backend_arc(), Config::parse(conf).unwrap()).unwrap();
        if let Some(backtraces) = history {
            // A ring buffer small enough to stay in cache, as a long job's would wrap.
            a.record_memory_history(4096, backtraces);
        }
        group.bench_function(name, |b| {
            b.iter(|| {
                let block = a.malloc_on(512, stream).unwrap();
                a.free(block).unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, pairs, variants);
criterion_main!(benches);
