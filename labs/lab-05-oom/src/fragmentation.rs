//! Experiment 2: out of memory from fragmentation. The same requests under both
//! settings of `expandable_segments`: 5 MiB blocks until the cap refuses, then three
//! of every four freed, then one request of 60 MiB. With fixed segments each 20 MiB
//! segment keeps one live block, so no segment can be returned and no free piece is
//! large enough: out of memory with most of the memory cached. An expandable segment
//! unmaps the idle pages and maps them where the request needs them.

use labs_core::alloc::Allocation;
use labs_core::format::bytes;
use labs_core::oom_report::Suggestion;
use labs_core::table::Table;
use labs_core::{Device, Error, Result};

use crate::{capped, mib};

pub const CAP: u64 = 400 << 20;
pub const BLOCK: u64 = 5 << 20;
pub const REQUEST: u64 = 60 << 20;

/// What one setting did with the sequence.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub expandable: bool,
    pub blocks: usize,
    pub allocated: u64,
    pub reserved: u64,
    /// The request's error, if it failed.
    pub error: Option<Error>,
    /// The report's free pieces and the largest, and its suggestion, on failure.
    pub pieces: Option<(u64, u64, Suggestion)>,
    /// Mappings undone to serve the request (`num_unmaps`; 0 with fixed segments).
    pub unmaps: u64,
}

// ANCHOR: fragment
pub fn run(device: &Device, expandable: bool) -> Result<Outcome> {
    let conf = format!(
        "expandable_segments:{}",
        if expandable { "True" } else { "False" }
    );
    let a = capped(device, CAP, &conf)?;
    let stream = device.default_stream()?;
    let mut live: Vec<Allocation> = Vec::new();
    loop {
        match a.malloc(BLOCK as usize, &stream) {
            Ok(b) => live.push(b),
            Err(e) if e.is_out_of_memory() => break,
            Err(e) => return Err(e),
        }
    }
    let blocks = live.len();
    let mut kept = Vec::new();
    for (i, b) in live.into_iter().enumerate() {
        if i % 4 == 0 {
            kept.push(b);
        } else {
            a.free(b)?;
        }
    }
    let (allocated, reserved) = (a.memory_allocated(), a.memory_reserved());
    let result = a.malloc(REQUEST as usize, &stream);
    // ANCHOR_END: fragment
    let (error, pieces) = match result {
        Ok(b) => {
            a.free(b)?;
            (None, None)
        }
        Err(e) => {
            let pieces = match &e {
                Error::OutOfMemory {
                    report: Some(r), ..
                } => Some((r.free_pieces, r.largest_free, r.suggestion)),
                _ => None,
            };
            (Some(e), pieces)
        }
    };
    let unmaps = a.stats().num_unmaps;
    for b in kept {
        a.free(b)?;
    }
    Ok(Outcome {
        expandable,
        blocks,
        allocated,
        reserved,
        error,
        pieces,
        unmaps,
    })
}

pub fn print(device: &Device, rows: &[Outcome]) {
    println!(
        "2. Fragmentation: {} blocks until the cap, 3 of every 4 freed, then {}, on {device}",
        bytes(BLOCK),
        bytes(REQUEST)
    );
    println!(
        "(a private allocator capped at {} with set_memory_fraction, so that it fills in \
         milliseconds on any device)\n",
        bytes(CAP)
    );
    let mut t = Table::new(
        "The same requests under both settings",
        &[
            "expandable_segments",
            "blocks",
            "allocated MiB",
            "reserved MiB",
            "60 MiB request",
            "free pieces",
            "largest MiB",
            "unmaps",
        ],
    );
    for o in rows {
        let (pieces, largest) = match o.pieces {
            Some((p, l, _)) => (p.to_string(), mib(l)),
            None => ("-".into(), "-".into()),
        };
        t.row([
            if o.expandable { "True" } else { "False" }.to_string(),
            o.blocks.to_string(),
            mib(o.allocated),
            mib(o.reserved),
            if o.error.is_some() {
                "out of memory"
            } else {
                "served"
            }
            .to_string(),
            pieces,
            largest,
            o.unmaps.to_string(),
        ]);
    }
    println!("{t}");
    for o in rows {
        if let Some(e) = &o.error {
            println!(
                "The error with expandable_segments:{}:\n{e}\n",
                if o.expandable { "True" } else { "False" }
            );
        }
    }
}
