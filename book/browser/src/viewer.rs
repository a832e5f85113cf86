//! The book's snapshot viewer: a PyTorch snapshot pickle or a labs JSON snapshot that a
//! reader drops on the page becomes the page `lab-03 view FILE -o PAGE` writes, byte for
//! byte, made in the browser by the same reader and digest.

use anyhow::{Context, Result};
use labs_core::snapshot;

/// The largest file the page reads: WebAssembly's memory holds 4 GiB, and a snapshot
/// takes several times its file's size once read.
pub const MAX_DROPPED_BYTES: usize = 512 << 20;

/// `lab-03 view`'s page for the snapshot `bytes`, from a file named `name`.
pub fn page(bytes: &[u8], name: &str) -> Result<String> {
    if bytes.len() > MAX_DROPPED_BYTES {
        anyhow::bail!(
            "{name} is {}; the page reads snapshots up to {}: run `lab-03 view {name} -o page.html` instead",
            labs_core::format::bytes(bytes.len() as u64),
            labs_core::format::bytes(MAX_DROPPED_BYTES as u64)
        );
    }
    let (snap, _) = snapshot::load(bytes).with_context(|| format!("reading {name}"))?;
    let (html, _) = lab_03::view::page_of(&snap, name, None)?;
    Ok(html)
}

/// [`page`] as the page calls it: `{"page": HTML}` or `{"error": "one line"}`.
pub fn page_json(bytes: &[u8], name: &str) -> String {
    match page(bytes, name) {
        Ok(html) => serde_json::json!({ "page": html }).to_string(),
        Err(e) => serde_json::json!({ "error": format!("{e:#}").replace('\n', " ") }).to_string(),
    }
}
