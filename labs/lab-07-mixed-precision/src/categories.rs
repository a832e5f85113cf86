//! Experiment 2: where the memory goes under AMP. The allocator counts every block in
//! a category (parameters, gradients, optimizer state, activations saved for backward,
//! temporaries, the autocast cache): the bytes of each, at their peak during one step,
//! in float32 and under autocast. Autocast halves the activations; the parameters (the
//! float32 master weights), their gradients and Adam's two moments stay float32, and
//! the cast cache adds a half-precision copy of every weight.

use labs_core::alloc::Category;
use labs_core::table::Table;
use labs_core::{Device, Result};

use crate::mib;
use crate::model::{batch, Precision, Sizes, Trainer};

/// Peak bytes per category (in [`Category::ALL`] order) during one step.
pub fn measure_one(device: &Device, s: Sizes, precision: Precision) -> Result<Vec<u64>> {
    let alloc = device.allocator()?;
    let mut t = Trainer::new(device, s, precision, 1)?;
    let (x, y) = batch(device, s, 0)?;
    t.step(&x, &y)?; // Adam's state exists from here on
    device.synchronize()?;
    alloc.reset_peak_stats();
    t.step(&x, &y)?;
    Ok(alloc
        .memory_by_category()
        .into_iter()
        .map(|(_, stat)| stat.peak)
        .collect())
}

pub fn measure(device: &Device, s: Sizes) -> Result<Vec<(Precision, Vec<u64>)>> {
    Precision::ALL
        .iter()
        .map(|&p| Ok((p, measure_one(device, s, p)?)))
        .collect()
}

pub fn table(device: &Device, s: Sizes, rows: &[(Precision, Vec<u64>)]) -> Table {
    let mut headers = vec!["category"];
    headers.extend(rows.iter().map(|(p, _)| p.name()));
    let mut t = Table::new(
        format!(
            "2. Where the memory goes on {device}: the peak of each allocation category during \
             one step (MiB), the MLP of table 1 ({} wide, batch {})",
            s.width, s.batch
        ),
        &headers,
    );
    for c in Category::ALL {
        if c == Category::Input || c == Category::Other {
            continue; // the batch is made outside the step; nothing is raw
        }
        let mut cells = vec![c.name().to_string()];
        cells.extend(rows.iter().map(|(_, peaks)| mib(peaks[c.index()])));
        t.row(cells);
    }
    t
}
