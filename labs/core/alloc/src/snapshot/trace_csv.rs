//! The trace as the CSV that lab 2 replays (`data/traces`): gzip'd or plain,
//! header `action,addr,size,stream`, one event per line in trace order. One device per
//! file, as a replay drives one allocator.
//!
//! This is the one reader of the format (replay and snapshot export share it), and it is
//! strict and bounded, because traces come from strangers: the header is required, every
//! line is validated whatever its action, and a line or a decompressed stream longer
//! than its limit is an error before it is held in memory.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use super::error::quote;
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
    /// The line in the file (the header is line 1), for error messages.
    pub line: usize,
}

/// How much a reader takes in before refusing a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceLimits {
    /// Bytes of CSV text after decompression. A 25 MB gzip can hold gigabytes.
    pub max_bytes: u64,
    /// Bytes of one line: a valid line is under 100.
    pub max_line: usize,
}

impl TraceLimits {
    /// 256 MiB of text, about ten million events: a hundred times the largest shared
    /// trace, and a few hundred MiB of memory once parsed.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
    pub const DEFAULT_MAX_LINE: usize = 4096;
}

impl Default for TraceLimits {
    fn default() -> Self {
        TraceLimits {
            max_bytes: Self::DEFAULT_MAX_BYTES,
            max_line: Self::DEFAULT_MAX_LINE,
        }
    }
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

/// Reads a trace CSV, gzip'd or plain (told apart by gzip's magic number), with the
/// default limits. Errors say "trace CSV" where [`read_trace_file`] names the file.
pub fn read_trace_csv(reader: impl Read) -> Result<Vec<CsvEvent>, SnapshotError> {
    read_trace_from("trace CSV", reader, TraceLimits::default())
}

/// Reads the trace CSV at `path`; errors name the file once. Only a regular file is
/// read, and one larger than `limits.max_bytes` is refused before it is read (a gzip'd
/// trace is much smaller than its text, which the same limit bounds).
pub fn read_trace_file(path: &Path, limits: TraceLimits) -> Result<Vec<CsvEvent>, SnapshotError> {
    let limit = crate::input::Limit {
        max_bytes: limits.max_bytes,
        what: "a trace",
        raise: "lab-02: --max-trace-size",
    };
    let file = crate::input::open(path, limit).map_err(|e| SnapshotError::io(path, e))?;
    read_trace_from(&path.display().to_string(), file, limits)
}

/// Reads a trace CSV from `reader`; `source` names it in errors.
pub fn read_trace_from(
    source: &str,
    reader: impl Read,
    limits: TraceLimits,
) -> Result<Vec<CsvEvent>, SnapshotError> {
    let bad = |line: usize, problem: String| SnapshotError::TraceCsv {
        file: source.to_string(),
        line,
        problem,
    };
    let mut input = BufReader::new(reader);
    let gzipped = input
        .fill_buf()
        .map_err(|e| bad(1, format!("cannot be read ({e})")))?
        .starts_with(&[0x1f, 0x8b]);
    let text: Box<dyn Read> = if gzipped {
        Box::new(MultiGzDecoder::new(input))
    } else {
        Box::new(input)
    };
    // One byte past the limit tells "exactly at the limit" from "beyond it".
    let mut text = BufReader::new(text.take(limits.max_bytes.saturating_add(1)));
    let (mut events, mut buf, mut total) = (Vec::new(), Vec::new(), 0u64);
    for n in 1.. {
        buf.clear();
        let max = limits.max_line as u64 + 1;
        let got = (&mut text)
            .take(max)
            .read_until(b'\n', &mut buf)
            .map_err(|e| bad(n, format!("cannot be read ({e})")))?;
        total += got as u64;
        if total > limits.max_bytes {
            return Err(bad(
                n,
                format!(
                    "the trace is longer than {} bytes{}; raise the limit (lab-02: \
                     --max-trace-size) if it is genuine",
                    limits.max_bytes,
                    if gzipped { " once decompressed" } else { "" }
                ),
            ));
        }
        if got == 0 {
            if n == 1 {
                return Err(bad(
                    1,
                    format!("the file is empty: expected the header `{HEADER}`"),
                ));
            }
            break;
        }
        let content = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if content.len() > limits.max_line {
            return Err(bad(
                n,
                format!("the line is longer than {} bytes", limits.max_line),
            ));
        }
        let line = std::str::from_utf8(content)
            .map_err(|_| bad(n, "the line is not UTF-8 text".to_string()))?
            .trim();
        if n == 1 {
            if line != HEADER {
                return Err(bad(
                    1,
                    format!("expected the header `{HEADER}`, found {}", quote(line)),
                ));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        events.push(parse_line(line, n).map_err(|problem| bad(n, problem))?);
    }
    Ok(events)
}

/// One line after the header, whatever its action.
fn parse_line(line: &str, n: usize) -> Result<CsvEvent, String> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [action, addr, size, stream] = fields[..] else {
        return Err(format!(
            "expected 4 fields, found {} in {}",
            fields.len(),
            quote(line)
        ));
    };
    let action = match TraceAction::from(action.to_string()) {
        TraceAction::Other(a) => return Err(format!("unknown action {}", quote(&a))),
        known => known,
    };
    let number = |text: &str, name: &str| -> Result<u64, String> {
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        };
        parsed.map_err(|_| format!("{name} {} is not a non-negative integer", quote(text)))
    };
    Ok(CsvEvent {
        action,
        addr: number(addr, "addr")?,
        size: number(size, "size")?,
        stream: number(stream, "stream")?,
        line: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Vec<CsvEvent>, String> {
        read_trace_from("t.csv", text.as_bytes(), TraceLimits::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for (text, needle) in [
            ("", "t.csv: line 1: the file is empty"),
            ("nope\n", "line 1: expected the header"),
            (
                "action,addr,size,stream\nalloc,1,2\n",
                "line 2: expected 4 fields",
            ),
            (
                "action,addr,size,stream\nalloc,1,2,0\nalloc,x,2,0\n",
                "line 3: addr `x`",
            ),
            (
                "action,addr,size,stream\nalloc,1,-5,0\n",
                "line 2: size `-5`",
            ),
            (
                "action,addr,size,stream\nmalloc,1,5,0\n",
                "line 2: unknown action `malloc`",
            ),
            (
                "action,addr,size,stream\nfree_completed,zz,yy,xx\n",
                "line 2: addr `zz`",
            ),
        ] {
            let e = read(text).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        let ok = read("action,addr,size,stream\nalloc,16,100,0\nsegment_alloc,0,2097152,0\nfree_requested,0x10,100,0\n").unwrap();
        assert_eq!(ok.len(), 3);
        assert_eq!(
            (ok[2].action.clone(), ok[2].addr, ok[2].line),
            (TraceAction::FreeRequested, 16, 4)
        );
    }

    #[test]
    fn limits_are_enforced_at_their_exact_value() {
        let text = "action,addr,size,stream\nalloc,16,100,0\n";
        let at = |max_bytes, max_line| {
            read_trace_from(
                "t",
                text.as_bytes(),
                TraceLimits {
                    max_bytes,
                    max_line,
                },
            )
        };
        assert!(at(text.len() as u64, 23).is_ok());
        let e = at(text.len() as u64 - 1, 23).unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
        let e = at(1000, 22).unwrap_err().to_string();
        assert!(
            e.contains("line 1: the line is longer than 22 bytes"),
            "{e}"
        );
    }
}
