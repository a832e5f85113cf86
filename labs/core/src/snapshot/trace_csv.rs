//! The trace as the CSV that lab 2 replays (`data/traces`): gzip'd, header
//! `action,addr,size,stream`, one event per line in trace order. One device per file,
//! as a replay drives one allocator.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use super::model::{Snapshot, TraceAction};
use super::SnapshotError;

pub const HEADER: &str = "action,addr,size,stream";

/// One line of a trace CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvEvent {
    pub action: TraceAction,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
}

/// Writes `device`'s events as plain CSV; returns how many were written.
pub fn write_trace_csv(
    snapshot: &Snapshot,
    device: i64,
    out: &mut impl Write,
) -> std::io::Result<usize> {
    writeln!(out, "{HEADER}")?;
    let mut n = 0;
    for e in snapshot.trace.iter().filter(|e| e.device == device) {
        writeln!(out, "{},{},{},{}", e.action, e.addr, e.size, e.stream)?;
        n += 1;
    }
    Ok(n)
}

/// Writes `device`'s events to `path`, gzip'd; returns how many were written.
pub fn export_trace(
    snapshot: &Snapshot,
    device: i64,
    path: impl AsRef<Path>,
) -> Result<usize, SnapshotError> {
    let path = path.as_ref();
    let io = |e| SnapshotError::io(path, e);
    let file = std::fs::File::create(path).map_err(io)?;
    let mut gz = GzEncoder::new(std::io::BufWriter::new(file), Compression::default());
    let n = write_trace_csv(snapshot, device, &mut gz).map_err(io)?;
    gz.finish().map_err(io)?.flush().map_err(io)?;
    Ok(n)
}

/// Reads a gzip'd trace CSV.
pub fn read_trace_csv(reader: impl Read) -> Result<Vec<CsvEvent>, SnapshotError> {
    let lines = BufReader::new(GzDecoder::new(reader)).lines();
    let mut events = Vec::new();
    for (i, line) in lines.enumerate() {
        let n = i + 1;
        let bad = |problem: String| SnapshotError::TraceCsv { line: n, problem };
        let line = line.map_err(|e| bad(format!("cannot read ({e})")))?;
        if n == 1 {
            if line.trim() != HEADER {
                return Err(bad(format!("header is {line:?}, expected {HEADER:?}")));
            }
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != 4 {
            return Err(bad(format!("{} fields, expected 4", fields.len())));
        }
        let num = |i: usize, what: &str| {
            fields[i]
                .trim()
                .parse::<u64>()
                .map_err(|_| bad(format!("{what} {:?} is not a number", fields[i])))
        };
        events.push(CsvEvent {
            action: TraceAction::from(fields[0].trim().to_string()),
            addr: num(1, "addr")?,
            size: num(2, "size")?,
            stream: num(3, "stream")?,
        });
    }
    Ok(events)
}
