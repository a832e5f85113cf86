//! Opening the files users give the labs to read: snapshots, traces, weights. Such a
//! path may name anything, so [`open`] takes only a regular file: a FIFO would block
//! the reader until some writer came (forever, typically), and a device such as
//! `/dev/zero` or a directory has no end or no bytes. It refuses a file larger than the
//! kind's [`Limit`] before reading any of it, and the [`Input`] it returns stops with
//! an error at the limit even if the file grows while it is read.
//!
//! Errors are `std::io::Error`s whose message does not name the path: callers name it
//! once, as they do for the system's own errors (`PATH: is a FIFO (named pipe), ...`).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use crate::format::{bytes, parse_bytes};

/// The most bytes of one kind of input file a reader takes, and how a user raises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub max_bytes: u64,
    /// What the file is, for messages: "a snapshot".
    pub what: &'static str,
    /// How to raise the limit, for messages: "LABS_MAX_SNAPSHOT_SIZE".
    pub raise: &'static str,
}

/// A snapshot (ours or PyTorch's pickle). Loaded whole and parsed into memory, so a
/// few times its size in memory; real ones are tens to hundreds of MiB.
pub const SNAPSHOT: Limit = Limit {
    max_bytes: 1 << 30,
    what: "a snapshot",
    raise: "LABS_MAX_SNAPSHOT_SIZE, or lab-03's --max-snapshot-size",
};
pub const ENV_MAX_SNAPSHOT_SIZE: &str = "LABS_MAX_SNAPSHOT_SIZE";

/// A safetensors file of weights. Streamed onto the device a chunk at a time, so the
/// limit guards against a wrong file rather than host memory; it is above the largest
/// models the labs train or load.
pub const WEIGHTS: Limit = Limit {
    max_bytes: 16 << 30,
    what: "a weights file",
    raise: ENV_MAX_WEIGHTS_SIZE,
};
pub const ENV_MAX_WEIGHTS_SIZE: &str = "LABS_MAX_WEIGHTS_SIZE";

/// A report another program wrote for a lab to read beside its own figures (the JSON
/// lines of PyTorch's twins: `--pytorch FILE`). A few kilobytes in practice.
pub const REPORT: Limit = Limit {
    max_bytes: 64 << 20,
    what: "a report",
    raise: ENV_MAX_REPORT_SIZE,
};
pub const ENV_MAX_REPORT_SIZE: &str = "LABS_MAX_REPORT_SIZE";

impl Limit {
    /// `self` with its maximum taken from the environment variable `var` when it is
    /// set; a value that is not a size, or is zero, is an error naming the variable.
    pub fn from_env(self, var: &str) -> io::Result<Limit> {
        match std::env::var(var) {
            Err(std::env::VarError::NotPresent) => Ok(self),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(invalid(format!("{var} is not valid UTF-8")))
            }
            Ok(text) => match parse_bytes(&text) {
                Ok(0) => Err(invalid(format!(
                    "{var}: the size must be more than 0 bytes"
                ))),
                Ok(max_bytes) => Ok(Limit { max_bytes, ..self }),
                Err(e) => Err(invalid(format!("{var}: {e}"))),
            },
        }
    }

    fn over(&self, size: &str) -> io::Error {
        invalid(format!(
            "{size}, more than the {} ({} bytes) {} may be; raise the limit ({}) if it is \
             genuine",
            bytes(self.max_bytes),
            self.max_bytes,
            self.what,
            self.raise
        ))
    }
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// What a path names when it is not a regular file, in words.
fn not_regular(kind: &std::fs::FileType) -> Option<&'static str> {
    if kind.is_file() {
        return None;
    }
    if kind.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if kind.is_char_device() {
            return Some("a character device");
        }
        if kind.is_block_device() {
            return Some("a block device");
        }
        if kind.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a file")
}

fn refuse(what: &str) -> io::Error {
    invalid(format!(
        "is {what}, not a regular file: give the path of a file"
    ))
}

/// An open regular file no larger than its limit, read through [`Read`] (which fails
/// past the limit).
#[derive(Debug)]
pub struct Input {
    file: File,
    len: u64,
    read: u64,
    limit: Limit,
}

