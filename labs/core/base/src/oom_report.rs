//! What the allocator knows when it runs out of memory, and the message that says it.
//!
//! PyTorch's `OutOfMemoryError` gives the request, the device's capacity and free memory,
//! and what the caching allocator holds, allocated and cached; and it suggests
//! `expandable_segments` whatever the cause. The report here keeps those figures, in the
//! same order so that readers recognise them, then adds what tells the causes apart: how
//! the cached memory is split (one large free block, or many small ones), the memory
//! fraction in force, the largest live allocations with what they hold and where they
//! were made, and one suggestion chosen from these figures.
//!
//! It sits at the bottom of the crate, beside the error type that carries it: plain
//! figures and names, filled in by the allocator.

use std::fmt;

use crate::format::bytes;

/// One of the largest allocations alive at the failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveAllocation {
    /// Bytes after rounding.
    pub size: u64,
    /// What it holds (`parameter`, `activation`, …: the allocator's categories).
    pub category: &'static str,
    /// Where it was made (`function (file:line)`), when the memory history records
    /// backtraces.
    pub site: Option<String>,
}

/// What the failure most likely calls for, chosen from the report's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suggestion {
    /// The one request is larger than the device: nothing else helps.
    RequestExceedsDevice,
    /// The memory fraction, not the device, is the limit that was reached.
    RaiseMemoryFraction,
    /// Enough memory is cached but in pieces too small: fragmentation.
    ExpandableSegments,
    /// Activations saved for backward hold most of the memory.
    CheckpointOrSmallerBatch,
    /// Live tensors simply need more than there is.
    FreeOrSmallerBatch,
}

/// The allocator's account of an out-of-memory failure.
#[derive(Debug, Clone, PartialEq)]
pub struct OomReport {
    /// Bytes in blocks handed out (`memory_allocated`).
    pub allocated: u64,
    /// Of `allocated`, the bytes in private pools (a `MemPool`'s, a CUDA graph's).
    pub private_pools_allocated: u64,
    /// Bytes held from the driver (`memory_reserved`).
    pub reserved: u64,
    /// The cap on `reserved`: the device's memory times `fraction`.
    pub limit: u64,
    pub fraction: f64,
    /// Whether segments grow by mapping pages (`expandable_segments`).
    pub expandable: bool,
    /// Reserved but unallocated memory: how many separate free pieces, and the largest.
    pub free_pieces: u64,
    pub largest_free: u64,
    /// Bytes of activations saved for backward among `allocated`.
    pub activations: u64,
    /// The largest live allocations, largest first (at most five).
    pub largest_live: Vec<LiveAllocation>,
    pub suggestion: Suggestion,
}

// ANCHOR: suggest
impl OomReport {
    /// Picks the suggestion these figures call for, for a request of `requested` bytes
    /// on a device of `capacity` bytes.
    pub fn suggest(&self, requested: u64, capacity: u64) -> Suggestion {
        let cached = self.reserved.saturating_sub(self.allocated);
        if requested > capacity {
            Suggestion::RequestExceedsDevice
        } else if cached >= requested && self.largest_free < requested {
            Suggestion::ExpandableSegments
        } else if self.fraction < 1.0 && self.allocated + requested <= capacity {
            Suggestion::RaiseMemoryFraction
        } else if self.activations * 2 >= self.allocated && self.activations > 0 {
            Suggestion::CheckpointOrSmallerBatch
        } else {
            Suggestion::FreeOrSmallerBatch
        }
    }
}
// ANCHOR_END: suggest

