//! A process's place in a job, from the environment a launcher gives each rank:
//! PyTorch's `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, and
//! `LABS_JOB_TOKEN`, the secret that admits the job's ranks to its rendezvous.

use crate::error::{Error, Result};

/// The environment variable holding the job's token: the launchers ([`launch`],
/// `lab-04 launch`, `lab-10 train --nproc`) make a random one per job and give it to
/// every rank; a job started otherwise (`torchrun`, by hand) sets the same value in
/// every rank's environment. Rank 0 admits only greetings that carry its token, compared
/// in constant time. Unset (or empty) everywhere, the job is open: rank 0 admits the
/// greetings without a token, from whichever process reaches its port, and warns so on
/// stderr; a rank with a token and a rank 0 without one (or the reverse) do not meet.
///
/// [`launch`]: super::launch
pub const ENV_JOB_TOKEN: &str = "LABS_JOB_TOKEN";

/// The largest `WORLD_SIZE` (and so the largest `RANK` + 1) a job may have.
pub const MAX_WORLD_SIZE: usize = 65_536;

/// The longest job token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 128;

/// One process's place in a job, from PyTorch's environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// The job's token (`LABS_JOB_TOKEN`); `None` makes an open job, which any process
    /// that reaches rank 0's port can join as a missing rank (rank 0 warns of it).
    pub job_token: Option<String>,
}

impl DistEnv {
    /// A place in a job of `world_size` ranks meeting at `master_addr:master_port`,
    /// with `rank` as its local rank and `job_token` as its token; checked as
    /// [`DistEnv::check`] does.
    pub fn new(
        rank: usize,
        world_size: usize,
        master_addr: &str,
        master_port: u16,
        job_token: Option<String>,
    ) -> Result<DistEnv> {
        let env = DistEnv {
            rank,
            local_rank: rank,
            world_size,
            master_addr: master_addr.to_string(),
            master_port,
            job_token,
        };
        env.check()?;
        Ok(env)
    }

    /// Reads `RANK`, `LOCAL_RANK` (default `RANK`), `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT` and `LABS_JOB_TOKEN` ([`ENV_JOB_TOKEN`]; unset or empty makes an
    /// open job); a missing, malformed or out-of-range one is an error naming it.
    /// `WORLD_SIZE` is at most [`MAX_WORLD_SIZE`], the token at most
    /// [`MAX_TOKEN_BYTES`] printable characters without spaces.
    pub fn from_env() -> Result<DistEnv> {
        DistEnv::from_vars(|name| std::env::var(name).ok())
    }

    /// [`DistEnv::from_env`], with the variables looked up by `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<DistEnv> {
        let var = |name: &str| {
            get(name).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{name} is not set: start the program with a launcher (dist::launch, \
                     torchrun) or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
                ))
            })
        };
        fn number<T: std::str::FromStr>(name: &str, text: &str) -> Result<T> {
            text.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!(
                    "{name}={} is not a valid number",
                    crate::format::quote(text)
                ))
            })
        }
        let rank = number("RANK", &var("RANK")?)?;
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", &v)?,
            None => rank,
        };
        let job_token = get(ENV_JOB_TOKEN).filter(|t| !t.is_empty());
        let env = DistEnv {
            rank,
            local_rank,
            world_size: number("WORLD_SIZE", &var("WORLD_SIZE")?)?,
            master_addr: var("MASTER_ADDR")?,
            master_port: number("MASTER_PORT", &var("MASTER_PORT")?)?,
            job_token,
        };
        env.check()?;
        Ok(env)
    }

    /// That the world size, the ranks, the address and the token are within bounds:
    /// the rendezvous sizes its tables by the world size only after this.
    pub fn check(&self) -> Result<()> {
        if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            return Err(Error::InvalidArgument(format!(
                "WORLD_SIZE={} is out of range: a job has 1 to {MAX_WORLD_SIZE} ranks",
                self.world_size
            )));
        }
        if self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "RANK={} is not a rank of WORLD_SIZE={} (ranks are 0 to {})",
                self.rank,
                self.world_size,
                self.world_size - 1
            )));
        }
        if self.local_rank >= MAX_WORLD_SIZE {
            return Err(Error::InvalidArgument(format!(
                "LOCAL_RANK={} is out of range: at most {}",
                self.local_rank,
                MAX_WORLD_SIZE - 1
            )));
        }
        if self.master_addr.is_empty() || self.master_addr.len() > 255 {
            return Err(Error::InvalidArgument(format!(
                "MASTER_ADDR={} is not a host name or address (1 to 255 characters)",
                crate::format::quote(&self.master_addr)
            )));
        }
        if let Some(token) = &self.job_token {
            check_token(token)?;
        }
        Ok(())
    }
}

/// A token of 1 to [`MAX_TOKEN_BYTES`] printable ASCII characters, no spaces.
fn check_token(token: &str) -> Result<()> {
    let printable = token.bytes().all(|b| b.is_ascii_graphic());
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES || !printable {
        return Err(Error::InvalidArgument(format!(
            "{ENV_JOB_TOKEN} ({} bytes) is not a token: expected 1 to {MAX_TOKEN_BYTES} \
             printable characters without spaces",
            token.len()
        )));
    }
    Ok(())
}

/// A new random job token: 128 bits from the system's random source, as 32 hex digits.
pub fn new_job_token() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let from_urandom = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !from_urandom {
        // Each RandomState is seeded from the system's randomness (and a counter).
        use std::hash::{BuildHasher, Hasher};
        for half in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            h.write_u128(now.map_or(0, |d| d.as_nanos()));
            h.write_u32(std::process::id());
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
