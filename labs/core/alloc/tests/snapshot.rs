//! Snapshots: the PyTorch import against the figures PyTorch's own pickle holds, our
//! JSON round trip, the CSV export, the timelines, and broken inputs.

use std::sync::OnceLock;

use labs_alloc::snapshot::{
    self, dump, export_trace, load, load_json, load_pickle, memory_timeline, read_trace_csv,
    stacked_bands, BlockState, Snapshot, SnapshotError, SourceFormat, Summary, TraceAction,
};
use labs_base::testing::data_dir;
use proptest::prelude::*;

fn mlp_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = data_dir().join("snapshots/mlp_adam.pickle");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

fn mlp() -> Snapshot {
    load_pickle(mlp_bytes()).expect("the PyTorch 2.11 snapshot loads")
}

#[test]
fn pytorch_snapshot_gives_pytorchs_figures() {
    let (s, format) = load(mlp_bytes()).unwrap();
    assert_eq!(format, SourceFormat::PyTorchPickle);
    let sum = Summary::of(&s);
    assert_eq!(sum.segments, 16);
    // The default pool's segments, as PyTorch names it (`segment_pool_id`).
    assert!(s.segments.iter().all(|g| g.segment_pool_id == (0, 0)));
    assert_eq!(sum.reserved_bytes, 247_463_936);
    assert_eq!(sum.allocated_bytes, 190_902_784);
    assert_eq!(sum.active_blocks, 22);
    assert_eq!(sum.trace_events, 239);
    assert_eq!(sum.trace_allocs, 89);
    // PyTorch's per-segment totals agree with the block-level recount.
    assert_eq!(sum.requested_bytes, 189_930_756);
    assert_eq!(sum.inactive_blocks, 8);
    assert_eq!((sum.small_segments, sum.large_segments), (4, 12));
    assert!(!s.settings.expandable_segments);
    assert_eq!(s.settings.max_split_size, None);
    assert!(s.settings.other.contains_key("roundup_power2_divisions"));
    assert!(s.trace.iter().all(|e| !e.frames.is_empty()));
}

#[test]
fn json_round_trip_keeps_everything() {
    let s = mlp();
    let text = dump(&s);
    let (back, format) = load(text.as_bytes()).unwrap();
    assert_eq!(format, SourceFormat::Json);
    assert_eq!(back, s);
}

