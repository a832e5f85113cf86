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

use super::env::{new_job_token, DistEnv, ENV_JOB_TOKEN, MAX_WORLD_SIZE};
use super::process_group::ENV_DIST_TIMEOUT;
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
    launch_writing(nproc, program, args, print)
}

/// [`launch`] for this machine's part of a job over several ([`launch_nodes_with`]).
pub fn launch_nodes(
    nproc: usize,
    nodes: &Nodes,
    program: &str,
    args: &[String],
) -> Result<ExitStatus> {
    writing(
        |on_line| launch_nodes_with(nproc, nodes, program, args, on_line),
        print,
    )
}

/// Writes a rank's line to our stdout or stderr, as the rank printed it.
fn print(line: &OutputLine) -> std::io::Result<()> {
    use std::io::Write;
    match line.stream {
        OutputStream::Stdout => writeln!(std::io::stdout().lock(), "{line}"),
        OutputStream::Stderr => writeln!(std::io::stderr().lock(), "{line}"),
    }
}

/// [`launch`], each line written by `write`: a write that fails (our output closed)
/// stops the ranks and is the error, and a closed pipe is such a failure rather than
/// this process's death by `SIGPIPE` while the launch runs.
pub fn launch_writing(
    nproc: usize,
    program: &str,
    args: &[String],
    write: impl FnMut(&OutputLine) -> std::io::Result<()>,
) -> Result<ExitStatus> {
    writing(|on_line| launch_with(nproc, program, args, on_line), write)
}

/// Runs a launch (`run`, given what to do with each line), each line written by `write`,
/// as [`launch_writing`] says.
fn writing(
    run: impl FnOnce(&mut dyn FnMut(OutputLine)) -> Result<ExitStatus>,
    mut write: impl FnMut(&OutputLine) -> std::io::Result<()>,
) -> Result<ExitStatus> {
    /// A write of the ranks' output that failed: it ends the launch.
    struct OutputClosed(OutputStream, std::io::Error);
    let _ignored = BrokenPipeIgnored::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run(&mut |line| {
            if let Err(e) = write(&line) {
                // Unwinds through the launch, whose guard stops the ranks.
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

/// Where this machine's ranks sit in a job over several machines, as `torchrun
/// --nnodes --node-rank --master-addr --master-port` places them: node `node_rank`
/// of `nnodes` starts ranks `node_rank · nproc` to `(node_rank + 1) · nproc − 1`, and
/// every rank meets at `master_addr:master_port`, where rank 0 (on node 0) listens.
#[derive(Debug, Clone, PartialEq)]
pub struct Nodes {
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// The job's token, the same on every node (the command line takes it from
    /// `LABS_JOB_TOKEN`): each machine's launcher must admit the others' ranks, so none
    /// can draw one of its own.
    pub job_token: String,
    /// How long the ranks wait for each other (`LABS_DIST_TIMEOUT`, handed to them);
    /// `None` leaves it to their environment.
    pub timeout: Option<Duration>,
}

/// One launch: the ranks this machine starts and the job they join.
struct Job {
    nproc: usize,
    first_rank: usize,
    world_size: usize,
    master_addr: String,
    master_port: u16,
    token: String,
    /// `Some(node rank)` in a job over several machines.
    node: Option<usize>,
    /// `LABS_DIST_TIMEOUT` for the ranks, if given.
    timeout: Option<Duration>,
}

/// [`launch`], handing each line of output to `on_line` instead of printing it.
pub fn launch_with(
    nproc: usize,
    program: &str,
    args: &[String],
    on_line: impl FnMut(OutputLine),
) -> Result<ExitStatus> {
    check_nproc(nproc)?;
    let job = Job {
        nproc,
        first_rank: 0,
        world_size: nproc,
        master_addr: "127.0.0.1".into(),
        master_port: free_loopback_port()?,
        token: new_job_token(),
        node: None,
        timeout: None,
    };
    run_job(&job, program, args, on_line)
}

fn check_nproc(nproc: usize) -> Result<()> {
    if nproc == 0 || nproc > MAX_LOCAL_RANKS {
        return Err(Error::InvalidArgument(format!(
            "launch: nproc={nproc} is out of range: 1 to {MAX_LOCAL_RANKS} ranks on one machine"
        )));
    }
    Ok(())
}

// ANCHOR: launch_nodes_with
/// This machine's part of a job over `nodes.nnodes` machines: `nproc` ranks, numbered
/// after the nodes before it, joining the rendezvous at the master's address. Every
/// node runs the same command with its own `node_rank` and the same token. A node that
/// never comes, or dies, fails the others: the rendezvous times out naming the ranks
/// that never connected (`nodes.timeout`, else `LABS_DIST_TIMEOUT` seconds, else 60),
/// and a rank whose peer vanished ends with an error that stops the rest of its node.
pub fn launch_nodes_with(
    nproc: usize,
    nodes: &Nodes,
    program: &str,
    args: &[String],
    on_line: impl FnMut(OutputLine),
) -> Result<ExitStatus> {
    check_nproc(nproc)?;
    let Nodes {
        nnodes,
        node_rank,
        ref master_addr,
        master_port,
        ref job_token,
        timeout,
    } = *nodes;
    if nnodes == 0 || node_rank >= nnodes {
        return Err(Error::InvalidArgument(format!(
            "launch: --node-rank {node_rank} of --nnodes {nnodes}: a node's rank is 0 to \
             nnodes - 1"
        )));
    }
    let world_size = nproc
        .checked_mul(nnodes)
        .filter(|&w| w <= MAX_WORLD_SIZE)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "launch: {nnodes} nodes of {nproc} ranks exceed {MAX_WORLD_SIZE} ranks"
            ))
        })?;
    if master_port == 0 {
        return Err(Error::InvalidArgument(
            "launch: --master-port 0: every node must be told the one port rank 0 listens on"
                .into(),
        ));
    }
    let token = job_token.clone();
    if token.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "launch: --nnodes {nnodes}: set {ENV_JOB_TOKEN} to one value on every node (e.g. \
             `export {ENV_JOB_TOKEN}=$(openssl rand -hex 16)` on one and copy it), so that \
             rank 0 admits the ranks of the other machines and nothing else"
        )));
    }
    // The token and the address checked as each rank will check them, before any starts.
    DistEnv::new(0, world_size, master_addr, master_port, Some(token.clone()))?;
    let job = Job {
        nproc,
        first_rank: node_rank * nproc,
        world_size,
        master_addr: master_addr.clone(),
        master_port,
        token,
        node: Some(node_rank),
        timeout,
    };
    run_job(&job, program, args, on_line)
}
// ANCHOR_END: launch_nodes_with

