//! Peer access: one device reading another's memory directly (NVLink or PCIe
//! peer-to-peer), the fast path of cross-device copies. Backends that cannot do it say
//! so; callers then stage copies through pinned host memory.

use std::any::Any;

use super::{Backend, Stream};
use crate::device_id::{DeviceId, DevicePtr};
use crate::error::{Error, Result};

pub trait PeerAccess {
    /// Whether this device can read `peer`'s memory directly (`cuDeviceCanAccessPeer`).
    /// A device is never its own peer.
    fn can_access_peer(&self, peer: DeviceId) -> Result<bool> {
        let _ = peer;
        Ok(false)
    }

    /// Enqueues on `stream`, this device's, a copy of `bytes` from `src` on `peer` into
    /// `dst` here (`cuMemcpyPeerAsync`), enabling access to `peer` the first time
    /// (`cuCtxEnablePeerAccess`, and `grant_peer_access` both ways, once per pair).
    /// Only where `can_access_peer(peer)`.
    /// The caller orders the copy after `peer`'s pending work, and `peer`'s later
    /// work after the copy, with events.
    fn copy_from_peer(
        &self,
        dst: DevicePtr,
        peer: &dyn Backend,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let _ = (dst, src, bytes, stream);
        Err(Error::InvalidArgument(format!(
            "no peer access from {} to {}",
            stream.device(),
            peer.id()
        )))
    }

    /// Lets `peer` read and write every page of this device's memory mapped with the
    /// virtual memory API (expandable segments), now and from now on: `cuMemSetAccess`
    /// with a descriptor for `peer` on every current mapping, and one on every later
    /// one beside this device's own. Such memory is reachable only by the devices its
    /// access descriptors name, which `cuCtxEnablePeerAccess` does not change: without
    /// this a peer copy of it cannot read or write it directly. Granting twice is
    /// granting once. `copy_from_peer` grants both ways the first time a pair copies.
    fn grant_peer_access(&self, peer: DeviceId) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "{peer} cannot be granted access to the memory of a device without peer access"
        )))
    }

    /// The devices granted access to this device's mapped memory, in the order granted.
    fn granted_peers(&self) -> Vec<DeviceId> {
        Vec::new()
    }

    /// The backend's own type, to reach a peer's internals (its context, its memory).
    fn as_any(&self) -> &dyn Any;
}
