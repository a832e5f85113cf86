//! The viewer makes lab-03 view's page from a dropped file's bytes, and a bad file is
//! one line. (The book's browser test drops a file on the page itself and compares the
//! page it makes with the one `lab-03 view` wrote for the book.)

use labs_browser::viewer::{page, page_json};

fn mlp_adam() -> Vec<u8> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/snapshots/mlp_adam.pickle"
    );
    std::fs::read(path).unwrap()
}

#[test]
fn a_dropped_snapshot_becomes_lab_03_views_page() {
    let bytes = mlp_adam();
    let html = page(&bytes, "mlp_adam.pickle").unwrap();
    let (snap, _) = labs_core::snapshot::load(&bytes).unwrap();
    let (want, digest) = lab_03::view::page_of(&snap, "mlp_adam.pickle", None).unwrap();
    assert_eq!(html, want);
    assert!(digest.points > 200, "{}", digest.points);
    assert!(html.contains("<title>mlp_adam.pickle: active memory</title>"));
}

#[test]
fn bad_files_are_one_line_errors() {
    let bytes = mlp_adam();
    for (file, says) in [
        (&bytes[..bytes.len() / 2], "reading half.pickle"),
        (&b"PK\x03\x04 a zip file"[..], "reading half.pickle"),
        (&b""[..], "empty"),
    ] {
        let out: serde_json::Value = serde_json::from_str(&page_json(file, "half.pickle")).unwrap();
        let e = out["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error: {out}"));
        assert!(!e.contains('\n') && e.contains(says), "{e}");
        assert!(out.get("page").is_none());
    }
}

#[test]
fn a_file_too_large_for_the_page_names_the_command_line() {
    let big = vec![0u8; labs_browser::viewer::MAX_DROPPED_BYTES + 1];
    let e = page(&big, "big.pickle").unwrap_err().to_string();
    assert!(e.contains("lab-03 view big.pickle"), "{e}");
}
