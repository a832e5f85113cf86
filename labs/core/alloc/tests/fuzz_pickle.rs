//! Fuzzing the PyTorch snapshot (pickle) reader: mutations of hand-built pickles (shared
//! frames, a self-referencing list) and of the real snapshot in the shared data. Every
//! case must end, without a panic, in a snapshot or a one-line error, in memory and
//! time bounded by the input's size; a snapshot that loads must summarise and draw.
//! `LABS_FUZZ_CASES=10000 cargo test -p labs-core --test fuzz_pickle` for a longer run.

mod bounded;

use bounded::mutate::{apply, mutations};
use bounded::pickles;
use proptest::prelude::*;

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![
        pickles::shared_frames(20, 5, 30),
        pickles::self_referencing_settings(),
        pickles::snapshot(|_| {}),
    ];
    let real = labs_base::testing::data_dir().join("snapshots/mlp_adam.pickle");
    if let Ok(bytes) = std::fs::read(real) {
        seeds.push(bytes);
    }
    seeds
}

/// Loads `bytes` and uses what loaded; says how far it got.
pub fn check(bytes: &[u8]) -> &'static str {
    bounded::check_snapshot(bytes, 256)
}

#[test]
fn mutated_pickles_load_or_fail_cleanly() {
    let seeds = seeds();
    let strategy = (any::<prop::sample::Index>(), mutations(3));
    let tally = bounded::fuzz("fuzz_pickle", 150, strategy, |(seed, m)| {
        check(&apply(&seeds[seed.index(seeds.len())], &m))
    });
    assert!(tally.contains_key("loaded"), "{tally:?}");
}

#[test]
fn wide_sharing_is_bounded() {
    // Each level a list holding the next twice: 2^40 values if followed naively.
    let mut p = pickles::PROTO4.to_vec();
    p.extend([pickles::EMPTY_DICT, pickles::MARK]);
    pickles::string(&mut p, "segments");
    p.push(pickles::EMPTY_LIST);
    pickles::string(&mut p, "allocator_settings");
    p.extend([pickles::EMPTY_DICT, pickles::MARK]);
    pickles::string(&mut p, "x");
    p.push(pickles::EMPTY_LIST);
    for level in 0..40u8 {
        pickles::put(&mut p, level);
        p.extend([pickles::EMPTY_LIST, pickles::MARK]);
        pickles::get(&mut p, level);
        pickles::get(&mut p, level);
        p.push(pickles::APPENDS);
    }
    p.extend([pickles::SETITEMS, pickles::SETITEMS, pickles::STOP]);
    check(&p);
}
