//! A process's communicator in a job (PyTorch's `init_process_group`, `env://`): the
//! rendezvous, then NCCL on GPUs, or on simulated GPUs the rendezvous's own connections
//! carrying the collectives' data: each rank sends its input to rank 0, which returns
//! every rank's input to each (a star, slow and simple; the simulator's arithmetic is
//! the point, not its speed).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::communicator::Communicator;
use super::env::DistEnv;
use super::rendezvous::{Rendezvous, DEFAULT_TIMEOUT};
use crate::device::{
    device_count, Device, DeviceId, DeviceKind, Exchange, Inputs, ENV_DEVICE, UNIQUE_ID_BYTES,
};
use crate::error::{Error, Result};

/// The simulator's exchange over the rendezvous's connections, through rank 0.
struct TcpExchange {
    rendezvous: Mutex<Rendezvous>,
}

impl Exchange for TcpExchange {
    fn exchange(&self, _rank: usize, seq: u64, signature: &str, input: Vec<u8>) -> Result<Inputs> {
        // Each message: the signature, a zero byte, the input.
        let mut mine = signature.as_bytes().to_vec();
        mine.push(0);
        mine.extend_from_slice(&input);
        let reply = self
            .rendezvous
            .lock()
            .unwrap()
            .gather_scatter(mine, |all| {
                let mut sigs = Vec::new();
                let mut inputs = Vec::new();
                for m in all {
                    let cut = m.iter().position(|&b| b == 0).unwrap_or(m.len());
                    sigs.push(Some((
                        String::from_utf8_lossy(&m[..cut]).to_string(),
                        Vec::new(),
                    )));
                    inputs.push(m[(cut + 1).min(m.len())..].to_vec());
                }
                if let Some(e) = super::in_process::mismatch(seq, &sigs) {
                    return Err(e);
                }
                // Every input, each prefixed by its length.
                let mut out = Vec::new();
                for i in inputs {
                    out.extend_from_slice(&(i.len() as u64).to_le_bytes());
                    out.extend_from_slice(&i);
                }
                Ok(out)
            })?;
        let world = self.rendezvous.lock().unwrap().world_size();
        let mut inputs = Vec::new();
        let mut rest = reply.as_slice();
        while rest.len() >= 8 {
            let (len, tail) = rest.split_at(8);
            let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
            if len > tail.len() {
                break;
            }
            inputs.push(tail[..len].to_vec());
            rest = &tail[len..];
        }
        if inputs.len() != world || !rest.is_empty() {
            return Err(Error::Distributed(format!(
                "collective #{seq}: rank 0 sent a malformed reply"
            )));
        }
        Ok(Arc::new(inputs))
    }

    /// Dropping the connections is the leaving: peers see them close.
    fn leave(&self, _rank: usize) {}
}

/// How [`init_process_group_with`] joins its job.
#[derive(Debug, Clone)]
pub struct ProcessGroupOptions {
    /// How long the rendezvous and each collective on the simulator wait for the others.
    pub timeout: Duration,
    /// This rank's device; by default `cuda:LOCAL_RANK` (or `sim:LOCAL_RANK` when
    /// `LABS_DEVICE` names the simulator or there is no GPU, `dry:LOCAL_RANK` when it
    /// names a dry run).
    pub device: Option<Device>,
    /// The job and this process's place in it; by default read from the environment
    /// ([`DistEnv::from_env`]). Ranks on threads of one process (tests) give their own.
    pub env: Option<DistEnv>,
}

/// Seconds the rendezvous (and each collective on the simulator) waits for the other
/// ranks, when set: a job over several machines sets it on every one.
pub const ENV_DIST_TIMEOUT: &str = "LABS_DIST_TIMEOUT";

impl Default for ProcessGroupOptions {
    /// The timeout is `LABS_DIST_TIMEOUT` seconds where that is a positive number, else
    /// [`DEFAULT_TIMEOUT`].
    fn default() -> Self {
        let timeout = env_timeout().ok().flatten().unwrap_or(DEFAULT_TIMEOUT);
        ProcessGroupOptions {
            timeout,
            device: None,
            env: None,
        }
    }
}

/// `LABS_DIST_TIMEOUT`, if set: a positive number of seconds, else an error naming it.
fn env_timeout() -> Result<Option<Duration>> {
    let Ok(text) = std::env::var(ENV_DIST_TIMEOUT) else {
        return Ok(None);
    };
    match text.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => Ok(Some(Duration::from_secs_f64(t))),
        _ => Err(Error::InvalidArgument(format!(
            "{ENV_DIST_TIMEOUT}={} is not a timeout: give seconds, more than 0 and at most \
             86400",
            crate::format::quote(&text)
        ))),
    }
}

/// This process's communicator in the job its environment describes (PyTorch's
/// `init_process_group` with the `env://` method), with the default options.
pub fn init_process_group() -> Result<Communicator> {
    init_process_group_with(ProcessGroupOptions::default())
}

// ANCHOR: init_process_group
/// [`init_process_group`] with options: NCCL on GPUs (rank 0's unique id sent by the
/// rendezvous), the rendezvous's own connections on simulated GPUs.
pub fn init_process_group_with(options: ProcessGroupOptions) -> Result<Communicator> {
    env_timeout()?;
    let env = match options.env {
        Some(env) => env,
        None => DistEnv::from_env()?,
    };
    let device = match options.device {
        Some(d) => d,
        None => Device::get(default_device(env.local_rank)?)?,
    };
    let (rank, world) = (env.rank, env.world_size);
    if device.is_cuda() {
        let (_rendezvous, id) =
            Rendezvous::join(&env, options.timeout, || device.comm_unique_id())?;
        return super::nccl::nccl_rank(&device, rank, world, &id);
    }
    if !matches!(device.id(), DeviceId::Sim(_) | DeviceId::Dry(_)) {
        return Err(Error::InvalidArgument(format!(
            "init_process_group: {} cannot join a process group (use cuda, sim or dry)",
            device.id()
        )));
    }
    let (rendezvous, _) = Rendezvous::join(&env, options.timeout, || Ok([0; UNIQUE_ID_BYTES]))?;
    let exchange = Arc::new(TcpExchange {
        rendezvous: Mutex::new(rendezvous),
    });
    let transport = device.comm_exchange(rank, world, exchange)?;
    Communicator::new(rank, world, device, transport)
}
// ANCHOR_END: init_process_group

/// `cuda:LOCAL_RANK`, or `sim:LOCAL_RANK` (`dry:LOCAL_RANK`) where `LABS_DEVICE` names
/// the simulator (a dry run) or no GPU is present.
fn default_device(local_rank: usize) -> Result<DeviceId> {
    let named = std::env::var(ENV_DEVICE)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let kind = match named {
        Some(text) => text.parse::<DeviceId>()?,
        None => match device_count(DeviceKind::Cuda) {
            Ok(n) if n > 0 => DeviceId::Cuda(0),
            _ => DeviceId::Sim(0),
        },
    };
    Ok(match kind {
        DeviceId::Cuda(_) => DeviceId::Cuda(local_rank),
        DeviceId::Sim(_) => DeviceId::Sim(local_rank),
        DeviceId::Dry(_) => DeviceId::Dry(local_rank),
        DeviceId::Cpu => DeviceId::Cpu,
    })
}
