//! Chapter 2: a caching allocator in the manner of PyTorch's `CUDACachingAllocator`,
//! generic over the device backend, plus the replay of real allocation traces that
//! measures it.

mod allocator;
mod caching;
mod category;
mod config;
mod deferred;
mod divisions;
mod epochs;
mod export;
mod fit;
mod history;
mod invariants;
mod leak;
mod lock;
mod mempool;
mod oom;
mod origin;
mod pages;
mod parked;
mod pool;
mod release;
pub mod replay;
mod report;
mod size;
mod stats;
mod stream_ordered;
mod timeline;

pub use allocator::{Allocation, Allocator, OomObserver};
pub use category::{Category, CategoryScope};
pub use config::{AllocBackend, Config, Divisions, ENV_ALLOC_CONF};
pub use export::LiveBlock;
pub use history::{frames_of, HistoryEvent};
pub use leak::{LeakGuard, LeakReport};
pub use mempool::{MemPoolId, MemPoolScope, MemPoolStats};
pub use origin::{origin_of, short_name, Origin};
pub use pool::{BlockState, MAX_STREAMS};
pub use report::{BlockInfo, SegmentInfo};
pub use size::{
    checked_round_size, pool_of, round_size, segment_size, Pool, EXPANDABLE_VA, MAX_REQUEST,
};
pub use stats::{DriverTime, DriverTimes, PoolStat, Stat, Stats};
pub use timeline::CategorySample;
