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
            segment_pool_id: (0, 0),
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

/// The size each text of `svg` is drawn at in the book, whose column is 750 px wide: its
/// font-size, scaled down when the picture is wider than the column. With the text.
fn drawn_text_sizes(svg: &str) -> Vec<(f64, String)> {
    let attr = |tag: &str, name: &str| -> Option<f64> {
        let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[at..].split('"').next()?.parse().ok()
    };
    let root = &svg[..svg.find('>').unwrap()];
    let width = attr(root, "width").expect("the picture's width");
    let scale = (750.0 / width).min(1.0);
    svg.match_indices("<text")
        .map(|(at, _)| {
            let tag = &svg[at..at + svg[at..].find('>').unwrap()];
            let size = attr(tag, "font-size").expect("every text has a font-size");
            let body = svg[at + tag.len() + 1..].split('<').next().unwrap().trim();
            (size * scale, body.to_string())
        })
        .collect()
}

#[test]
fn every_text_reads_at_12_px_or_more_in_the_book() {
    use labs_core::alloc::{Category, CategorySample};
    let dir = scratch("legible");
    let mut svgs: Vec<(String, String)> = plot::write_all(&synthetic(1000), 0, &dir)
        .unwrap()
        .iter()
        .map(|f| (f.display().to_string(), std::fs::read_to_string(f).unwrap()))
        .collect();
    let samples: Vec<CategorySample> = (0..50u64)
        .map(|i| {
            let mut bytes = [0; Category::COUNT];
            bytes[Category::Parameter.index()] = 8 << 20;
            bytes[Category::Activation.index()] = (i % 10) << 20;
            CategorySample {
                time_us: i,
                bytes,
                reserved: 32 << 20,
            }
        })
        .collect();
    let long_title = "One training step: transformer d_model 256 batch 64x100, fused attention \
                      (cuda:0, NVIDIA H100 80GB HBM3)";
    svgs.push((
        "categories".into(),
        plot::category_area_svg(&samples, long_title).unwrap(),
    ));
    for (name, svg) in &svgs {
        let sizes = drawn_text_sizes(svg);
        assert!(sizes.len() > 5, "{name}: {} texts", sizes.len());
        for (px, text) in sizes {
            assert!(px >= 12.0, "{name}: \"{text}\" is drawn at {px:.1} px");
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn pictures_drawn_to_one_axis_share_their_scale() {
    use labs_core::alloc::{Category, CategorySample};
    let run = |peak_mib: u64| -> Vec<CategorySample> {
        (0..20u64)
            .map(|i| {
                let mut bytes = [0; Category::COUNT];
                bytes[Category::Activation.index()] = (i * peak_mib / 19) << 20;
                CategorySample {
                    time_us: i,
                    bytes,
                    reserved: peak_mib << 20,
                }
            })
            .collect()
    };
    let (small, large) = (run(40), run(400));
    assert_eq!(plot::category_peak(&small), 40 << 20);
    assert_eq!(plot::category_peak(&large), 400 << 20);
    // The memory axis's labels: each picture alone goes up to its own peak; drawn to
    // the larger peak, the small run's axis is the large run's.
    let labels = |svg: &str| -> Vec<String> {
        let texts: Vec<String> = drawn_text_sizes(svg).into_iter().map(|(_, t)| t).collect();
        texts
            .into_iter()
            .filter(|t| t.parse::<f64>().is_ok())
            .collect()
    };
    let axis = plot::category_peak(&large);
    let alone = labels(&plot::category_area_svg(&small, "small").unwrap());
    let shared = labels(&plot::category_area_svg_to(&small, "small", axis).unwrap());
    let reference = labels(&plot::category_area_svg_to(&large, "large", axis).unwrap());
    assert_ne!(alone, reference, "the small run alone keeps its own scale");
    assert_eq!(
        shared, reference,
        "drawn to one axis, the two share their scale"
    );
}
