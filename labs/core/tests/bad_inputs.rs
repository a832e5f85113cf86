//! Regression tests for the inputs a hostile or careless user can give the readers and
//! parsers (issue "every bad input a clean error"): each failed before the fix (a
//! panic, an abort, a wrong answer or an unclear message) and must now be a clean,
//! bounded, one-line error or a correct result.

#[path = "../alloc/tests/bounded/mod.rs"]
mod bounded;

use std::time::Duration;

use bounded::{assert_one_line, bounded, gzip, pickles, temp_file};
use labs_core::alloc::{replay, Allocator, Config};
use labs_core::format::parse_bytes;
use labs_core::snapshot::{self, BlockState, Segment, SegmentType, Snapshot};

const MIB: usize = 1 << 20;
const GPU: u64 = 80 << 30;
const SECOND: Duration = Duration::from_secs(1);

fn trace_file(name: &str, body: &str) -> std::path::PathBuf {
    temp_file(name, format!("action,addr,size,stream\n{body}").as_bytes())
}

#[test]
fn an_alloc_too_large_to_represent_is_an_oom_not_a_panic_or_a_wrap() {
    for size in [u64::MAX, u64::MAX - 511, 1 << 63, 1 << 48] {
        for conf in [Config::default(), Config::pytorch_native()] {
            let path = trace_file("huge.trace.csv", &format!("alloc,4096,{size},0\n"));
            let trace = replay::read_trace(&path).unwrap();
            let what = format!("alloc of {size} with {}", conf.to_conf_string());
            let result = bounded(&what, 16 * MIB, SECOND, || {
                labs_core::device::replay_on_sim(&trace, conf.clone(), GPU)
            });
            let err = result.expect_err(&what).to_string();
            assert!(err.contains("out of memory"), "{what}: {err}");
            assert_one_line(&err);
        }
    }
}

#[test]
fn more_streams_than_the_pool_key_holds_is_an_error_not_aliasing() {
    let allocator = Allocator::new(labs_core::device::sim_backend(GPU), Config::default()).unwrap();
    let mut first_error = None;
    for stream in 1..=40_000u64 {
        match allocator.malloc_on(512, stream) {
            Ok(block) => allocator.free(block).unwrap(),
            Err(e) => {
                first_error = Some((stream, e.to_string()));
                break;
            }
        }
    }
    let (stream, err) = first_error.expect("40,000 streams were all accepted");
    assert_eq!(stream, 32_769, "{err}");
    assert!(err.contains("streams"), "{err}");
}

#[test]
fn lines_of_every_action_are_validated() {
    for line in [
        "free_completed,zz,yy,xx",
        "segment_alloc,1,-2,0",
        "oom,0,x,0",
        "snapshot,1,2",
        "frobnicate,1,2,0",
    ] {
        let path = trace_file("skipped.trace.csv", &format!("alloc,16,512,0\n{line}\n"));
        let err = replay::read_trace(&path).expect_err(line).to_string();
        assert!(err.contains("line 3"), "{line}: {err}");
        assert_one_line(&err);
    }
}

#[test]
fn an_empty_trace_file_is_an_error_not_an_empty_trace() {
    for (name, bytes) in [("empty.csv", Vec::new()), ("empty.csv.gz", gzip(b""))] {
        let path = temp_file(name, &bytes);
        let err = replay::read_trace(&path).expect_err(name).to_string();
        assert!(err.contains("header"), "{name}: {err}");
    }
    // A device is not a file, however empty it reads.
    let err = replay::read_trace(std::path::Path::new("/dev/null"))
        .expect_err("/dev/null")
        .to_string();
    assert!(err.contains("/dev/null: is a character device"), "{err}");
}

#[test]
fn a_gzip_bomb_line_is_refused_without_inflating_it() {
    let mut text = b"action,addr,size,stream\nalloc,1,".to_vec();
    text.resize(text.len() + 64 * MIB, b'9');
    let path = temp_file("bomb.trace.csv.gz", &gzip(&text));
    drop(text);
    let err = bounded("a 64 MiB line", 4 * MIB, 5 * SECOND, || {
        replay::read_trace(&path)
    })
    .expect_err("a 64 MiB line")
    .to_string();
    assert!(
        err.contains("line 2") && err.contains("longer than"),
        "{err}"
    );
    assert_one_line(&err);
}

#[test]
fn csv_errors_name_the_file_once() {
    let path = trace_file("named-once.trace.csv", "alloc,1,x,0\n");
    let err = replay::read_trace(&path).unwrap_err().to_string();
    assert_eq!(err.matches("named-once.trace.csv").count(), 1, "{err}");
}

#[test]
fn a_self_referencing_pickle_is_bounded() {
    let bytes = pickles::self_referencing_settings();
    assert!(bytes.len() < 80);
    let result = bounded("a self-referencing list", 64 * MIB, 5 * SECOND, || {
        snapshot::load(&bytes)
    });
    if let Err(e) = result {
        assert_one_line(&e.to_string());
    }
}