/// The whole message of an out-of-memory error with a report: PyTorch's sentences
/// first, then the report's own lines.
pub(crate) fn message(
    f: &mut fmt::Formatter<'_>,
    device: &dyn fmt::Display,
    requested: u64,
    free: u64,
    total: u64,
    r: &OomReport,
) -> fmt::Result {
    write!(
        f,
        "out of memory on {device}. Tried to allocate {}. {device} has a total capacity of {} \
         of which {} is free. ",
        bytes(requested),
        bytes(total),
        bytes(free)
    )?;
    if r.fraction < 1.0 {
        write!(
            f,
            "The memory fraction {} allows this process {}. ",
            r.fraction,
            bytes(r.limit)
        )?;
    }
    let cached = r.reserved.saturating_sub(r.allocated);
    write!(
        f,
        "Of the allocated memory {} is allocated by the caching allocator, ",
        bytes(r.allocated)
    )?;
    if r.private_pools_allocated > 0 {
        write!(
            f,
            "with {} allocated in private pools, ",
            bytes(r.private_pools_allocated)
        )?;
    }
    write!(f, "and {} is reserved but unallocated", bytes(cached))?;
    if r.free_pieces > 0 {
        let pieces = if r.free_pieces == 1 {
            "piece"
        } else {
            "pieces"
        };
        write!(
            f,
            " ({} {pieces}, the largest {})",
            r.free_pieces,
            bytes(r.largest_free)
        )?;
    }
    write!(f, ".")?;
    let advice = match r.suggestion {
        Suggestion::RequestExceedsDevice => format!(
            "one request larger than the device's {} fits under no setting: split the \
             work (a smaller batch or sequence).",
            bytes(total)
        ),
        Suggestion::RaiseMemoryFraction => format!(
            "the memory fraction ({}) is the limit reached, not the device: raise it \
             (set_per_process_memory_fraction) if the GPU is not shared.",
            r.fraction
        ),
        Suggestion::ExpandableSegments => format!(
            "{} is cached but the largest free piece is {}: fragmentation. Setting \
             expandable_segments:True in LABS_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF in \
             PyTorch) maps memory where it is needed instead.",
            bytes(cached),
            bytes(r.largest_free)
        ),
        Suggestion::CheckpointOrSmallerBatch => format!(
            "activations saved for backward hold {} of the {} allocated: activation \
             checkpointing or a smaller batch reduces them.",
            bytes(r.activations),
            bytes(r.allocated)
        ),
        Suggestion::FreeOrSmallerBatch => "the live tensors need more than there is: drop \
             what is no longer needed (outputs kept across steps, losses kept with their \
             graphs) or use a smaller batch."
            .to_string(),
    };
    write!(f, " Suggestion: {advice}")?;
    if !r.largest_live.is_empty() {
        write!(f, " Largest live allocations:")?;
        for (i, a) in r.largest_live.iter().enumerate() {
            let sep = if i == 0 { "" } else { ";" };
            write!(f, "{sep} {} {}", bytes(a.size), a.category)?;
            if let Some(site) = &a.site {
                write!(f, " at {site}")?;
            }
        }
        write!(f, ".")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn report() -> OomReport {
        OomReport {
            allocated: 600 * MIB,
            private_pools_allocated: 0,
            reserved: 700 * MIB,
            limit: 1024 * MIB,
            fraction: 1.0,
            expandable: false,
            free_pieces: 4,
            largest_free: 40 * MIB,
            activations: 100 * MIB,
            largest_live: vec![],
            suggestion: Suggestion::FreeOrSmallerBatch,
        }
    }

    #[test]
    fn each_cause_gets_its_suggestion() {
        let r = report();
        assert_eq!(
            r.suggest(2048 * MIB, 1024 * MIB),
            Suggestion::RequestExceedsDevice
        );
        // 100 MiB cached, in pieces of at most 40 MiB.
        assert_eq!(
            r.suggest(64 * MIB, 1024 * MIB),
            Suggestion::ExpandableSegments
        );
        // More than is cached: not fragmentation.
        assert_eq!(
            r.suggest(500 * MIB, 1024 * MIB),
            Suggestion::FreeOrSmallerBatch
        );
        let capped = OomReport {
            fraction: 0.5,
            ..report()
        };
        assert_eq!(
            capped.suggest(300 * MIB, 1024 * MIB),
            Suggestion::RaiseMemoryFraction
        );
        let activations = OomReport {
            activations: 400 * MIB,
            ..report()
        };
        assert_eq!(
            activations.suggest(500 * MIB, 1024 * MIB),
            Suggestion::CheckpointOrSmallerBatch
        );
    }

    #[test]
    fn the_message_gives_pytorchs_figures_then_ours() {
        let r = OomReport {
            fraction: 0.5,
            limit: 512 * MIB,
            largest_live: vec![LiveAllocation {
                size: 256 * MIB,
                category: "activation",
                site: Some("train::step (src/train.rs:42)".into()),
            }],
            suggestion: Suggestion::RaiseMemoryFraction,
            ..report()
        };
        let text = crate::error::Error::OutOfMemory {
            device: crate::device_id::DeviceId::Cuda(0),
            requested: 64 * MIB,
            free: 300 * MIB,
            total: 1024 * MIB,
            report: Some(Box::new(r)),
        }
        .to_string();
        for part in [
            "out of memory on cuda:0. Tried to allocate 64.00 MiB.",
            "cuda:0 has a total capacity of 1.00 GiB of which 300.00 MiB is free.",
            "The memory fraction 0.5 allows this process 512.00 MiB.",
            "Of the allocated memory 600.00 MiB is allocated by the caching allocator, and \
             100.00 MiB is reserved but unallocated (4 pieces, the largest 40.00 MiB).",
            "Largest live allocations: 256.00 MiB activation at train::step (src/train.rs:42).",
            "Suggestion: the memory fraction (0.5) is the limit reached",
        ] {
            assert!(text.contains(part), "missing {part:?} in:\n{text}");
        }
    }
}
