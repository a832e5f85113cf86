//! `summary`: a snapshot's figures as a table for people or one JSON object for
//! scripts.

use labs_core::format::bytes;
use labs_core::snapshot::{Snapshot, SourceFormat, Summary};
use labs_core::table::Table;

/// The summary as one JSON object (the figures of [`Summary`], plus where they came
/// from).
pub fn json(summary: &Summary, format: SourceFormat) -> serde_json::Value {
    let mut v = serde_json::to_value(summary).expect("a summary always serialises");
    v["source"] = match format {
        SourceFormat::Json => "labs-json",
        SourceFormat::PyTorchPickle => "pytorch-pickle",
    }
    .into();
    v
}

/// The summary as tables: totals, then one line per segment.
pub fn tables(snapshot: &Snapshot, summary: &Summary) -> Vec<Table> {
    let mut totals = Table::new("Memory snapshot", &["", "value"]);
    let s = summary;
    totals
        .row([
            "segments (small / large)".to_string(),
            format!(
                "{} ({} / {})",
                s.segments, s.small_segments, s.large_segments
            ),
        ])
        .row(["reserved".to_string(), bytes(s.reserved_bytes)])
        .row([
            "allocated (active_allocated blocks)".to_string(),
            bytes(s.allocated_bytes),
        ])
        .row([
            "requested by the program".to_string(),
            bytes(s.requested_bytes),
        ])
        .row([
            "cached (inactive blocks)".to_string(),
            format!(
                "{} in {} blocks",
                bytes(s.inactive_bytes),
                s.inactive_blocks
            ),
        ])
        .row([
            "largest cached block".to_string(),
            bytes(s.largest_inactive_block),
        ])
        .row([
            "pending free".to_string(),
            format!(
                "{} in {} blocks",
                bytes(s.pending_free_bytes),
                s.pending_free_blocks
            ),
        ])
        .row(["active blocks".to_string(), s.active_blocks.to_string()])
        .row([
            "trace events (allocs / frees / segment allocs / OOMs)".to_string(),
            format!(
                "{} ({} / {} / {} / {})",
                s.trace_events, s.trace_allocs, s.trace_frees, s.trace_segment_allocs, s.trace_ooms
            ),
        ])
        .row([
            "peak requested over the trace".to_string(),
            bytes(s.trace_peak_requested_bytes),
        ]);

    let mut segments = Table::new(
        "Segments",
        &[
            "device",
            "address",
            "pool",
            "size",
            "allocated",
            "blocks",
            "active",
        ],
    );
    for g in &snapshot.segments {
        let active = g
            .blocks
            .iter()
            .filter(|b| b.state == labs_core::snapshot::BlockState::ActiveAllocated)
            .count();
        segments.row([
            g.device.to_string(),
            format!("{:#x}", g.address),
            format!(
                "{:?}{}",
                g.segment_type,
                if g.is_expandable { " (expandable)" } else { "" }
            )
            .to_lowercase(),
            bytes(g.total_size),
            bytes(g.allocated_bytes()),
            g.blocks.len().to_string(),
            active.to_string(),
        ]);
    }
    vec![totals, segments]
}