#[test]
fn exported_trace_reads_back_with_the_same_sums() {
    let s = mlp();
    let dir = std::env::temp_dir().join(format!("labs-snapshot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.csv.gz");
    let n = export_trace(&s, 0, &path).unwrap();
    assert_eq!(n, 239);
    let events = read_trace_csv(std::fs::File::open(&path).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(events.len(), s.trace.len());
    let sum = |a: TraceAction, csv: bool| -> u64 {
        if csv {
            events
                .iter()
                .filter(|e| e.action == a)
                .map(|e| e.size)
                .sum()
        } else {
            s.trace
                .iter()
                .filter(|e| e.action == a)
                .map(|e| e.size)
                .sum()
        }
    };
    for a in [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
    ] {
        assert_eq!(sum(a.clone(), true), sum(a, false));
    }
    assert_eq!(sum(TraceAction::Alloc, true), 462_683_812);
}

#[test]
fn timeline_ends_at_the_snapshot_state() {
    let s = mlp();
    let t = memory_timeline(&s, 0);
    assert_eq!(t.len(), 240);
    assert_eq!((t[0].allocated, t[0].reserved), (0, 0));
    let last = t.last().unwrap();
    assert_eq!(last.reserved, 247_463_936);
    assert_eq!(last.allocated, 189_930_756);
    assert!(t.iter().all(|p| p.allocated <= p.reserved));
    let peak = t.iter().map(|p| p.allocated).max().unwrap();
    // The live sum of allocs only peaks once frees lag allocations, never above.
    assert!(peak >= Summary::of(&s).trace_peak_requested_bytes);

    let bands = stacked_bands(&s, 0, 10);
    assert_eq!(bands.bands.len(), 10);
    let values: Vec<Vec<u64>> = (0..10).map(|i| bands.values(i)).collect();
    assert_eq!(bands.points, t.len());
    for (k, point) in t.iter().enumerate() {
        let top: u64 = values.iter().map(|v| v[k]).sum();
        assert_eq!(top + bands.others[k], point.allocated);
    }
}

#[test]
fn snapshot_from_a_ring_buffer_keeps_earlier_allocations() {
    // Dropping the first half of the trace, as a full ring buffer does, must still end
    // at the snapshot's state and never go negative.
    let mut s = mlp();
    s.trace.drain(..120);
    let t = memory_timeline(&s, 0);
    let last = t.last().unwrap();
    assert_eq!(last.reserved, 247_463_936);
    assert_eq!(last.allocated, 189_930_756);
    assert!(t[0].reserved > 0 && t[0].allocated > 0);
}

#[test]
fn multi_device_choice_is_explicit() {
    let mut s = mlp();
    assert_eq!(s.pick_device(None).unwrap(), 0);
    s.trace[0].device = 1;
    assert!(matches!(s.pick_device(None), Err(SnapshotError::Device(_))));
    assert_eq!(s.pick_device(Some(1)).unwrap(), 1);
    assert!(s.pick_device(Some(7)).is_err());
}

// --- broken inputs ----------------------------------------------------------

#[test]
fn truncated_pickles_are_errors() {
    let bytes = mlp_bytes();
    for len in [0, 1, 2, 11, 100, 5000, bytes.len() / 2, bytes.len() - 1] {
        match load(&bytes[..len]) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(_) => panic!("a pickle cut at {len} bytes loaded"),
        }
    }
    let err = load_pickle(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(matches!(err, SnapshotError::Pickle(_)), "{err}");
}

#[test]
fn garbage_is_an_error_that_says_what_the_file_is() {
    let err = load(b"PK\x03\x04 a zip file").unwrap_err();
    assert!(matches!(err, SnapshotError::UnknownFormat(_)));
    assert!(err.to_string().contains("PK"), "{err}");
    let err = load(b"").unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
    let err = load(b"\x80\x04garbage").unwrap_err();
    assert!(matches!(err, SnapshotError::Pickle(_)), "{err}");
}

#[test]
fn foreign_or_damaged_json_is_an_error() {
    let err = load_json(br#"{"segments": []}"#).unwrap_err();
    assert!(err.to_string().contains("labs-memory-snapshot"), "{err}");
    let err = load_json(br#"{"format": "labs-memory-snapshot", "version": 99, "segments": []}"#)
        .unwrap_err();
    assert!(err.to_string().contains("version"), "{err}");
    let err =
        load(br#"{"format": "labs-memory-snapshot", "version": 1, "segments": [{"#).unwrap_err();
    assert!(matches!(err, SnapshotError::Json(_)), "{err}");
    let ok = load_json(br#"{"format": "labs-memory-snapshot", "version": 1, "segments": []}"#);
    assert_eq!(ok.unwrap(), Snapshot::default());
}

/// Just enough of a pickle writer to build snapshots of any shape.
enum Value {
    I64(i64),
    String(String),
    List(Vec<Value>),
    Dict(Vec<(String, Value)>),
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn encode(v: &Value, out: &mut Vec<u8>) {
    let string = |s: &str, out: &mut Vec<u8>| {
        out.push(b'X');
        out.extend((s.len() as u32).to_le_bytes());
        out.extend(s.as_bytes());
    };
    match v {
        Value::I64(i) => {
            out.extend([0x8a, 8]);
            out.extend(i.to_le_bytes());
        }
        Value::String(s) => string(s, out),
        Value::List(items) => {
            out.extend(b"](");
            items.iter().for_each(|x| encode(x, out));
            out.push(b'e');
        }
        Value::Dict(items) => {
            out.extend(b"}(");
            for (k, x) in items {
                string(k, out);
                encode(x, out);
            }
            out.push(b'u');
        }
    }
}

fn pickle(v: &Value) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    encode(v, &mut out);
    out.push(b'.');
    out
}

fn block(state: &str) -> Value {
    dict(vec![
        ("address", Value::I64(4096)),
        ("size", Value::I64(512)),
        ("state", Value::String(state.into())),
    ])
}

fn segment(blocks: Vec<Value>) -> Value {
    dict(vec![
        ("address", Value::I64(4096)),
        ("total_size", Value::I64(2 << 20)),
        ("blocks", Value::List(blocks)),
    ])
}

#[test]
fn minimal_snapshots_from_other_versions_load() {
    // Only the keys without which a snapshot means nothing.
    let v = dict(vec![(
        "segments",
        Value::List(vec![segment(vec![block("active_allocated")])]),
    )]);
    let snap = load_pickle(&pickle(&v)).unwrap();
    let sum = Summary::of(&snap);
    assert_eq!(
        (sum.segments, sum.allocated_bytes, sum.requested_bytes),
        (1, 512, 512)
    );
    assert_eq!(snap.segments[0].segment_type, snapshot::SegmentType::Small);
    // The bare list `memory_snapshot()` returned before dicts.
    let v = Value::List(vec![segment(vec![block("inactive")])]);
    let snap = load_pickle(&pickle(&v)).unwrap();
    assert_eq!(snap.segments[0].blocks[0].state, BlockState::Inactive);
}

#[test]
fn wrong_shapes_name_the_place() {
    let cases: Vec<(Value, &str)> = vec![
        (Value::I64(5), "<top>"),
        (
            dict(vec![("device_traces", Value::List(vec![]))]),
            "segments",
        ),
        (dict(vec![("segments", Value::I64(5))]), "segments"),
        (
            dict(vec![(
                "segments",
                Value::List(vec![segment(vec![block("bogus")])]),
            )]),
            "segments[0].blocks[0].state",
        ),
        (
            dict(vec![(
                "segments",
                Value::List(vec![dict(vec![("address", Value::I64(0))])]),
            )]),
            "total_size",
        ),
        (
            dict(vec![(
                "segments",
                Value::List(vec![segment(vec![dict(vec![
                    ("address", Value::I64(0)),
                    ("size", Value::String("big".into())),
                    ("state", Value::String("inactive".into())),
                ])])]),
            )]),
            "segments[0].blocks[0].size",
        ),
        (
            dict(vec![
                ("segments", Value::List(vec![])),
                (
                    "device_traces",
                    Value::List(vec![Value::List(vec![dict(vec![("addr", Value::I64(1))])])]),
                ),
            ]),
            "device_traces[0][0]",
        ),
        (
            dict(vec![(
                "segments",
                Value::List(vec![dict(vec![
                    ("address", Value::I64(-1)),
                    ("total_size", Value::I64(1)),
                ])]),
            )]),
            "address",
        ),
    ];
    for (v, place) in cases {
        let err = load(&pickle(&v)).unwrap_err();
        assert!(matches!(err, SnapshotError::Shape { .. }), "{err}");
        assert!(err.to_string().contains(place), "{err} should name {place}");
    }
}

#[test]
fn trace_csv_errors_name_the_line() {
    use flate2::write::GzEncoder;
    use std::io::Write;
    let gz = |text: &str| {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let err = read_trace_csv(&gz("a,b\n")[..]).unwrap_err();
    assert!(err.to_string().contains("header"), "{err}");
    let err = read_trace_csv(&gz("action,addr,size,stream\nalloc,1,x,0\n")[..]).unwrap_err();
    assert!(err.to_string().contains("line 2"), "{err}");
    assert!(read_trace_csv(&b"not gzip"[..]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = load(&bytes);
        let mut pickled = vec![0x80, 4];
        pickled.extend_from_slice(&bytes);
        let _ = load(&pickled);
    }

    #[test]
    fn opcode_soup_never_panics(ops in proptest::collection::vec(proptest::sample::select(vec![
        b'}', b']', b')', b'(', b'u', b'e', b'a', b's', 0x94, b'h', 0, 1, 2, b'K', b'N', 0x88,
        0x85, 0x86, 0x87, b't', b'l', b'd', b'0', b'1', b'2', 0x8c, b'x', 0x8a, 0xff, b'.',
    ]), 0..200)) {
        let mut bytes = vec![0x80, 4];
        bytes.extend_from_slice(&ops);
        let _ = load(&bytes);
    }

    #[test]
    fn any_truncation_is_an_error(cut in 0usize..99_215) {
        let bytes = mlp_bytes();
        let cut = cut.min(bytes.len() - 1);
        prop_assert!(load(&bytes[..cut]).is_err());
    }

    #[test]
    fn corrupted_bytes_never_panic(at in 0usize..99_215, byte in any::<u8>()) {
        let mut bytes = mlp_bytes().to_vec();
        let at = at.min(bytes.len() - 1);
        bytes[at] = byte;
        let _ = load(&bytes);
    }
}
