//! Our snapshot file: JSON, tagged with a format name and version so that a reader can
//! tell one of ours from any other JSON and refuse a version it does not know.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::model::{AllocatorSettings, Segment, Snapshot, TraceEvent};
use super::SnapshotError;

pub const FORMAT_NAME: &str = "labs-memory-snapshot";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
struct DocOut<'a> {
    format: &'static str,
    version: u32,
    segments: &'a [Segment],
    trace: &'a [TraceEvent],
    settings: &'a AllocatorSettings,
}

#[derive(Deserialize)]
struct DocIn {
    format: String,
    version: u32,
    segments: Vec<Segment>,
    #[serde(default)]
    trace: Vec<TraceEvent>,
    #[serde(default)]
    settings: AllocatorSettings,
}

/// The snapshot as JSON text.
pub fn dump(snapshot: &Snapshot) -> String {
    let doc = DocOut {
        format: FORMAT_NAME,
        version: FORMAT_VERSION,
        segments: &snapshot.segments,
        trace: &snapshot.trace,
        settings: &snapshot.settings,
    };
    serde_json::to_string(&doc).expect("a snapshot always serialises")
}

pub fn dump_to_file(snapshot: &Snapshot, path: impl AsRef<Path>) -> Result<(), SnapshotError> {
    let path = path.as_ref();
    std::fs::write(path, dump(snapshot)).map_err(|e| SnapshotError::io(path, e))
}

/// Reads JSON written by [`dump`].
pub fn load_json(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    // The tag is checked before the body so that foreign JSON gets "not ours" rather
    // than a complaint about some missing field.
    #[derive(Deserialize)]
    struct Tag {
        format: Option<String>,
        version: Option<u32>,
    }
    let tag: Tag = serde_json::from_slice(bytes)
        .map_err(|e| SnapshotError::Json(super::error::quote_message(&e.to_string())))?;
    match (tag.format.as_deref(), tag.version) {
        (Some(FORMAT_NAME), Some(FORMAT_VERSION)) => {}
        (Some(FORMAT_NAME), v) => {
            return Err(SnapshotError::Json(format!(
                "format version {v:?} is not supported (this build reads version {FORMAT_VERSION})"
            )))
        }
        (other, _) => {
            let found = other.map_or("missing".to_string(), super::error::quote);
            return Err(SnapshotError::Json(format!(
                "`format` is {found}, expected \"{FORMAT_NAME}\""
            )));
        }
    }
    let doc: DocIn = serde_json::from_slice(bytes)
        .map_err(|e| SnapshotError::Json(super::error::quote_message(&e.to_string())))?;
    debug_assert_eq!(doc.format, FORMAT_NAME);
    let _ = doc.version;
    let snapshot = Snapshot {
        segments: doc.segments,
        trace: doc.trace,
        settings: doc.settings,
    };
    super::validate::sizes(&snapshot)?;
    Ok(snapshot)
}
