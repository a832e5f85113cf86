//! The pictures of a snapshot (`plot`): a long trace is thinned to a file of bounded
//! size, and an empty snapshot still gives every picture.

use std::path::PathBuf;

use labs_core::plot;
use labs_core::snapshot::{Segment, SegmentType, Snapshot, TraceAction, TraceEvent};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("labs-core-plot-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn synthetic(events: usize) -> Snapshot {
    let mut trace = Vec::new();
    for i in 0..events as u64 {
        let (action, addr) = if i % 2 == 0 {
            (TraceAction::Alloc, i)
        } else {
            (TraceAction::FreeCompleted, i - 1)
        };
        trace.push(TraceEvent {
            device: 0,
            action,
            addr,
            size: (i % 7 + 1) << 20,
            stream: 0,
            time_us: i as i64,
            frames: Default::default(),
            category: None,
            saved_by: None,
        });
    }
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: 0,
            total_size: 64 << 20,
            stream: 0,
            segment_type: SegmentType::Large,
            is_expandable: false,
            blocks: Vec::new(),
        }],
        trace,
        settings: Default::default(),
    }
}

#[test]
fn long_traces_are_thinned_and_empty_snapshots_still_draw() {
    let dir = scratch("thin");
    let files = plot::write_all(&synthetic(50_000), 0, &dir).unwrap();
    for f in &files {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size < 2 << 20, "{} is {size} bytes", f.display());
    }
    let files = plot::write_all(&Snapshot::default(), 0, &dir.join("empty")).unwrap();
    assert_eq!(files.len(), 3);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_picture_is_an_svg_with_its_title() {
    let dir = scratch("titles");
    let files = plot::write_all(&synthetic(1000), 0, &dir).unwrap();
    let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap()).collect();
    let expected: Vec<_> = plot::PICTURES
        .iter()
        .map(|(n, _)| std::ffi::OsStr::new(n))
        .collect();
    assert_eq!(names, expected);
    for (file, (name, title)) in files.iter().zip(plot::PICTURES) {
        let svg = std::fs::read_to_string(file).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{name}"
        );
        assert!(svg.contains(title), "{name} lacks its title");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
