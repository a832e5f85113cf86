//! Fuzzing the JSON snapshot reader: mutations of snapshots our allocator's format
//! describes (one built here, and the real PyTorch snapshot written as JSON), with
//! numbers swapped for the values that overflow sums. Every case must end, without a
//! panic, in a snapshot or a one-line error, in bounded memory and time; a snapshot
//! that loads must summarise and draw.
//! `LABS_FUZZ_CASES=10000 cargo test -p labs-core --test fuzz_snapshot_json` for a longer run.

mod bounded;

use bounded::mutate::{apply, mutations};
use labs_alloc::snapshot::{
    self, Block, BlockState, Frame, Segment, SegmentType, Snapshot, TraceAction, TraceEvent,
};
use proptest::prelude::*;

fn built() -> Snapshot {
    let frames: snapshot::Frames = vec![Frame {
        name: "train".into(),
        filename: "train.py".into(),
        line: 7,
    }]
    .into();
    let block = |address, size, state| Block {
        address,
        size,
        requested_size: size,
        state,
        frames: frames.clone(),
        category: (state == BlockState::ActiveAllocated).then(|| "activation".to_string()),
    };
    let base = 1u64 << 40;
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: base,
            total_size: 2 << 20,
            stream: 0,
            segment_type: SegmentType::Small,
            is_expandable: false,
            segment_pool_id: (0, 0),
            blocks: vec![
                block(base, 1 << 20, BlockState::ActiveAllocated),
                block(base + (1 << 20), 1 << 20, BlockState::Inactive),
            ],
        }],
        trace: [
            (TraceAction::SegmentAlloc, base, 2 << 20),
            (TraceAction::Alloc, base, 1 << 20),
            (TraceAction::Alloc, base + (1 << 20), 1 << 20),
            (TraceAction::FreeRequested, base + (1 << 20), 1 << 20),
            (TraceAction::FreeCompleted, base + (1 << 20), 1 << 20),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (action, addr, size))| TraceEvent {
            device: 0,
            action,
            addr,
            size,
            stream: 0,
            time_us: i as i64,
            frames: frames.clone(),
            category: None,
            saved_by: None,
        })
        .collect(),
        settings: Default::default(),
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![snapshot::dump(&built()).into_bytes()];
    let real = labs_base::testing::data_dir().join("snapshots/mlp_adam.pickle");
    if let Ok((snap, _)) = snapshot::load_file(real) {
        // Small enough to mutate quickly: the segments and the first events.
        let snap = Snapshot {
            trace: snap.trace.into_iter().take(200).collect(),
            ..snap
        };
        seeds.push(snapshot::dump(&snap).into_bytes());
    }
    seeds
}

/// Loads `bytes` and uses what loaded; says how far it got.
pub fn check(bytes: &[u8]) -> &'static str {
    bounded::check_snapshot(bytes, 64)
}

#[test]
fn mutated_json_snapshots_load_or_fail_cleanly() {
    let seeds = seeds();
    let strategy = (any::<prop::sample::Index>(), mutations(3));
    let tally = bounded::fuzz("fuzz_snapshot_json", 200, strategy, |(seed, m)| {
        check(&apply(&seeds[seed.index(seeds.len())], &m))
    });
    assert!(tally.contains_key("loaded"), "{tally:?}");
}
