//! A launcher like `torchrun --nproc-per-node N`: starts one process per rank with
//! PyTorch's environment variables, prefixes each line they print with its rank, and
//! when one fails stops the others and says which rank failed and how. Each job gets a
//! random token (`LABS_JOB_TOKEN`) that admits its ranks, and only them, to its
//! rendezvous. The launcher never leaves a rank behind: whether it returns, fails or
//! panics (in the output handler), the ranks still running are killed and reaped.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

use super::env::{new_job_token, ENV_JOB_TOKEN};
use crate::error::{Error, Result};

/// The most ranks one launch starts (processes on this machine).
pub const MAX_LOCAL_RANKS: usize = 1024;

/// Which of a child's outputs a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// One line a rank printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLine {
    pub rank: usize,
    pub stream: OutputStream,
    pub text: String,
}

impl std::fmt::Display for OutputLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[rank {}] {}", self.rank, self.text)
    }
}

/// Runs `program args` as `nproc` ranks on this machine and forwards their output to
/// ours, each line prefixed with `[rank N]`. Returns rank 0's status once all have
/// succeeded; the first rank to fail stops the others and is the error. When our own
/// output is closed (`… | head -1`), the ranks are stopped and that is the error.
pub fn launch(nproc: usize, program: &str, args: &[String]) -> Result<ExitStatus> {
    use std::io::Write;
    launch_writing(nproc, program, args, |line| match line.stream {
        OutputStream::Stdout => writeln!(std::io::stdout().lock(), "{line}"),
        OutputStream::Stderr => writeln!(std::io::stderr().lock(), "{line}"),
    })
}

/// [`launch`], each line written by `write`: a write that fails (our output closed)
/// stops the ranks and is the error, and a closed pipe is such a failure rather than
/// this process's death by `SIGPIPE` while the launch runs.
pub fn launch_writing(
    nproc: usize,
    program: &str,
    args: &[String],
    mut write: impl FnMut(&OutputLine) -> std::io::Result<()>,
) -> Result<ExitStatus> {
    /// A write of the ranks' output that failed: it ends the launch.
    struct OutputClosed(OutputStream, std::io::Error);
    let _ignored = BrokenPipeIgnored::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        launch_with(nproc, program, args, |line| {
            if let Err(e) = write(&line) {
                // Unwinds through launch_with, whose guard stops the ranks.
                std::panic::resume_unwind(Box::new(OutputClosed(line.stream, e)));
            }
        })
    }));
    match outcome {
        Ok(status) => status,
        Err(payload) => match payload.downcast::<OutputClosed>() {
            Ok(closed) => Err(Error::Distributed(format!(
                "launch: cannot write rank output to {}: {}; the ranks were stopped",
                match closed.0 {
                    OutputStream::Stdout => "stdout",
                    OutputStream::Stderr => "stderr",
                },
                closed.1
            ))),
            Err(other) => std::panic::resume_unwind(other),
        },
    }
}

/// While it lives, a write to a closed pipe is an error (`EPIPE`) rather than the death
/// of this process by `SIGPIPE`, which would leave the ranks running. The ranks start
/// with the default disposition (the standard library restores it in each child).
struct BrokenPipeIgnored {
    #[cfg(unix)]
    previous: usize,
}

#[cfg(unix)]
extern "C" {
    fn signal(signum: i32, handler: usize) -> usize;
}

/// `SIGPIPE` and `SIG_IGN`: the same numbers on Linux and macOS.
#[cfg(unix)]
const SIGPIPE: i32 = 13;
#[cfg(unix)]
const SIG_IGN: usize = 1;

impl BrokenPipeIgnored {
    fn new() -> Self {
        BrokenPipeIgnored {
            // SAFETY: sets the disposition of one signal to "ignore"; no handler code
            // is installed.
            #[cfg(unix)]
            previous: unsafe { signal(SIGPIPE, SIG_IGN) },
        }
    }
}

impl Drop for BrokenPipeIgnored {
    fn drop(&mut self) {
        // SAFETY: restores the disposition `new` found (SIG_ERR, all ones, is not one).
        #[cfg(unix)]
        if self.previous != usize::MAX {
            unsafe {
                signal(SIGPIPE, self.previous);
            }
        }
    }
}

