//! Where the ranks of a simulated group meet when they are threads of one process
//! ([`sim_group`]): an [`Exchange`] that returns every rank's input to a collective once
//! all have arrived. The transport around it (reading each rank's input back from its
//! device, computing its output, writing it) is the simulated GPU's; the rendezvous's
//! TCP exchange (`process_group.rs`) serves one process per rank.
//!
//! Dry runs (`dry:N`) form groups too: their ranks meet and are checked, no data moves.
//!
//! The exchange checks what NCCL trusts: that every rank called the same collective with
//! the same count and dtype. Ranks that disagree, a rank that drops its communicator
//! and a rank that never comes are errors on every other rank, never a hang.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use labs_base::clock::Instant;

use super::communicator::Communicator;
use super::rendezvous::DEFAULT_TIMEOUT;
use crate::device::{Device, DeviceId, Exchange, Inputs};
use crate::error::{Error, Result};

/// The ranks' deposits to one collective.
struct Round {
    deposits: Vec<Option<(String, Vec<u8>)>>,
    outcome: Option<std::result::Result<Inputs, String>>,
    collected: usize,
}

struct State {
    rounds: HashMap<u64, Round>,
    left: Vec<bool>,
}

/// The exchange of ranks on threads of one process.
struct InProcess {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    arrived: Condvar,
}

/// Every rank's call, when they differ: the error each of them reports, one line that
/// names the first few calls (ranks that made the same call together) and counts the
/// ranks of the rest.
pub(crate) fn mismatch(seq: u64, deposits: &[Option<(String, Vec<u8>)>]) -> Option<String> {
    const CALLS_NAMED: usize = 4;
    const RANKS_NAMED: usize = 4;
    let first = &deposits[0].as_ref()?.0;
    if deposits.iter().flatten().all(|(s, _)| s == first) {
        return None;
    }
    let mut calls: Vec<(&str, Vec<usize>)> = Vec::new();
    for (r, d) in deposits.iter().enumerate() {
        let Some((s, _)) = d else { continue };
        match calls.iter_mut().find(|(c, _)| c == s) {
            Some((_, ranks)) => ranks.push(r),
            None => calls.push((s, vec![r])),
        }
    }
    let mut named: Vec<String> = calls
        .iter()
        .take(CALLS_NAMED)
        .map(|(call, ranks)| match ranks.as_slice() {
            [one] => format!("rank {one} called {call}"),
            _ => {
                let shown: Vec<String> = ranks
                    .iter()
                    .take(RANKS_NAMED)
                    .map(usize::to_string)
                    .collect();
                let more = if ranks.len() > RANKS_NAMED {
                    ", …"
                } else {
                    ""
                };
                format!(
                    "ranks {}{more} ({}) called {call}",
                    shown.join(", "),
                    ranks.len()
                )
            }
        })
        .collect();
    if calls.len() > CALLS_NAMED {
        let rest: usize = calls[CALLS_NAMED..].iter().map(|(_, r)| r.len()).sum();
        named.push(format!(
            "{rest} more ranks made {} other calls",
            calls.len() - CALLS_NAMED
        ));
    }
    Some(format!(
        "collective #{seq} differs across ranks: {}",
        named.join(", ")
    ))
}

