//! What a snapshot holds: the allocator's segments with their blocks, the event trace,
//! and the settings the allocator ran with. Field names follow PyTorch's
//! `torch.cuda.memory._snapshot()` so that a PyTorch user recognises them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One line of a backtrace: a Python or C++ frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub name: String,
    #[serde(default)]
    pub filename: String,
    #[serde(default)]
    pub line: u64,
}

/// A backtrace, innermost frame first. Shared, not copied: PyTorch's snapshots refer to
/// one list of frames from thousands of events, and a pickle can refer to one object
/// any number of times, so a copy per reference would grow without bound.
pub type Frames = Arc<[Frame]>;

/// Which pool a segment belongs to: PyTorch keeps blocks of at most 1 MiB in 2 MiB
/// "small" segments apart from the rest, to limit fragmentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentType {
    Small,
    Large,
}

/// A block's state, with PyTorch's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to the program.
    ActiveAllocated,
    /// Freed by the program but still in use by a stream it was recorded on: not
    /// reusable until that stream's work completes.
    ActivePendingFree,
    /// Cached: free for reuse, still held from the driver.
    Inactive,
}

impl BlockState {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// A piece of a segment: allocated, pending free or cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub address: u64,
    /// Bytes the block occupies, after the allocator's rounding.
    pub size: u64,
    /// Bytes the program asked for (0 for a cached block that never held anything).
    pub requested_size: u64,
    pub state: BlockState,
    #[serde(default, skip_serializing_if = "<[Frame]>::is_empty")]
    pub frames: Frames,
    /// What an allocated block holds (`parameter`, `activation`, …: the allocation
    /// categories), in the labs' snapshots; PyTorch's snapshots have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
}

/// Memory the allocator got from the driver in one piece (`cudaMalloc`, or a range of
/// an expandable segment), split into blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub segment_type: SegmentType,
    #[serde(default)]
    pub is_expandable: bool,
    /// The memory pool the segment belongs to, as PyTorch writes it: `(0, 0)` for the
    /// default pool, `(0, n)` for the n-th `MemPool`, `(n, 0)` for a CUDA graph's.
    #[serde(default)]
    pub segment_pool_id: (u64, u64),
    pub blocks: Vec<Block>,
}

impl Segment {
    /// Bytes in blocks handed out to the program (PyTorch's `allocated_size`).
    pub fn allocated_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .fold(0, u64::saturating_add)
    }
}

/// What a trace event records. Unknown actions from newer PyTorch versions are kept
/// by name rather than rejected, so that a new snapshot still loads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Other(String),
}

impl TraceAction {
    pub fn as_str(&self) -> &str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Other(s) => s,
        }
    }
}

impl From<String> for TraceAction {
    fn from(s: String) -> Self {
        match s.as_str() {
            "alloc" => TraceAction::Alloc,
            "free_requested" => TraceAction::FreeRequested,
            "free_completed" => TraceAction::FreeCompleted,
            "segment_alloc" => TraceAction::SegmentAlloc,
            "segment_free" => TraceAction::SegmentFree,
            "segment_map" => TraceAction::SegmentMap,
            "segment_unmap" => TraceAction::SegmentUnmap,
            "oom" => TraceAction::Oom,
            "snapshot" => TraceAction::Snapshot,
            _ => TraceAction::Other(s),
        }
    }
}

impl From<TraceAction> for String {
    fn from(a: TraceAction) -> String {
        a.as_str().to_string()
    }
}

impl fmt::Display for TraceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of the allocator's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// PyTorch keeps one trace per device; ours are flattened with the device noted.
    #[serde(default)]
    pub device: i64,
    pub action: TraceAction,
    pub addr: u64,
    pub size: u64,
    #[serde(default)]
    pub stream: u64,
    #[serde(default)]
    pub time_us: i64,
    #[serde(default, skip_serializing_if = "<[Frame]>::is_empty")]
    pub frames: Frames,
    /// Of an `alloc`, in the labs' snapshots: what the block held (its allocation
    /// category as last set while it was live). PyTorch's traces have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Of an `alloc`, in the labs' snapshots: the autograd op that saved the block
    /// for backward, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_by: Option<String>,
}

/// The configuration the allocator ran with. The settings every allocator has are
/// fields; anything else (PyTorch has many knobs, ours will have others) is kept by
/// name as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorSettings {
    /// The configuration string as the user gave it (`PYTORCH_CUDA_ALLOC_CONF`).
    #[serde(default)]
    pub alloc_conf: String,
    #[serde(default)]
    pub expandable_segments: bool,
    /// Blocks larger than this are never split; `None` means no limit.
    #[serde(default)]
    pub max_split_size: Option<u64>,
    #[serde(default)]
    pub garbage_collection_threshold: f64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// The allocator's state at one moment, and the history that led there.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    pub trace: Vec<TraceEvent>,
    #[serde(default)]
    pub settings: AllocatorSettings,
}
