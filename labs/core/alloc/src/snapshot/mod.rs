//! Memory snapshots: the allocator's segments and blocks at one moment plus the history
//! of events that led there. Our allocator writes them as JSON (`dump`/`load`);
//! PyTorch's `torch.cuda.memory._dump_snapshot` pickles are imported into the same
//! model, so every view of lab 3 works on both.

mod error;
mod json;
mod model;
mod pickle;
mod pytorch;
mod summary;
mod timeline;
mod trace_csv;
mod validate;

pub use error::SnapshotError;
pub use json::{dump, dump_to_file, load_json, FORMAT_NAME, FORMAT_VERSION};
pub use model::{
    AllocatorSettings, Block, BlockState, Frame, Frames, Segment, SegmentType, Snapshot,
    TraceAction, TraceEvent,
};
pub use pytorch::load_pickle;
pub use summary::Summary;
pub use timeline::{
    live_intervals, memory_timeline, stacked_bands, Bands, Interval, TimelinePoint,
};
pub use trace_csv::{
    export_trace, read_trace_csv, read_trace_file, read_trace_from, write_trace_csv, CsvEvent,
    TraceLimits,
};

use std::path::Path;

use crate::input;

/// Which kind of file a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    Json,
    PyTorchPickle,
}

// ANCHOR: load_either
/// Reads a snapshot in either format, told apart by content (not by file name): a
/// pickle of protocol 2 or later starts with the PROTO opcode, our JSON with `{`.
pub fn load(bytes: &[u8]) -> Result<(Snapshot, SourceFormat), SnapshotError> {
    match bytes.iter().copied().find(|b| !b.is_ascii_whitespace()) {
        Some(0x80) => Ok((load_pickle(bytes)?, SourceFormat::PyTorchPickle)),
        Some(b'{') => Ok((load_json(bytes)?, SourceFormat::Json)),
        None => Err(SnapshotError::UnknownFormat("is empty".into())),
        Some(_) => Err(SnapshotError::UnknownFormat(format!(
            "starts with {}",
            describe_start(bytes)
        ))),
    }
}
// ANCHOR_END: load_either

/// [`load`] of a file: a regular file of at most [`input::SNAPSHOT`]'s size (1 GiB,
/// raised with `LABS_MAX_SNAPSHOT_SIZE`); anything else is refused before it is read.
pub fn load_file(path: impl AsRef<Path>) -> Result<(Snapshot, SourceFormat), SnapshotError> {
    let path = path.as_ref();
    let limit = input::SNAPSHOT
        .from_env(input::ENV_MAX_SNAPSHOT_SIZE)
        .map_err(|e| SnapshotError::io(path, e))?;
    load_file_limited(path, limit.max_bytes)
}

/// [`load_file`] of a file of at most `max_bytes`.
pub fn load_file_limited(
    path: impl AsRef<Path>,
    max_bytes: u64,
) -> Result<(Snapshot, SourceFormat), SnapshotError> {
    let path = path.as_ref();
    let limit = input::Limit {
        max_bytes,
        ..input::SNAPSHOT
    };
    let bytes = input::read(path, limit).map_err(|e| SnapshotError::io(path, e))?;
    load(&bytes).map_err(|e| e.in_file(path))
}

fn describe_start(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(16)];
    format!("\"{}\"", head.escape_ascii())
}

impl Snapshot {
    /// The devices that appear in the segments or the trace, in order.
    pub fn devices(&self) -> Vec<i64> {
        let mut d: Vec<i64> = self
            .segments
            .iter()
            .map(|s| s.device)
            .chain(self.trace.iter().map(|e| e.device))
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The one device a per-device view should show: `requested`, else the only device
    /// there is; several devices and no choice is an error naming them.
    pub fn pick_device(&self, requested: Option<i64>) -> Result<i64, SnapshotError> {
        let devices = self.devices();
        match requested {
            Some(d) if devices.contains(&d) || devices.is_empty() => Ok(d),
            Some(d) => Err(SnapshotError::Device(format!(
                "the snapshot has nothing for device {d} (devices: {devices:?})"
            ))),
            None => match devices.as_slice() {
                [] => Ok(0),
                [one] => Ok(*one),
                many => Err(SnapshotError::Device(format!(
                    "the snapshot covers devices {many:?}: choose one"
                ))),
            },
        }
    }
}
