//! Peer access: one device reading and writing another's memory directly (NVLink or
//! PCIe peer-to-peer), the fast path of cross-device copies. Backends that cannot do
//! it say so; callers then stage copies through host memory.

use crate::device_id::DeviceId;
use crate::error::Result;

pub trait PeerAccess {
    /// Whether this device can map `peer`'s memory (`cuDeviceCanAccessPeer`).
    fn can_access_peer(&self, peer: DeviceId) -> Result<bool> {
        let _ = peer;
        Ok(false)
    }
}
