//! Experiment 1: the devices. Each one's name and memory, and which of the others it
//! reaches directly (peer access), the question that decides how copies between them
//! travel.

use labs_core::table::Table;
use labs_core::{Device, Result};

/// One device: what it says about itself and about the others.
#[derive(Debug, Clone)]
pub struct Row {
    pub device: String,
    pub name: String,
    pub total: u64,
    pub free: u64,
    /// The other devices it can read directly.
    pub peers: Vec<String>,
}

pub fn measure(devices: &[Device]) -> Result<Vec<Row>> {
    devices
        .iter()
        .map(|d| {
            let props = d.properties()?;
            let info = d.mem_info()?;
            let mut peers = Vec::new();
            for other in devices {
                if d.can_access_peer(other)? {
                    peers.push(other.id().to_string());
                }
            }
            Ok(Row {
                device: d.id().to_string(),
                name: props.name,
                total: info.total,
                free: info.free,
                peers,
            })
        })
        .collect()
}

pub fn table(rows: &[Row]) -> Table {
    let mut t = Table::new(
        format!("1. The devices ({})", rows.len()),
        &["device", "name", "total MiB", "free MiB", "peer access to"],
    );
    for r in rows {
        let peers = if r.peers.is_empty() {
            "none".to_string()
        } else {
            r.peers.join(", ")
        };
        t.row([
            r.device.clone(),
            r.name.clone(),
            crate::mib(r.total),
            crate::mib(r.free),
            peers,
        ]);
    }
    t
}