/// A free TCP port on the loopback interface, for a rendezvous, chosen below Linux's
/// ephemeral range (which starts at 32768). The port is closed again before rank 0
/// listens on it, and a port the system handed out (`bind` to port 0) can meanwhile
/// become the local end of some other program's outgoing connection, which leaves rank
/// 0 unable to listen there; outgoing connections never take ports below that range.
/// Each call in a process tries a different sequence, so that two launches at once
/// do not pick the same port.
pub fn free_loopback_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    let seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(7_919));
    for i in 0..COUNT {
        let port = FIRST + seed.wrapping_add(i.wrapping_mul(104_729)) % COUNT;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return Ok(port as u16);
        }
    }
    Err(Error::Distributed(format!(
        "finding a free port: every loopback port from {FIRST} to {} is in use",
        FIRST + COUNT - 1
    )))
}

fn forward(
    rank: usize,
    stream: OutputStream,
    from: impl Read + Send + 'static,
    to: Sender<OutputLine>,
) -> Result<()> {
    let name = format!("launch-rank{rank}-{stream:?}");
    let what = format!("the reader of rank {rank}'s {stream:?}");
    crate::threads::spawn(name, &what, move || {
        for text in BufReader::new(from).lines().map_while(std::io::Result::ok) {
            if to.send(OutputLine { rank, stream, text }).is_err() {
                break;
            }
        }
    })
    .map(drop)
}

/// The ranks a launch started; those still running when it is dropped (the launch
/// returns, fails or unwinds) are killed and reaped.
struct Ranks(Vec<Option<Child>>);

impl Drop for Ranks {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

/// How a process ended, in words.
fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exited with code {code}"),
        None => format!("ended ({status})"),
    }
}

// ANCHOR: launch_with
/// [`launch`], handing each line of output to `on_line` instead of printing it.
pub fn launch_with(
    nproc: usize,
    program: &str,
    args: &[String],
    mut on_line: impl FnMut(OutputLine),
) -> Result<ExitStatus> {
    if nproc == 0 || nproc > MAX_LOCAL_RANKS {
        return Err(Error::InvalidArgument(format!(
            "launch: nproc={nproc} is out of range: 1 to {MAX_LOCAL_RANKS} ranks on one machine"
        )));
    }
    let port = free_loopback_port()?;
    let token = new_job_token();
    let (lines, received) = channel();
    let mut ranks = Ranks(Vec::with_capacity(nproc));
    let children = &mut ranks.0;
    for rank in 0..nproc {
        let spawned = Command::new(program)
            .args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(ENV_JOB_TOKEN, &token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = spawned.map_err(|e| {
            Error::Distributed(format!(
                "launch: cannot start rank {rank} ({program}): {e}; the ranks started were \
                 stopped"
            ))
        })?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        children.push(Some(child));
        for (stream, from) in [
            (
                OutputStream::Stdout,
                stdout.map(|s| Box::new(s) as Box<dyn Read + Send>),
            ),
            (
                OutputStream::Stderr,
                stderr.map(|s| Box::new(s) as Box<dyn Read + Send>),
            ),
        ] {
            let from = from.expect("a piped output");
            forward(rank, stream, from, lines.clone()).map_err(|e| {
                Error::Distributed(format!("launch: {e}; the ranks started were stopped"))
            })?;
        }
    }
    drop(lines);
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; nproc];
    let mut failure = None;
    while failure.is_none() && statuses.iter().any(Option::is_none) {
        match received.recv_timeout(Duration::from_millis(20)) {
            Ok(line) => on_line(line),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        for rank in 0..nproc {
            let Some(child) = children[rank].as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                statuses[rank] = Some(status);
                children[rank] = None;
                if !status.success() && failure.is_none() {
                    failure = Some((rank, status));
                }
            }
        }
    }
    stop(children);
    // What the ranks printed before they ended: the readers end with the pipes, unless
    // a process the rank started still holds them, hence the quiet period.
    while let Ok(line) = received.recv_timeout(Duration::from_millis(500)) {
        on_line(line);
    }
    match failure {
        None => Ok(statuses[0].expect("every rank has ended")),
        Some((rank, status)) => Err(Error::Distributed(format!(
            "rank {rank} of {nproc} {}; the other ranks were stopped",
            describe(status)
        ))),
    }
}
// ANCHOR_END: launch_with

/// Kills the ranks still running and reaps them.
fn stop(children: &mut [Option<Child>]) {
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
}
