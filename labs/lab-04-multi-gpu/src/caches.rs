//! Experiment 2: one caching allocator per device. A tensor of a different size on
//! each device shows up in that device's statistics only; freed, it stays cached on its
//! device; `empty_cache` on the first device returns the first device's cache and
//! leaves every other device's as it was.

use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

/// One device's allocator at each moment of the experiment.
#[derive(Debug, Clone)]
pub struct Row {
    pub device: String,
    pub tensor: u64,
    pub allocated: u64,
    pub reserved: u64,
    /// Reserved once the tensors are gone: the cache.
    pub cached: u64,
    /// Reserved after the first device's `empty_cache`.
    pub after_empty: u64,
}

/// The tensor on device `i`: `(i + 1) * unit` bytes.
pub fn measure(devices: &[Device], unit: usize) -> Result<Vec<Row>> {
    for d in devices {
        d.allocator()?.empty_cache()?;
    }
    let tensors = devices
        .iter()
        .enumerate()
        .map(|(i, d)| Tensor::zeros(&[(i + 1) * unit / 4], DType::F32, d))
        .collect::<Result<Vec<_>>>()?;
    let mut rows = Vec::new();
    for (d, t) in devices.iter().zip(&tensors) {
        let a = d.allocator()?;
        rows.push(Row {
            device: d.id().to_string(),
            tensor: t.nbytes() as u64,
            allocated: a.memory_allocated(),
            reserved: a.memory_reserved(),
            cached: 0,
            after_empty: 0,
        });
    }
    drop(tensors);
    for (d, row) in devices.iter().zip(&mut rows) {
        row.cached = d.allocator()?.memory_reserved();
    }
    devices[0].allocator()?.empty_cache()?;
    for (d, row) in devices.iter().zip(&mut rows) {
        row.after_empty = d.allocator()?.memory_reserved();
    }
    Ok(rows)
}

pub fn table(rows: &[Row]) -> Table {
    let first = rows.first().map_or("", |r| r.device.as_str());
    let mut t = Table::new(
        format!(
            "2. One caching allocator per device (MiB): a tensor on each, then freed, then \
             empty_cache() on {first} only"
        ),
        &[
            "device",
            "tensor",
            "allocated",
            "reserved",
            "freed: reserved",
            format!("after {first}'s empty_cache: reserved").as_str(),
        ],
    );
    for r in rows {
        t.row([
            r.device.clone(),
            crate::mib(r.tensor),
            crate::mib(r.allocated),
            crate::mib(r.reserved),
            crate::mib(r.cached),
            crate::mib(r.after_empty),
        ]);
    }
    t
}