// ANCHOR: run_job
/// Starts the job's ranks on this machine and waits for them: see [`launch`].
fn run_job(
    job: &Job,
    program: &str,
    args: &[String],
    mut on_line: impl FnMut(OutputLine),
) -> Result<ExitStatus> {
    let nproc = job.nproc;
    let (lines, received) = channel();
    let mut ranks = Ranks(Vec::with_capacity(nproc));
    let children = &mut ranks.0;
    for local in 0..nproc {
        let rank = job.first_rank + local;
        let mut command = Command::new(program);
        command
            .args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", job.world_size.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", &job.master_addr)
            .env("MASTER_PORT", job.master_port.to_string())
            .env(ENV_JOB_TOKEN, &job.token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(node) = job.node {
            command.env("GROUP_RANK", node.to_string());
        }
        if let Some(t) = job.timeout {
            command.env(ENV_DIST_TIMEOUT, t.as_secs_f64().to_string());
        }
        let mut child = command.spawn().map_err(|e| {
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
        for local in 0..nproc {
            let Some(child) = children[local].as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                statuses[local] = Some(status);
                children[local] = None;
                if !status.success() && failure.is_none() {
                    failure = Some((job.first_rank + local, status));
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
        Some((rank, status)) => Err(Error::Distributed(match job.node {
            None => format!(
                "rank {rank} of {nproc} {}; the other ranks were stopped",
                describe(status)
            ),
            Some(node) => format!(
                "rank {rank} of {} (node {node}) {}; the other ranks of this node were stopped",
                job.world_size,
                describe(status)
            ),
        })),
    }
}
// ANCHOR_END: run_job

/// Kills the ranks still running and reaps them.
fn stop(children: &mut [Option<Child>]) {
    for child in children.iter_mut().flatten() {
        let _ = child.kill();
        let _ = child.wait();
    }
}
