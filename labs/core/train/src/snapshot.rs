//! `train --snapshot FILE`: the allocator's history over the whole run, recorded from
//! before the model is built, written at the end as a memory snapshot (our JSON) for
//! `lab-03 summary`, `plot` and `compare`. The recording is the allocator's
//! `record_memory_history`, as PyTorch's twin calls `_record_memory_history`.
//!
//! Without call sites it costs each allocation and free an entry in a ring buffer; with
//! them (`--snapshot-stacks`) a backtrace each, resolved to names when the file is
//! written, which slows a run of thousands of allocations per step noticeably.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use labs_core::Device;

/// Entries the ring buffer keeps: more than a GPT-2 small run of a few steps makes
/// (some ten thousand per step), so that the trace starts with the run.
pub const MAX_ENTRIES: usize = 1 << 23;

/// Starts recording on `device`'s allocator, from a fresh history.
pub fn start(device: &Device, stacks: bool) -> Result<()> {
    device
        .allocator()?
        .record_memory_history(MAX_ENTRIES, stacks);
    Ok(())
}

/// Writes `device`'s snapshot to `path` and stops recording. A history that lost its
/// oldest entries is written all the same, with a warning: its peaks undercount.
pub fn finish(device: &Device, path: &Path) -> Result<()> {
    let allocator = device.allocator()?;
    let (_, dropped) = allocator.history();
    allocator
        .dump_snapshot(path)
        .with_context(|| format!("--snapshot: writing {}", path.display()))?;
    allocator.record_memory_history(0, false);
    if dropped > 0 {
        eprintln!(
            "warning: the snapshot's trace lost its first {dropped} events (the history \
             keeps {MAX_ENTRIES}); peaks read from it undercount"
        );
    }
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Rank `rank`'s file of a data-parallel run: `FILE.rankN`.
pub fn rank_path(path: &Path, rank: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".rank{rank}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ranks_file_is_the_file_with_its_rank_appended() {
        assert_eq!(
            rank_path(Path::new("out/gpt2.json"), 3),
            PathBuf::from("out/gpt2.json.rank3")
        );
    }
}