#[test]
fn shared_frames_are_shared_not_copied_per_reference() {
    // 10,000 events sharing one list of 1,000 references to one frame with a 1 KB name:
    // 500 KB of pickle, 10 GB if every reference became a copy.
    let bytes = pickles::shared_frames(10_000, 1_000, 1_000);
    assert!(bytes.len() < 600_000, "{}", bytes.len());
    let snap = bounded("shared frames", 64 * MIB, 10 * SECOND, || {
        snapshot::load(&bytes)
    })
    .unwrap()
    .0;
    assert_eq!(snap.trace.len(), 10_000);
    assert_eq!(snap.trace[9_999].frames.len(), 1_000);
    assert_eq!(snap.trace[9_999].frames[999].name.len(), 1_000);
    assert!(std::ptr::eq(
        snap.trace[0].frames.as_ptr(),
        snap.trace[9_999].frames.as_ptr()
    ));
}

#[test]
fn pickle_errors_name_the_file_and_old_protocols_are_named() {
    let path = temp_file("broken.pickle", b"\x80\x04}\x94");
    let err = snapshot::load_file(&path).unwrap_err().to_string();
    assert_eq!(err.matches("broken.pickle").count(), 1, "{err}");
    // pickle.dumps({}, protocol=0)
    let err = snapshot::load(b"(dp0\n.").unwrap_err().to_string();
    assert!(err.contains("protocol 2"), "{err}");
}

fn segment(total_size: u64, blocks: &[u64]) -> Segment {
    let mut address = 1 << 40;
    let blocks = blocks
        .iter()
        .map(|&size| {
            let b = snapshot::Block {
                address,
                size,
                requested_size: size,
                state: BlockState::ActiveAllocated,
                frames: Default::default(),
                category: None,
            };
            address = address.wrapping_add(size);
            b
        })
        .collect();
    Segment {
        device: 0,
        address: 1 << 40,
        total_size,
        stream: 0,
        segment_type: SegmentType::Large,
        is_expandable: false,
        segment_pool_id: (0, 0),
        blocks,
    }
}

#[test]
fn snapshot_sizes_that_wrap_or_overflow_their_segment_are_refused() {
    let cases = [
        (
            "two 2^63-byte segments",
            vec![segment(1 << 63, &[]), segment(1 << 63, &[])],
        ),
        (
            "a block larger than its segment",
            vec![segment(2 << 20, &[4 << 20])],
        ),
        (
            "blocks summing past their segment",
            vec![segment(2 << 20, &[2 << 20, 512])],
        ),
        (
            "blocks whose sum wraps",
            vec![segment(4 << 20, &[1 << 63, 1 << 63, 512])],
        ),
    ];
    for (what, segments) in cases {
        let snap = Snapshot {
            segments,
            ..Snapshot::default()
        };
        let err = snapshot::load(snapshot::dump(&snap).as_bytes())
            .map(|_| ())
            .expect_err(what)
            .to_string();
        assert!(err.contains("segments["), "{what}: {err}");
        assert_one_line(&err);
    }
}

#[test]
fn max_split_size_mb_cannot_overflow_past_its_minimum() {
    let err = Config::parse("max_split_size_mb:17592186044417")
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_split_size_mb"), "{err}");
}

#[test]
fn a_valid_list_of_many_division_intervals_is_accepted() {
    let entries: Vec<String> = (0..40).map(|i| format!("{}:2", 1u64 << i)).collect();
    let text = format!("roundup_power2_divisions:[{}]", entries.join(","));
    let c = Config::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.roundup_power2_divisions.for_size(1 << 45), 2);
}

#[test]
fn sizes_are_exact_whole_numbers_of_bytes() {
    assert_eq!(parse_bytes("1e9"), Ok(1_000_000_000));
    assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
    assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
    for (text, needle) in [
        ("0.5", "whole number of bytes"),
        ("18446744073709551616", "too large"),
        ("1e30", "too large"),
        ("1e30GiB", "too large"),
        ("16EiB", "too large"),
    ] {
        let err = parse_bytes(text).expect_err(text);
        assert!(err.contains(needle), "{text}: {err}");
    }
}

#[test]
fn errors_quote_at_most_a_line_of_the_input() {
    let digits = "7".repeat(1_000_000);
    let err = parse_bytes(&format!("{digits}x")).unwrap_err();
    assert_one_line(&err);
    let err = Config::parse(&format!("max_split_size_mb:{digits}"))
        .unwrap_err()
        .to_string();
    assert_one_line(&err);
    let path = trace_file(
        "long-field.trace.csv",
        &format!("alloc,{},1,0\n", &digits[..1000]),
    );
    let err = replay::read_trace(&path).unwrap_err().to_string();
    assert_one_line(&err);
}

#[test]
fn json_snapshot_errors_quote_a_line_not_the_whole_value() {
    // Found by the fuzz suite: a long `format` string, or a long string where a number
    // belongs (serde_json's own message quotes it whole), came back in the error.
    let long = "x".repeat(100_000);
    for doc in [
        format!(r#"{{"format":"{long}","version":1}}"#),
        format!(r#"{{"format":"labs-memory-snapshot","version":"{long}"}}"#),
    ] {
        let e = snapshot::load_json(doc.as_bytes()).unwrap_err().to_string();
        assert_one_line(&e);
        assert!(e.len() < 400, "{} bytes: {}", e.len(), &e[..200]);
    }
}
