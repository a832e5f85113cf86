//! Fuzzing the trace CSV reader and replay: mutations of hand-built traces and of the
//! start of a real one, plain and gzip'd. Every case must end, without a panic, in
//! events or a one-line error, within bounded memory and time; events that were read
//! must replay (strict and lenient) to a report or a one-line error, equally bounded.
//! `LABS_FUZZ_CASES=10000 cargo test -p labs-core --test fuzz_trace` for a longer run.

#[path = "../alloc/tests/bounded/mod.rs"]
mod bounded;

use std::io::Read;
use std::time::Duration;

use bounded::mutate::{apply, mutations};
use bounded::{assert_one_line, bounded, gzip};
use labs_core::alloc::replay::{replay_with, Trace};
use labs_core::alloc::{Allocator, Config};
use labs_core::device::sim_backend;
use labs_core::snapshot::{read_trace_from, TraceLimits};
use proptest::prelude::*;

const HAND_BUILT: &str = "action,addr,size,stream\n\
alloc,4096,512,0\n\
alloc,8192,3000000,7\n\
segment_alloc,0,20971520,7\n\
free_requested,4096,512,0\n\
free_completed,4096,512,0\n\
alloc,4096,1048577,140234\n\
free_requested,8192,3000000,7\n\
free_requested,4096,1048577,140234\n\
oom,0,99999999999,0\n";

/// The seeds: the hand-built trace, and the first 300 lines of a real one when the
/// shared data is there.
fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![HAND_BUILT.as_bytes().to_vec()];
    let real = labs_core::testing::data_dir().join("traces/seed_transformer_b64.trace.csv.gz");
    if let Ok(file) = std::fs::File::open(real) {
        let mut text = String::new();
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .unwrap();
        let head: Vec<&str> = text.lines().take(300).collect();
        seeds.push(format!("{}\n", head.join("\n")).into_bytes());
    }
    seeds
}

const MIB: usize = 1 << 20;
const LIMIT: Duration = Duration::from_secs(5);

/// Reads and replays `bytes`; says how far it got.
fn check(bytes: &[u8]) -> &'static str {
    let limits = TraceLimits {
        max_bytes: 1 << 20,
        max_line: 256,
    };
    let read = bounded("reading", 16 * MIB + 64 * bytes.len(), LIMIT, || {
        read_trace_from("fuzz.csv", bytes, limits)
    });
    let events = match read {
        Ok(events) => events,
        Err(e) => {
            assert_one_line(&e.to_string());
            return "refused";
        }
    };
    let trace = Trace {
        name: "fuzz".into(),
        events,
    };
    let mut outcome = "read, replay refused";
    for lenient in [false, true] {
        let allocator = Allocator::new(sim_backend(80 << 30), Config::default()).unwrap();
        let result = bounded("replaying", 64 * MIB, LIMIT, || {
            replay_with(&trace, &allocator, lenient)
        });
        match result {
            Ok(_) => {
                outcome = if lenient {
                    "read, replayed leniently"
                } else {
                    "read and replayed"
                }
            }
            Err(e) => assert_one_line(&e.to_string()),
        }
        if outcome == "read and replayed" {
            break;
        }
    }
    outcome
}

#[test]
fn mutated_traces_read_and_replay_cleanly() {
    let seeds = seeds();
    let strategy = (any::<prop::sample::Index>(), mutations(2), any::<bool>());
    let tally = bounded::fuzz("fuzz_trace", 200, strategy, |(seed, m, zipped)| {
        let text = apply(&seeds[seed.index(seeds.len())], &m);
        let bytes = if zipped { gzip(&text) } else { text };
        check(&bytes)
    });
    // The mutations must leave some traces valid, or the replay is never fuzzed.
    assert!(tally.contains_key("read and replayed"), "{tally:?}");
}

/// Sizes and streams at the allocator's edges, and ordinary ones.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        1u64..(64 << 20),
        prop::sample::select(vec![
            0,
            1,
            511,
            512,
            513,
            1 << 20,
            (1 << 20) + 1,
            10 << 20,
            80 << 30,
            (80 << 30) + 1,
            1 << 48,
            (1 << 48) + 1,
            1 << 63,
            u64::MAX - 511,
            u64::MAX
        ]),
    ]
}

fn stream() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..4, any::<u64>()]
}

#[test]
fn generated_valid_traces_replay_cleanly() {
    // Well-formed lines of every action over a few addresses: double frees, unknown
    // frees, re-allocations of live addresses and sizes up to 2^64 - 1 all occur.
    let line = (0usize..4, 0u64..8, size(), stream());
    let strategy = proptest::collection::vec(line, 1..60);
    let tally = bounded::fuzz("fuzz_trace: generated", 100, strategy, |lines| {
        let mut text = String::from("action,addr,size,stream\n");
        for (action, addr, size, stream) in lines {
            let action = ["alloc", "free_requested", "free_completed", "segment_alloc"][action];
            text += &format!("{action},{},{size},{stream}\n", addr * 4096);
        }
        check(text.as_bytes())
    });
    assert!(tally.contains_key("read and replayed"), "{tally:?}");
}

#[test]
fn the_limits_hold_against_inputs_built_to_exceed_them() {
    let mut long_line = HAND_BUILT.as_bytes().to_vec();
    long_line.resize(long_line.len() + (2 << 20), b'7');
    let many_lines = HAND_BUILT.repeat(20_000).into_bytes();
    for bytes in [
        long_line.clone(),
        gzip(&long_line),
        many_lines.clone(),
        gzip(&many_lines),
    ] {
        assert_eq!(check(&bytes), "refused");
    }
}
