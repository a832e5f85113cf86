//! `lab-03 view`: the page for PyTorch's snapshot opens without a network, embeds a
//! digest whose peak is the summary's and whose live allocations at that peak add up
//! to it, and bad input is a one-line error that writes no page.

use std::path::Path;
use std::process::Command;

mod common;
use common::{lab, mlp_path, scratch, stderr};

/// The text between the opening tag `open` and the next `</script>`.
fn between<'a>(html: &'a str, open: &str) -> &'a str {
    let start = html.find(open).unwrap_or_else(|| panic!("no {open}")) + open.len();
    let len = html[start..]
        .find("</script>")
        .expect("the script is closed");
    &html[start..start + len]
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn the_page_of_pytorchs_snapshot_is_offline_and_its_peak_is_the_summarys() {
    let dir = scratch("page");
    let page = dir.join("mlp.html");
    let out = lab(&["view", p(&mlp_path()), "-o", p(&page)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.len() < 3 << 20, "{} bytes", html.len());

    // (a) Nothing fetched from anywhere.
    for scheme in ["http://", "https://"] {
        assert!(!html.contains(scheme), "the page refers to {scheme}");
    }

    // (b) The embedded data parses.
    let data: serde_json::Value = serde_json::from_str(between(
        &html,
        r#"<script type="application/json" id="data">"#,
    ))
    .expect("the embedded data is JSON");
    assert_eq!(data["format"], "lab-03-view");
    assert_eq!(
        data["bands"],
        serde_json::json!(["allocated"]),
        "no categories"
    );

    // (c) The digest's peak is the summary's, and the allocations live at the peak
    // event sum to it.
    let summary = labs_core::testing::one_json_object(lab(&["summary", p(&mlp_path()), "--json"]));
    let peak = summary["trace_peak_requested_bytes"].as_u64().unwrap();
    assert!(peak > 0);
    assert_eq!(data["peak"]["allocated"].as_u64(), Some(peak));
    let at = data["peak"]["event"].as_u64().unwrap();
    let allocs = &data["allocations"];
    let column = |name: &str| allocs[name].as_array().unwrap().clone();
    let (size, start, end) = (column("size"), column("start"), column("end"));
    assert_eq!(size.len(), start.len());
    assert_eq!(size.len(), end.len());
    let live: u64 = (0..size.len())
        .filter(|&i| start[i].as_u64().unwrap() <= at && end[i].as_u64().is_none_or(|e| e > at))
        .map(|i| size[i].as_u64().unwrap())
        .sum();
    assert_eq!(live, peak, "the live allocations at event {at}");
    // The timeline's own point at the peak says the same, and no point is higher.
    let points = data["levels"][0]["points"].as_array().unwrap();
    assert_eq!(points.len() as u64, data["points"].as_u64().unwrap());
    let total = |p: &serde_json::Value| -> u64 {
        p.as_array().unwrap()[3..]
            .iter()
            .map(|b| b.as_u64().unwrap())
            .sum()
    };
    assert_eq!(total(&points[at as usize]), peak);
    assert_eq!(points.iter().map(total).max(), Some(peak));

    // The code has no syntax errors, where node is there to say so.
    let script = between(&html, "<script>\n");
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let js = dir.join("page.js");
            std::fs::write(&js, script).unwrap();
            let check = Command::new("node")
                .arg("--check")
                .arg(&js)
                .output()
                .unwrap();
            assert!(check.status.success(), "node --check: {}", stderr(&check));
        }
        _ => eprintln!("node is not installed: the page's script is not syntax-checked"),
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn our_json_dump_gives_the_same_digest_as_the_pickle() {
    let dir = scratch("json");
    let (snap, _) = labs_core::snapshot::load_file(mlp_path()).unwrap();
    let json = dir.join("mlp.json");
    labs_core::snapshot::dump_to_file(&snap, &json).unwrap();
    let data = |input: &Path, page: &Path| -> serde_json::Value {
        let out = lab(&["view", p(input), "-o", p(page)]);
        assert!(out.status.success(), "{}", stderr(&out));
        let html = std::fs::read_to_string(page).unwrap();
        serde_json::from_str(between(
            &html,
            r#"<script type="application/json" id="data">"#,
        ))
        .unwrap()
    };
    let (a, b) = (
        data(&mlp_path(), &dir.join("a.html")),
        data(&json, &dir.join("b.html")),
    );
    for key in [
        "peak",
        "levels",
        "allocations",
        "frames",
        "markers",
        "bands",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_input_is_a_one_line_error_and_no_page() {
    let dir = scratch("errors");
    let truncated = dir.join("truncated.pickle");
    let bytes = std::fs::read(mlp_path()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let garbage = dir.join("garbage.bin");
    std::fs::write(&garbage, b"\x00\x01not a snapshot").unwrap();
    let page = dir.join("page.html");
    let nowhere = dir.join("no-such-folder").join("page.html");
    let mlp = mlp_path();

    let cases = [
        (
            vec!["view", p(&truncated), "-o", p(&page)],
            "not a readable pickle",
        ),
        (
            vec!["view", p(&garbage), "-o", p(&page)],
            "not a memory snapshot",
        ),
        (vec!["view", p(&mlp), "-o", p(&nowhere)], "does not exist"),
        (vec!["view", p(&mlp), "-o", p(&dir)], "is a folder"),
        (
            vec!["view", p(&mlp), "-o", p(&page), "--gpu", "3"],
            "device 3",
        ),
    ];
    for (args, expect) in cases {
        let out = lab(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!page.exists(), "{args:?} wrote a page");
        assert!(!nowhere.exists());
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_page_knows_each_allocations_stack_and_the_segments_at_every_moment() {
    let dir = scratch("segments");
    let page = dir.join("mlp.html");
    let out = lab(&["view", p(&mlp_path()), "-o", p(&page)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    let data: serde_json::Value = serde_json::from_str(between(
        &html,
        r#"<script type="application/json" id="data">"#,
    ))
    .unwrap();
    let (snap, _) = labs_core::snapshot::load_file(mlp_path()).unwrap();

    // Every allocation made in the trace has its alloc event's stream and whole stack.
    let allocs = &data["allocations"];
    let n = allocs["size"].as_array().unwrap().len();
    let stacks = data["stacks"].as_array().unwrap();
    let texts = data["stack_frames"].as_array().unwrap();
    let trace: Vec<_> = snap.trace.iter().filter(|e| e.device == 0).collect();
    let mut with_stack = 0;
    for i in 0..n {
        let start = allocs["start"][i].as_u64().unwrap() as usize;
        if start == 0 {
            continue;
        }
        let event = trace[start - 1];
        assert_eq!(allocs["stream"][i].as_u64(), Some(event.stream));
        let stack = &stacks[allocs["stack"][i].as_u64().unwrap() as usize];
        let frames = stack.as_array().unwrap();
        assert_eq!(frames.len(), event.frames.len().min(64));
        let first = texts[frames[0].as_u64().unwrap() as usize]
            .as_str()
            .unwrap();
        assert!(first.starts_with(&event.frames[0].name), "{first}");
        with_stack += 1;
    }
    assert!(with_stack > 50, "{with_stack}");

    // At the last point, the segments live are the snapshot's own segments.
    let segs = &data["segments"];
    let last = data["points"].as_u64().unwrap() - 1;
    let mut live: Vec<(u64, u64)> = (0..segs["addr"].as_array().unwrap().len())
        .filter(|&g| {
            segs["start"][g].as_u64().unwrap() <= last
                && segs["end"][g].as_u64().is_none_or(|e| e > last)
        })
        .map(|g| {
            (
                segs["addr"][g].as_u64().unwrap(),
                segs["size"][g].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want: Vec<(u64, u64)> = snap
        .segments
        .iter()
        .map(|g| (g.address, g.total_size))
        .collect();
    live.sort();
    want.sort();
    assert!(!want.is_empty());
    assert_eq!(live, want);
    std::fs::remove_dir_all(dir).unwrap();
}
