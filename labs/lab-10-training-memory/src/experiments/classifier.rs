//! `lab-10 classifier`: what GPT-2 small's step keeps at its peak with the classifier as
//! written (the logits, then `cross_entropy`) and with the fused classifier
//! (`train --fused-classifier --classifier-chunk ROWS`) at several chunk sizes, by dry
//! run at the chapter's sizes (8 x 1024, bfloat16 autocast, AdamW): the peak allocated,
//! the activations and temporaries at the peak, and the saving against the first row.

use anyhow::{Context, Result};
use labs_core::table::Table;
use labs_core::Device;

use super::configs::{configurations, Scale};
use super::tables::mib;

/// The chunk sizes compared, in rows (positions); 8,192 is every row of the batch at once.
pub const CHUNKS: [usize; 5] = [512, 1024, 2048, 4096, 8192];

/// One dry run's figures: the peak allocated and its activations and temporaries.
struct Peak {
    allocated: u64,
    activation: u64,
    temporary: u64,
}

/// The table, each run on a fresh dry device prepared by `prepare` (the GPU's cuBLAS
/// workspace, say).
pub fn table(prepare: impl Fn(&Device) -> Result<()>) -> Result<Table> {
    let base = configurations(Scale::Full)
        .into_iter()
        .find(|c| c.name == "gpt2-bf16")
        .context("the chapter's GPT-2 bf16 configuration")?
        .train_config()?;
    let run = |fused: Option<usize>| -> Result<Peak> {
        let config = labs_train::TrainConfig {
            fused_classifier: fused,
            ..base.clone()
        };
        let dry = Device::new_dry(1 << 40);
        prepare(&dry)?;
        let report = labs_train::run(&config, &dry)?;
        let category = |name: &str| report.by_category.get(name).copied().unwrap_or(0);
        Ok(Peak {
            allocated: report.peak_allocated,
            activation: category("activation"),
            temporary: category("temporary"),
        })
    };
    let mut table = Table::new(
        "GPT-2 small's classifier (8 x 1024, bf16 autocast, AdamW): the dry run's peak allocated, and the activations and temporaries at it, as written and fused in chunks of rows",
        &["classifier", "alloc MiB", "activation MiB", "temporary MiB", "saving"],
    );
    let written = run(None)?;
    let mut row = |label: String, p: &Peak| {
        let saving = 1.0 - p.allocated as f64 / written.allocated as f64;
        table.row([
            label,
            mib(p.allocated),
            mib(p.activation),
            mib(p.temporary),
            format!("{:+.1}%", 100.0 * saving),
        ]);
    };
    row("as written".into(), &written);
    for rows in CHUNKS {
        row(format!("fused, {rows} rows"), &run(Some(rows))?);
    }
    Ok(table)
}
