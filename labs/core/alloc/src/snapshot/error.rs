//! Why a snapshot or trace file could not be read or written. Every message names the
//! file's problem in words a user can act on; none of these paths panics.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The message names the file and the system's reason; the reason is not also
    /// given as a `source`, so that chained error reports do not say it twice.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// Neither our JSON nor a pickle: says what the file starts with instead.
    #[error(
        "not a memory snapshot: expected a PyTorch pickle (protocol 2 to 5, as torch writes; \
         protocols 0 and 1 are not read) or a labs JSON snapshot, but the file {0}"
    )]
    UnknownFormat(String),

    /// The pickle itself is broken (truncated, corrupt, or uses objects we do not load).
    #[error("not a readable pickle: {0}")]
    Pickle(String),

    /// A well-formed file whose contents are not a snapshot of the expected shape.
    #[error("unexpected snapshot contents at `{at}`: {problem}")]
    Shape { at: String, problem: String },

    /// A JSON file that is not one of our snapshots, or a damaged one.
    #[error("not a valid labs JSON snapshot: {0}")]
    Json(String),

    /// A trace CSV that is not in the `action,addr,size,stream` format, or is larger
    /// than the reader's limits; `file` names it.
    #[error("{file}: line {line}: {problem}")]
    TraceCsv {
        file: String,
        line: usize,
        problem: String,
    },

    /// Any of the above about a file, naming it once.
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<SnapshotError>,
    },

    /// A request about a device the snapshot has nothing for, or several devices where
    /// one is needed.
    #[error("{0}")]
    Device(String),
}

impl SnapshotError {
    pub(crate) fn shape(at: impl Into<String>, problem: impl Into<String>) -> Self {
        SnapshotError::Shape {
            at: at.into(),
            problem: problem.into(),
        }
    }

    /// `self`, naming the file it came from (once: an error that names it already is
    /// left as it is).
    pub(crate) fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            e @ (SnapshotError::Io { .. } | SnapshotError::InFile { .. }) => e,
            e => SnapshotError::InFile {
                path: path.into(),
                error: Box::new(e),
            },
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        SnapshotError::Io {
            path: path.into(),
            error,
        }
    }
}

// Input quoted in messages: the crate's one rule (`format.rs`, a leaf like this
// module: neither imports anything else of the crate).
pub(crate) use crate::format::{quote, quote_message};
