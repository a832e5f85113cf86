//! How the processes of a job find each other, as `torchrun` and PyTorch's TCP store
//! do: every process reads `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and
//! `MASTER_PORT`; rank 0 listens there, the others connect (retrying until a timeout),
//! rank 0 sends each the 128 bytes of NCCL's unique id, and all meet at a barrier.
//! A peer that vanishes or never comes is an error naming it, never a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::cuda::nccl::UNIQUE_ID_BYTES;
use crate::error::{Error, Result};

/// How long the rendezvous and each collective wait for the other ranks by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// One process's place in a job, from PyTorch's environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl DistEnv {
    /// Reads `RANK`, `LOCAL_RANK` (default `RANK`), `WORLD_SIZE`, `MASTER_ADDR` and
    /// `MASTER_PORT`; a missing or malformed one is an error naming it.
    pub fn from_env() -> Result<DistEnv> {
        fn var(name: &str) -> Result<String> {
            std::env::var(name).map_err(|_| {
                Error::InvalidArgument(format!(
                    "{name} is not set: start the program with a launcher (dist::launch, \
                     torchrun) or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
                ))
            })
        }
        fn number<T: std::str::FromStr>(name: &str, text: &str) -> Result<T> {
            text.trim()
                .parse()
                .map_err(|_| Error::InvalidArgument(format!("{name}={text} is not a valid number")))
        }
        let rank = number("RANK", &var("RANK")?)?;
        let local_rank = match std::env::var("LOCAL_RANK") {
            Ok(v) => number("LOCAL_RANK", &v)?,
            Err(_) => rank,
        };
        let env = DistEnv {
            rank,
            local_rank,
            world_size: number("WORLD_SIZE", &var("WORLD_SIZE")?)?,
            master_addr: var("MASTER_ADDR")?,
            master_port: number("MASTER_PORT", &var("MASTER_PORT")?)?,
        };
        if env.world_size == 0 || env.rank >= env.world_size {
            return Err(Error::InvalidArgument(format!(
                "RANK={} is not a rank of WORLD_SIZE={}",
                env.rank, env.world_size
            )));
        }
        Ok(env)
    }
}

/// The connections the rendezvous made: rank 0 holds one to every other rank, the
/// others one to rank 0.
pub struct Rendezvous {
    rank: usize,
    world_size: usize,
    /// Indexed by rank on rank 0 (its own slot empty); one entry elsewhere.
    peers: Vec<Option<TcpStream>>,
}

fn lost(who: &str, e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            Error::Distributed(format!("timed out waiting for {who}"))
        }
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            Error::Distributed(format!("{who} closed its connection (it exited or failed)"))
        }
        _ => Error::Distributed(format!("talking to {who}: {e}")),
    }
}

/// A message: its length (u64, little-endian), then its bytes.
fn send(stream: &mut TcpStream, who: &str, bytes: &[u8]) -> Result<()> {
    let mut frame = (bytes.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(bytes);
    stream.write_all(&frame).map_err(|e| lost(who, e))
}

fn recv(stream: &mut TcpStream, who: &str) -> Result<Vec<u8>> {
    let mut len = [0u8; 8];
    stream.read_exact(&mut len).map_err(|e| lost(who, e))?;
    let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
    stream.read_exact(&mut bytes).map_err(|e| lost(who, e))?;
    Ok(bytes)
}

fn hello(rank: usize, world: usize) -> Vec<u8> {
    format!("labs-rendezvous rank={rank} world={world}").into_bytes()
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
            for (r, s) in rv.peers.iter_mut().enumerate() {
                if let Some(s) = s {
                    send(s, &format!("rank {r}"), &id)?;
                }
            }
            id
        } else {
            let bytes = recv(rv.root_connection(), "rank 0")?;
            bytes.try_into().map_err(|b: Vec<u8>| {
                Error::Distributed(format!("rank 0 sent an id of {} bytes", b.len()))
            })?
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
        let mut peers: Vec<Option<TcpStream>> = (0..env.world_size).map(|_| None).collect();
        while peers.iter().skip(1).any(Option::is_none) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(|e| lost("a peer", e))?;
                    let left = deadline.saturating_duration_since(Instant::now());
                    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                        .map_err(|e| lost("a peer", e))?;
                    let text =
                        String::from_utf8_lossy(&recv(&mut s, "a connecting peer")?).to_string();
                    let rank = parse_hello(&text, env.world_size)?;
                    if peers[rank].is_some() {
                        return Err(Error::Distributed(format!(
                            "two processes claim rank {rank} (check RANK)"
                        )));
                    }
                    peers[rank] = Some(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (1..env.world_size)
                            .filter(|&r| peers[r].is_none())
                            .collect();
                        return Err(Error::Distributed(format!(
                            "rendezvous on {at} timed out: rank(s) {missing:?} of {} never \
                             connected",
                            env.world_size
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(lost("the listener", e)),
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
        send(&mut stream, "rank 0", &hello(env.rank, env.world_size))?;
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
    /// the error), which every rank returns.
    pub(crate) fn gather_scatter(
        &mut self,
        mine: Vec<u8>,
        answer: impl FnOnce(Vec<Vec<u8>>) -> std::result::Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>> {
        if self.rank != 0 {
            let root = self.root_connection();
            send(root, "rank 0", &mine)?;
            let reply = recv(root, "rank 0")?;
            return match reply.split_first() {
                Some((0, ok)) => Ok(ok.to_vec()),
                Some((_, e)) => Err(Error::Distributed(String::from_utf8_lossy(e).into())),
                None => Err(Error::Distributed("rank 0 sent an empty reply".into())),
            };
        }
        let mut all = vec![mine];
        for (r, s) in self.peers.iter_mut().enumerate().skip(1) {
            let s = s.as_mut().expect("rank 0 holds every peer");
            all.push(recv(s, &format!("rank {r}"))?);
        }
        let (tag, body) = match answer(all) {
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

fn parse_hello(text: &str, world: usize) -> Result<usize> {
    let bad = || Error::Distributed(format!("a peer sent an unexpected greeting: {text:?}"));
    let rest = text.strip_prefix("labs-rendezvous rank=").ok_or_else(bad)?;
    let (rank, their_world) = rest.split_once(" world=").ok_or_else(bad)?;
    let rank: usize = rank.parse().map_err(|_| bad())?;
    let their_world: usize = their_world.parse().map_err(|_| bad())?;
    if their_world != world {
        return Err(Error::Distributed(format!(
            "rank {rank} says WORLD_SIZE={their_world}, rank 0 says {world}"
        )));
    }
    if rank == 0 || rank >= world {
        return Err(Error::Distributed(format!(
            "a peer claims rank {rank}, not a rank 1..{world}"
        )));
    }
    Ok(rank)
}