impl Exchange for InProcess {
    fn exchange(&self, rank: usize, seq: u64, signature: &str, input: Vec<u8>) -> Result<Inputs> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.state.lock().unwrap();
        let world = self.world;
        let round = st.rounds.entry(seq).or_insert_with(|| Round {
            deposits: vec![None; world],
            outcome: None,
            collected: 0,
        });
        round.deposits[rank] = Some((signature.to_string(), input));
        if round.deposits.iter().all(Option::is_some) {
            round.outcome = Some(match mismatch(seq, &round.deposits) {
                Some(e) => Err(e),
                None => Ok(Arc::new(
                    round
                        .deposits
                        .iter_mut()
                        .map(|d| d.take().unwrap().1)
                        .collect(),
                )),
            });
            self.arrived.notify_all();
        }
        loop {
            let round = st
                .rounds
                .get_mut(&seq)
                .expect("a round lives until collected");
            if let Some(outcome) = round.outcome.clone() {
                round.collected += 1;
                if round.collected == world {
                    st.rounds.remove(&seq);
                }
                return outcome.map_err(Error::Distributed);
            }
            let missing: Vec<usize> = (0..world)
                .filter(|&r| round.deposits[r].is_none())
                .collect();
            if let Some(gone) = missing.iter().find(|&&r| st.left[r]) {
                return Err(Error::Distributed(format!(
                    "rank {rank}: {signature} (collective #{seq}) cannot finish: rank {gone} \
                     left the group before calling it"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Distributed(format!(
                    "rank {rank}: {signature} (collective #{seq}) timed out after {:?} \
                     waiting for rank(s) {missing:?}",
                    self.timeout
                )));
            }
            st = self.arrived.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    fn leave(&self, rank: usize) {
        self.state.lock().unwrap().left[rank] = true;
        self.arrived.notify_all();
    }
}

/// A communicator per simulated GPU, rank `i` on `devices[i]`, meeting in this process:
/// hand each to its own thread. Collectives wait at most [`DEFAULT_TIMEOUT`] for the
/// other ranks.
pub fn sim_group(devices: &[Device]) -> Result<Vec<Communicator>> {
    sim_group_with_timeout(devices, DEFAULT_TIMEOUT)
}

/// [`sim_group`], with how long a collective waits for the other ranks.
pub fn sim_group_with_timeout(devices: &[Device], timeout: Duration) -> Result<Vec<Communicator>> {
    check_sim_devices(devices)?;
    let world = devices.len();
    let exchange: Arc<dyn Exchange> = Arc::new(InProcess {
        world,
        timeout,
        state: Mutex::new(State {
            rounds: HashMap::new(),
            left: vec![false; world],
        }),
        arrived: Condvar::new(),
    });
    devices
        .iter()
        .enumerate()
        .map(|(rank, d)| {
            let transport = d.comm_exchange(rank, world, exchange.clone())?;
            Communicator::new(rank, world, d.clone(), transport)
        })
        .collect()
}

/// Rank 0 of a dry-run group of `world` ranks that do what it does: the other ranks are
/// not run, and each collective returns at once as if they had called it too. A dry
/// run moves no data, so rank 0's memory is that of a full group's rank 0 (a test holds
/// it): one rank's prediction where threads are not at hand (the book's calculator, in
/// the browser).
pub fn dry_lone_rank(device: &Device, world: usize) -> Result<Communicator> {
    if !device.is_dry() {
        return Err(Error::InvalidArgument(format!(
            "dry_lone_rank: {} is not a dry-run device; the other ranks of a group that \
             computes must run",
            device.id()
        )));
    }
    if world == 0 {
        return Err(Error::InvalidArgument(
            "dry_lone_rank: a group has at least one rank".into(),
        ));
    }
    let exchange: Arc<dyn Exchange> = Arc::new(Lone { world });
    let transport = device.comm_exchange(0, world, exchange)?;
    Communicator::new(0, world, device.clone(), transport)
}

/// The exchange of [`dry_lone_rank`]: every rank's input is rank 0's.
struct Lone {
    world: usize,
}

impl Exchange for Lone {
    fn exchange(
        &self,
        _rank: usize,
        _seq: u64,
        _signature: &str,
        input: Vec<u8>,
    ) -> Result<Inputs> {
        Ok(Arc::new(vec![input; self.world]))
    }

    fn leave(&self, _rank: usize) {}
}

/// Distinct simulated GPUs (or distinct dry runs), at least one.
fn check_sim_devices(devices: &[Device]) -> Result<()> {
    if devices.is_empty() {
        return Err(Error::InvalidArgument(
            "sim_group: a group needs at least one device".into(),
        ));
    }
    for (i, d) in devices.iter().enumerate() {
        let same_kind = matches!(
            (devices[0].id(), d.id()),
            (DeviceId::Sim(_), DeviceId::Sim(_)) | (DeviceId::Dry(_), DeviceId::Dry(_))
        );
        if !same_kind {
            return Err(Error::InvalidArgument(format!(
                "sim_group: {} cannot join a group of {}: a group is of simulated GPUs \
                 (sim:N) or of dry runs (dry:N); GPUs use nccl_group",
                d.id(),
                devices[0].id()
            )));
        }
        if devices[..i].iter().any(|o| o.id() == d.id()) {
            return Err(Error::InvalidArgument(format!(
                "sim_group: {} is listed twice; each rank needs its own device",
                d.id()
            )));
        }
    }
    Ok(())
}