/// Opens `path` for reading if it is a regular file of at most `limit.max_bytes`.
/// Symbolic links are followed. Nothing is read, and nothing blocks: the type is
/// checked before opening, and the open itself does not wait (`O_NONBLOCK`) in case
/// the path was replaced by a FIFO in between; the opened file is checked again.
pub fn open(path: &Path, limit: Limit) -> io::Result<Input> {
    let meta = std::fs::metadata(path)?;
    if let Some(what) = not_regular(&meta.file_type()) {
        return Err(refuse(what));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: no effect on a regular file's reads.
        const O_NONBLOCK: i32 = 0o4000;
        options.custom_flags(O_NONBLOCK);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if let Some(what) = not_regular(&meta.file_type()) {
        return Err(refuse(what));
    }
    let len = meta.len();
    if len > limit.max_bytes {
        return Err(limit.over(&format!("is {} ({len} bytes)", bytes(len))));
    }
    Ok(Input {
        file,
        len,
        read: 0,
        limit,
    })
}

/// The whole of the regular file at `path`, if it is at most `limit.max_bytes`.
pub fn read(path: &Path, limit: Limit) -> io::Result<Vec<u8>> {
    open(path, limit)?.read_all()
}

/// The report at `path` as text (see [`REPORT`]; `LABS_MAX_REPORT_SIZE` raises its
/// limit).
pub fn read_report(path: &Path) -> io::Result<String> {
    read_text(path, REPORT.from_env(ENV_MAX_REPORT_SIZE)?)
}

/// The regular file at `path` as text, if it is at most `limit.max_bytes` and UTF-8.
pub fn read_text(path: &Path, limit: Limit) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|e| {
        invalid(format!(
            "not UTF-8 text (byte {} is not part of a UTF-8 character)",
            e.utf8_error().valid_up_to()
        ))
    })
}

impl Input {
    /// The file's size when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rest of the file.
    pub fn read_all(mut self) -> io::Result<Vec<u8>> {
        // The size is known and within the limit: one allocation, no doubling.
        let mut out = Vec::with_capacity((self.len - self.read.min(self.len)) as usize);
        self.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Fills `buf` from the file; a file that ends first is an error saying how many
    /// bytes `what` needed.
    pub fn read_exact_or(&mut self, buf: &mut [u8], what: &str) -> io::Result<()> {
        self.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the file ends inside {what} ({} bytes)", buf.len()),
            ),
            _ => e,
        })
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // One byte past the limit tells "grew beyond it" from "exactly at it".
        let room = (self.limit.max_bytes + 1).saturating_sub(self.read);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.file.read(&mut buf[..want])?;
        self.read += n as u64;
        if self.read > self.limit.max_bytes {
            return Err(self.limit.over("grew while being read"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn scratch(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("labs-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    const TEN: Limit = Limit {
        max_bytes: 10,
        what: "a test file",
        raise: "TEST_LIMIT",
    };

    #[test]
    fn a_file_within_the_limit_is_read_whole() {
        for body in [&b""[..], b"0123456789"] {
            let path = scratch("within", body);
            assert_eq!(read(&path, TEN).unwrap(), body);
        }
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_the_limit_and_how_to_raise_it() {
        let path = scratch("over", b"0123456789a");
        let e = read(&path, TEN).unwrap_err().to_string();
        assert!(
            e.contains("11 bytes")
                && e.contains("(10 bytes) a test file may be")
                && e.contains("TEST_LIMIT"),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_grows_past_the_limit_is_read_no_further() {
        let path = scratch("grows", b"01234");
        let input = open(&path, TEN).unwrap();
        let mut more = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        more.write_all(b"56789abcdef").unwrap();
        let e = input.read_all().unwrap_err().to_string();
        assert!(
            e.contains("grew while being read") && e.contains("TEST_LIMIT"),
            "{e}"
        );
        // Grown, but still within the limit: read as it is now.
        let path = scratch("grows-within", b"01234");
        let input = open(&path, TEN).unwrap();
        let mut more = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        more.write_all(b"56789").unwrap();
        assert_eq!(input.read_all().unwrap(), b"0123456789");
    }

    #[test]
    fn a_limit_from_the_environment_is_checked() {
        let var = "LABS_INPUT_TEST_LIMIT";
        std::env::set_var(var, "1KiB");
        assert_eq!(TEN.from_env(var).unwrap().max_bytes, 1024);
        for bad in ["0", "lots"] {
            std::env::set_var(var, bad);
            let e = TEN.from_env(var).unwrap_err().to_string();
            assert!(e.starts_with(var), "{e}");
        }
        std::env::remove_var(var);
        assert_eq!(TEN.from_env(var).unwrap(), TEN);
    }
}
