//! The pictures of a snapshot, as SVG: memory over the trace, the largest allocations
//! as stacked bands (PyTorch memory_viz's "Active Memory Timeline"), and a map of the
//! segments with their blocks.

mod bands;
mod categories;
mod segments;
mod style;
mod timeline;

use std::path::{Path, PathBuf};

use crate::snapshot::Snapshot;
use anyhow::Context;

pub use bands::active_memory_svg;
pub use categories::{
    category_area_svg, category_area_svg_to, category_peak, BANDS as CATEGORY_BANDS,
};
pub use segments::segments_svg;
pub use timeline::timeline_svg;

/// How many allocations get a band of their own; the rest are summed into one.
pub const TOP_BANDS: usize = 12;

/// The file names `write_all` uses, with the title each picture carries.
pub const PICTURES: [(&str, &str); 3] = [
    ("timeline.svg", timeline::TITLE),
    ("active_memory.svg", bands::TITLE),
    ("segments.svg", segments::TITLE),
];

/// Writes every picture of `device` into `dir` (created if needed).
pub fn write_all(snapshot: &Snapshot, device: i64, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let svgs = [
        timeline_svg(snapshot, device)?,
        active_memory_svg(snapshot, device, TOP_BANDS)?,
        segments_svg(snapshot, device)?,
    ];
    let mut written = Vec::new();
    for ((name, _), svg) in PICTURES.iter().zip(svgs) {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
