//! How the processes of a job find each other, as `torchrun` and PyTorch's TCP store
//! do: every process reads its place in the job from the environment ([`DistEnv`]);
//! rank 0 listens at `MASTER_ADDR:MASTER_PORT`, the others connect (retrying until a
//! timeout) and greet it with their rank and the job's token, rank 0 sends each the 128
//! bytes of NCCL's unique id, and all meet at a barrier. A peer that vanishes or never
//! comes is an error naming it, never a hang.
//!
//! Rank 0 reads the connections that have not greeted yet side by side, each for at
//! most [`GREETING_TIMEOUT`]: whatever else connects to the port (a web request,
//! garbage, a connection that says nothing, a greeting without the job's token) is
//! refused and logged in one line on stderr, and takes no rank's slot.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::env::{DistEnv, ENV_JOB_TOKEN};
use super::wire::{self, lost, recv, send, MAX_GREETING_BYTES, MAX_MESSAGE_BYTES};
use crate::device::UNIQUE_ID_BYTES;
use crate::error::{Error, Result};

/// How long the rendezvous and each collective wait for the other ranks by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long rank 0 waits for a connection's greeting before dropping it.
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections may wait to greet at once; more are dropped as they come.
const MAX_PENDING: usize = 64;

/// How many refused connections rank 0 logs; a note says when it stops.
const MAX_LOGGED: usize = 16;

/// How many missing ranks an error names.
const NAMED_RANKS: usize = 8;

/// The connections the rendezvous made: rank 0 holds one to every other rank, the
/// others one to rank 0.
pub struct Rendezvous {
    rank: usize,
    world_size: usize,
    /// Indexed by rank on rank 0 (its own slot empty); one entry elsewhere.
    peers: Vec<Option<TcpStream>>,
}

/// `count` ranks of `ranks`, the first few named: `[1, 2, 3]`, `[1, 2, …, 8, …]`.
fn few(ranks: impl Iterator<Item = usize>, count: usize) -> String {
    let named: Vec<String> = ranks.take(NAMED_RANKS).map(|r| r.to_string()).collect();
    let more = if count > named.len() { ", …" } else { "" };
    format!("[{}{more}]", named.join(", "))
}

impl Rendezvous {
    // ANCHOR: join
    /// Meets the other ranks of `env`'s job. Rank 0 calls `make_id` once everyone has
    /// connected and sends its result to each; every rank returns it.
    pub fn join(
        env: &DistEnv,
        timeout: Duration,
        make_id: impl FnOnce() -> Result<[u8; UNIQUE_ID_BYTES]>,
    ) -> Result<(Rendezvous, [u8; UNIQUE_ID_BYTES])> {
        env.check()?;
        let deadline = Instant::now() + timeout;
        let mut rv = if env.rank == 0 {
            Rendezvous::accept_all(env, deadline)?
        } else {
            Rendezvous::connect(env, deadline)?
        };
        for s in rv.peers.iter().flatten() {
            s.set_read_timeout(Some(timeout))
                .map_err(|e| lost("a peer", e))?;
        }
        let id = if env.rank == 0 {
            let id = make_id()?;
            let mut reply = vec![0u8];
            reply.extend_from_slice(&id);
            for (r, s) in rv.peers.iter_mut().enumerate() {
                if let Some(s) = s {
                    send(s, &format!("rank {r}"), &reply)?;
                }
            }
            id
        } else {
            let reply = recv(rv.root_connection(), "rank 0", wire::MAX_REPLY_LINE_BYTES)?;
            match reply.split_first() {
                Some((0, id)) => id.try_into().map_err(|_| {
                    Error::Distributed(format!("rank 0 sent an id of {} bytes", id.len()))
                })?,
                Some((_, why)) => {
                    return Err(Error::Distributed(format!(
                        "rank {}: rank 0 refused this rank: {}",
                        env.rank,
                        wire::one_line(why)
                    )))
                }
                None => return Err(Error::Distributed("rank 0 sent an empty reply".into())),
            }
        };
        rv.barrier()?;
        Ok((rv, id))
    }
    // ANCHOR_END: join

