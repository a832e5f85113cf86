//! Peer access between simulated GPUs: direct copies from one's memory into
//! another's, and the GPU's bookkeeping of which devices may use mapped memory (each
//! page's access list, `cuMemSetAccess`), so that the allocator's expandable segments
//! reach a peer exactly when they would on GPUs.

use std::sync::Arc;

use super::SimBackend;
use crate::backend::prelude::*;
use crate::backend::{DeviceId, DevicePtr, Stream};
use crate::error::{Error, Result};

// ANCHOR: sim_peer
/// Environment variable turning the simulated GPUs' peer access off (`0`), so that
/// copies between them take the staged path a GPU without peer access takes.
pub const ENV_SIM_PEER: &str = "LABS_SIM_PEER";

/// Simulated GPUs all live in the host's memory, so each can always reach another's
/// (of its own kind: a dry run has no values to give a simulated GPU), unless
/// `LABS_SIM_PEER=0` says to behave like GPUs without peer access.
impl PeerAccess for SimBackend {
    fn can_access_peer(&self, peer: DeviceId) -> Result<bool> {
        let same_kind = matches!(
            (self.id, peer),
            (DeviceId::Sim(_), DeviceId::Sim(_)) | (DeviceId::Dry(_), DeviceId::Dry(_))
        );
        let disabled = std::env::var(ENV_SIM_PEER).is_ok_and(|v| v.trim() == "0");
        Ok(same_kind && peer != self.id && !disabled)
    }

    fn copy_from_peer(
        &self,
        dst: DevicePtr,
        peer: &dyn Backend,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        stream.check_device(self.id)?;
        let other = peer
            .as_any()
            .downcast_ref::<SimBackend>()
            .filter(|o| o.dry == self.dry && !o.inline && !self.inline)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("a peer copy from {} to {}", peer.id(), self.id))
            })?;
        // Either side's copy engine may read or write the other's memory: both
        // ways, once (later copies find both granted). A dry run comes here for
        // staged copies too, which need no access.
        if self.can_access_peer(other.id)? {
            other.grant_peer_access(self.id)?;
            self.grant_peer_access(other.id)?;
        }
        if self.dry {
            other.memory.check_range(src, bytes)?;
            return self.memory.check_range(dst, bytes);
        }
        let from = other.memory.clone();
        // Two copies in opposite directions at once must not each hold one memory's
        // allocation while waiting for the other's: both lock in one global order.
        let source_first = Arc::as_ptr(&from) < Arc::as_ptr(&self.memory);
        self.enqueue(stream, move |to| {
            let copy = |s: &[*mut u8], d: &[*mut u8]| unsafe {
                std::ptr::copy_nonoverlapping(s[0], d[0], bytes)
            };
            if source_first {
                from.access(&[(src, bytes)], |s| {
                    to.access(&[(dst, bytes)], |d| copy(s, d))
                })?
            } else {
                to.access(&[(dst, bytes)], |d| {
                    from.access(&[(src, bytes)], |s| copy(s, d))
                })?
            }
        })
    }

    fn grant_peer_access(&self, peer: DeviceId) -> Result<()> {
        if !self.can_access_peer(peer)? {
            return Err(Error::InvalidArgument(format!(
                "{peer} cannot be granted access to the memory of {}: only another \
                 simulated GPU of its kind can, with peer access on (LABS_SIM_PEER)",
                self.id
            )));
        }
        let mut granted = self.granted.lock().unwrap();
        if !granted.contains(&peer) {
            self.memory.grant_mapped(peer);
            granted.push(peer);
        }
        Ok(())
    }

    fn granted_peers(&self) -> Vec<DeviceId> {
        self.granted.lock().unwrap().clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
// ANCHOR_END: sim_peer
