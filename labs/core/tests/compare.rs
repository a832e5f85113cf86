//! Two snapshots side by side (`compare`): PyTorch's pickle and our JSON dump of it
//! read as the same trace, with the totals PyTorch's allocator recorded.

use labs_core::compare::{self, Side};
use labs_core::snapshot;
use labs_core::testing::data_dir;

#[test]
fn pytorchs_pickle_and_our_json_of_it_compare_as_the_same() {
    let (pickle, _) = snapshot::load_file(data_dir().join("snapshots/mlp_adam.pickle")).unwrap();
    let json = std::env::temp_dir().join(format!("labs-core-compare-{}.json", std::process::id()));
    snapshot::dump_to_file(&pickle, &json).unwrap();
    let (ours, _) = snapshot::load_file(&json).unwrap();
    std::fs::remove_file(&json).unwrap();
    let side = |name: &str, s| Side {
        name: name.into(),
        snapshot: s,
        device: 0,
    };
    let c = compare::compare(&side("pickle", &pickle), &side("json", &ours), 2);
    assert!(c.same_sequence);
    assert_eq!((c.first_step_a, c.first_step_b), (None, None));
    assert!(c.segment_divergence.is_none());
    for t in [&c.totals_a, &c.totals_b] {
        // The 16 segments of 236 MiB are all allocated within the trace.
        assert_eq!(t.peak_reserved, 247_463_936);
        assert_eq!(t.reserved_at_start, 0);
        assert_eq!(t.final_segments, 16);
        assert_eq!(t.allocs, 89);
    }
    assert_eq!(c.same_steps, c.totals_a.allocs + c.totals_a.frees);
    assert!(c
        .at_peak
        .iter()
        .all(|g| g.difference == 0 && g.count_a == g.count_b));
    assert!(c.at_peak.iter().map(|g| g.count_a).sum::<usize>() > 0);
    let v = compare::tables::json(&c);
    assert_eq!(v["a"], "pickle");
    assert_eq!(v["totals_b"]["allocs"], 89);
    assert!(!compare::tables::tables(&c, 10).is_empty());
}