    fn accept_all(env: &DistEnv, deadline: Instant) -> Result<Rendezvous> {
        let at = format!("{}:{}", env.master_addr, env.master_port);
        let listener = TcpListener::bind(&at)
            .map_err(|e| Error::Distributed(format!("rank 0 cannot listen on {at}: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| lost("the listener", e))?;
        let mut door = Door {
            at: at.clone(),
            token: env.job_token.clone(),
            world: env.world_size,
            pending: Vec::new(),
            logged: 0,
        };
        if env.job_token.is_none() {
            eprintln!(
                "rendezvous on {at}: {ENV_JOB_TOKEN} is not set, so this job is open: any \
                 process that reaches this port can join it as a missing rank (the \
                 launchers set it)"
            );
        }
        let mut peers: Vec<Option<TcpStream>> = (0..env.world_size).map(|_| None).collect();
        let mut missing = env.world_size - 1;
        while missing > 0 {
            let mut busy = false;
            // At most a pending table's worth per round, so that a flood of
            // connections cannot keep rank 0 from reading greetings.
            for _ in 0..MAX_PENDING {
                match listener.accept() {
                    Ok((s, from)) => {
                        busy = true;
                        door.arrive(s, from);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                        ) => {}
                    Err(e) => return Err(lost("the listener", e)),
                }
            }
            for (rank, stream) in door.greeted()? {
                busy = true;
                if peers[rank].is_some() {
                    return Err(Error::Distributed(format!(
                        "rendezvous on {at}: two processes claim rank {rank} (check RANK)"
                    )));
                }
                stream
                    .set_nonblocking(false)
                    .map_err(|e| lost(&format!("rank {rank}"), e))?;
                peers[rank] = Some(stream);
                missing -= 1;
            }
            if missing == 0 {
                break;
            }
            if Instant::now() >= deadline {
                let absent = (1..env.world_size).filter(|&r| peers[r].is_none());
                return Err(Error::Distributed(format!(
                    "rendezvous on {at} timed out: {missing} of {} ranks never connected: \
                     rank(s) {}",
                    env.world_size,
                    few(absent, missing)
                )));
            }
            if !busy {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(Rendezvous {
            rank: 0,
            world_size: env.world_size,
            peers,
        })
    }

    fn connect(env: &DistEnv, deadline: Instant) -> Result<Rendezvous> {
        let at = format!("{}:{}", env.master_addr, env.master_port);
        let mut stream = loop {
            let attempt = at
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .map(|addr| TcpStream::connect_timeout(&addr, Duration::from_millis(500)));
            match attempt {
                Some(Ok(s)) => break s,
                _ if Instant::now() >= deadline => {
                    return Err(Error::Distributed(format!(
                        "rank {}: rendezvous timed out: nothing listens on {at} (is rank 0 \
                         running?)",
                        env.rank
                    )))
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let hello = wire::greeting(env.rank, env.world_size, env.job_token.as_deref());
        send(&mut stream, "rank 0", &hello)?;
        Ok(Rendezvous {
            rank: env.rank,
            world_size: env.world_size,
            peers: vec![Some(stream)],
        })
    }

    fn root_connection(&mut self) -> &mut TcpStream {
        self.peers[0]
            .as_mut()
            .expect("a rank's connection to rank 0")
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self) -> Result<()> {
        self.gather_scatter(b"barrier".to_vec(), |_| Ok(Vec::new()))
            .map(|_| ())
    }

    /// Every rank sends `mine` to rank 0; rank 0 answers each with `answer(all)` (or
    /// the error), which every rank returns. Each message is at most
    /// [`MAX_MESSAGE_BYTES`].
    pub(crate) fn gather_scatter(
        &mut self,
        mine: Vec<u8>,
        answer: impl FnOnce(Vec<Vec<u8>>) -> std::result::Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>> {
        let too_long = |what: &str, len: usize| {
            format!(
                "{what} of {len} bytes is more than the rendezvous's limit of \
                 {MAX_MESSAGE_BYTES} bytes per message"
            )
        };
        if self.rank != 0 {
            if mine.len() as u64 > MAX_MESSAGE_BYTES {
                return Err(Error::Distributed(too_long(
                    "this rank's message",
                    mine.len(),
                )));
            }
            let root = self.root_connection();
            send(root, "rank 0", &mine)?;
            let reply = recv(root, "rank 0", MAX_MESSAGE_BYTES)?;
            return match reply.split_first() {
                Some((0, ok)) => Ok(ok.to_vec()),
                Some((_, e)) => Err(Error::Distributed(wire::one_line(e))),
                None => Err(Error::Distributed("rank 0 sent an empty reply".into())),
            };
        }
        let mut all = vec![mine];
        for (r, s) in self.peers.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().expect("rank 0 holds every peer");
            all.push(recv(s, &format!("rank {r}"), MAX_MESSAGE_BYTES)?);
        }
        let (tag, body) = match answer(all) {
            Ok(b) if b.len() as u64 >= MAX_MESSAGE_BYTES => {
                (1u8, too_long("the reply", b.len()).into_bytes())
            }
            Ok(b) => (0u8, b),
            Err(e) => (1u8, e.into_bytes()),
        };
        let mut reply = vec![tag];
        reply.extend_from_slice(&body);
        for (r, s) in self.peers.iter_mut().enumerate().skip(1) {
            send(s.as_mut().unwrap(), &format!("rank {r}"), &reply)?;
        }
        match tag {
            0 => Ok(body),
            _ => Err(Error::Distributed(String::from_utf8_lossy(&body).into())),
        }
    }
}

/// A connection that has not greeted yet: what it has sent so far.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    bytes: Vec<u8>,
    since: Instant,
}

/// What became of a pending connection after reading what it sent.
enum Step {
    Waiting,
    Greeted,
    Refused(String),
}

/// Rank 0's side of the connections that have not greeted yet.
struct Door {
    at: String,
    token: Option<String>,
    world: usize,
    pending: Vec<Pending>,
    logged: usize,
}

impl Door {
    fn arrive(&mut self, stream: TcpStream, from: SocketAddr) {
        if self.pending.len() >= MAX_PENDING {
            return self.log(
                from,
                &format!("{MAX_PENDING} connections are already waiting to greet"),
            );
        }
        if let Err(e) = stream.set_nonblocking(true) {
            return self.log(from, &e.to_string());
        }
        self.pending.push(Pending {
            stream,
            from,
            bytes: Vec::new(),
            since: Instant::now(),
        });
    }

    /// One line on stderr for a refused connection (the first few of them).
    fn log(&mut self, from: SocketAddr, why: &str) {
        self.logged += 1;
        if self.logged <= MAX_LOGGED {
            eprintln!(
                "rendezvous on {}: refused a connection from {from}: {why}",
                self.at
            );
        }
        if self.logged == MAX_LOGGED {
            eprintln!(
                "rendezvous on {}: further refused connections are not logged",
                self.at
            );
        }
    }

    /// The ranks that have greeted since the last call, with their connections;
    /// strangers refused. A rank of the job that disagrees about it (its world size,
    /// a rank beyond it) is the error.
    fn greeted(&mut self) -> Result<Vec<(usize, TcpStream)>> {
        let mut ranks = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            let outcome = read_some(&mut self.pending[i]);
            let outcome = match outcome {
                Step::Waiting if self.pending[i].since.elapsed() >= GREETING_TIMEOUT => {
                    Step::Refused(format!(
                        "sent no greeting within {GREETING_TIMEOUT:?} ({} bytes)",
                        self.pending[i].bytes.len()
                    ))
                }
                other => other,
            };
            match outcome {
                Step::Waiting => i += 1,
                Step::Refused(why) => {
                    let p = self.pending.swap_remove(i);
                    self.log(p.from, &why);
                }
                Step::Greeted => {
                    let mut p = self.pending.swap_remove(i);
                    match self.admit(&p.bytes[8..]) {
                        Ok(rank) => ranks.push((rank, p.stream)),
                        Err(Refusal::Stranger(why)) => {
                            refuse(&mut p.stream, &why);
                            self.log(p.from, &why);
                        }
                        Err(Refusal::Member(why)) => {
                            refuse(&mut p.stream, &why);
                            return Err(Error::Distributed(format!(
                                "rendezvous on {}: {why}",
                                self.at
                            )));
                        }
                    }
                }
            }
        }
        Ok(ranks)
    }

    /// The rank a greeting claims, if it carries the job's token and fits the job.
    fn admit(&self, bytes: &[u8]) -> std::result::Result<usize, Refusal> {
        let g = wire::parse_greeting(bytes).map_err(Refusal::Stranger)?;
        if !wire::same_token(self.token.as_deref(), g.token.as_deref()) {
            return Err(Refusal::Stranger(match self.token {
                Some(_) => format!(
                    "a greeting for rank {} without this job's {ENV_JOB_TOKEN}",
                    g.rank
                ),
                None => format!(
                    "rank {} gave an {ENV_JOB_TOKEN}, and rank 0 has none (set the same \
                     one for every rank, or none)",
                    g.rank
                ),
            }));
        }
        if g.world != self.world {
            return Err(Refusal::Member(format!(
                "rank {} says WORLD_SIZE={}, rank 0 says {}",
                g.rank, g.world, self.world
            )));
        }
        if g.rank == 0 || g.rank >= self.world {
            return Err(Refusal::Member(format!(
                "a peer claims rank {}, not a rank 1..{}",
                g.rank, self.world
            )));
        }
        Ok(g.rank)
    }
}

enum Refusal {
    /// Not of this job: refused, logged, and rank 0 waits on.
    Stranger(String),
    /// Of this job (it has the token) but not fitting it: the rendezvous fails.
    Member(String),
}

/// Tells a refused peer why, if it listens (never waiting for it).
fn refuse(stream: &mut TcpStream, why: &str) {
    let mut reply = vec![1u8];
    reply.extend_from_slice(why.as_bytes());
    let mut frame = (reply.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(&reply);
    let _ = stream.write(&frame);
}

/// Reads what a pending connection has sent, up to the end of its greeting.
fn read_some(p: &mut Pending) -> Step {
    let mut buf = [0u8; 512];
    loop {
        let want = if p.bytes.len() < 8 {
            8
        } else {
            let first: [u8; 8] = p.bytes[..8].try_into().unwrap();
            match wire::check_length(&first, MAX_GREETING_BYTES) {
                Ok(len) => 8 + len as usize,
                Err(why) => return Step::Refused(why),
            }
        };
        if p.bytes.len() >= 8 && p.bytes.len() == want {
            return Step::Greeted;
        }
        match p.stream.read(&mut buf[..want - p.bytes.len()]) {
            Ok(0) => {
                return Step::Refused(format!(
                    "closed the connection after {} bytes: {}",
                    p.bytes.len(),
                    wire::quote(&p.bytes)
                ))
            }
            Ok(n) => p.bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Waiting,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Step::Refused(e.to_string()),
        }
    }
}
