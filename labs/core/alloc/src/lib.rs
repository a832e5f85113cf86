//! A caching GPU allocator with PyTorch's semantics, and nothing else of a GPU runtime:
//!
//! - `backend`: the memory half of the device contract (memory, virtual memory, streams
//!   and events), all the allocator asks of a device;
//! - `alloc`: the caching allocator over it (pools, block splitting and merging,
//!   expandable segments, stream-ordered frees, statistics, the memory history, the
//!   out-of-memory report, replays of recorded traces);
//! - `snapshot`: memory snapshots as plain data, ours and PyTorch's pickles.
//!
//! It builds, tests and documents alone: `cargo test -p labs-alloc`.

pub mod alloc;
pub mod backend;
pub mod snapshot;

// The base crate's modules under the paths this crate's files name them by.
use labs_base::{device_id, dtype, error, format, input, oom_report, runtime};

pub use alloc::{Allocator, Config};
pub use backend::MemoryBackend;
