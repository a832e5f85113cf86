//! What the fuzz and bad-input suites measure about each case: the heap it used at its
//! peak (a counting global allocator, per thread, so that tests running side by side do
//! not see each other's memory) and the time it took; and the shape of an error message.
//! Each test binary that declares `mod bounded;` installs the allocator.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

struct Counting;

thread_local! {
    // Const-initialised cells without destructors: reading them never allocates, so the
    // allocator may use them.
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grow(n: usize) {
    let _ = LIVE.try_with(|l| {
        let now = l.get().saturating_add(n);
        l.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

fn shrink(n: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(n)));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grow(layout.size());
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrink(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grow(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grow(new_size);
        shrink(layout.size());
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What one case cost.
pub struct Cost {
    /// Heap bytes allocated by this thread at the peak, above what it held at the start.
    pub peak_bytes: usize,
    pub elapsed: Duration,
}

/// Runs `f` and measures it.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Cost) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let start = Instant::now();
    let out = f();
    let elapsed = start.elapsed();
    let peak_bytes = PEAK.with(Cell::get).saturating_sub(base);
    (
        out,
        Cost {
            peak_bytes,
            elapsed,
        },
    )
}

/// Runs `f`, failing the test if it used more than `max_bytes` of heap or `max_time`.
pub fn bounded<R>(what: &str, max_bytes: usize, max_time: Duration, f: impl FnOnce() -> R) -> R {
    let (out, cost) = measure(f);
    assert!(
        cost.peak_bytes <= max_bytes,
        "{what}: used {} bytes of heap, more than {max_bytes}",
        cost.peak_bytes
    );
    assert!(
        cost.elapsed <= max_time,
        "{what}: took {:?}, more than {max_time:?}",
        cost.elapsed
    );
    out
}

/// The longest stretch of input an error may quote, plus room for the words around it:
/// an out-of-memory error (PyTorch's figures, a suggestion and the five largest live
/// allocations, one line as PyTorch's) is the longest.
pub const MAX_MESSAGE: usize = 1000;

/// An error message as the issue asks: one line, not empty, of bounded length.
pub fn assert_one_line(message: &str) {
    assert!(!message.trim().is_empty(), "empty error message");
    assert!(
        !message.trim_end().contains('\n'),
        "error message over several lines: {message}"
    );
    assert!(
        message.len() <= MAX_MESSAGE,
        "error message of {} bytes: {}...",
        message.len(),
        &message[..message.floor_char_boundary_compat(MAX_MESSAGE)]
    );
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        i = i.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

/// A file in a fresh temporary directory of this test process.
pub fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("labs-bad-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `bytes` gzip'd.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}
pub mod mutate;
pub mod pickles;

/// Loads a snapshot (either format) from `bytes` and uses what loaded (its summary and
/// memory timeline), each within `64 MiB + per_byte × input` of heap and five seconds;
/// a refusal must be a one-line error. Says how far it got: "loaded" or "refused".
pub fn check_snapshot(bytes: &[u8], per_byte: usize) -> &'static str {
    use labs_alloc::snapshot::{self, memory_timeline, Summary};
    const LIMIT: Duration = Duration::from_secs(5);
    let heap = (64 << 20) + per_byte * bytes.len();
    match bounded("loading", heap, LIMIT, || snapshot::load(bytes)) {
        Ok((snap, _)) => {
            bounded("summarising", heap, LIMIT, || {
                let _ = Summary::of(&snap);
                if let Ok(device) = snap.pick_device(None) {
                    let _ = memory_timeline(&snap, device);
                }
            });
            "loaded"
        }
        Err(e) => {
            assert_one_line(&e.to_string());
            "refused"
        }
    }
}

/// Runs `fuzz_cases(default)` cases of `strategy` through `test`, which returns what the case
/// came to (a short label such as "read" or "error"); prints the tally, so that a run
/// says what it covered, and returns it.
pub fn fuzz<S: proptest::strategy::Strategy>(
    name: &str,
    default: u32,
    strategy: S,
    test: impl Fn(S::Value) -> &'static str,
) -> std::collections::BTreeMap<&'static str, usize> {
    use labs_base::testing::{fuzz_cases, fuzz_seed, ENV_FUZZ_CASES, ENV_FUZZ_SEED};
    use std::cell::RefCell;
    let tally = RefCell::new(std::collections::BTreeMap::new());
    let (cases, seed) = (fuzz_cases(default), fuzz_seed(name));
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Default::default()
    });
    let result = runner.run(&strategy, |value| {
        *tally.borrow_mut().entry(test(value)).or_insert(0) += 1;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name} ({ENV_FUZZ_SEED}={seed} {ENV_FUZZ_CASES}={cases}): {e}");
    }
    let tally = tally.into_inner();
    eprintln!("{name}: {} cases: {tally:?}", tally.values().sum::<usize>());
    tally
}
