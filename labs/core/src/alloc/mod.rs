//! Chapter 2: a caching allocator in the manner of PyTorch's `CUDACachingAllocator`,
//! generic over the device backend, plus the replay of real allocation traces that
//! measures it.

mod caching;
mod config;
mod export;
mod history;
mod leak;
mod lock;
mod parked;
mod pool;
pub mod replay;
mod size;
mod stats;

pub use caching::{Allocator, Block, BlockInfo, SegmentInfo};
pub use config::{Config, Divisions, ENV_ALLOC_CONF};
pub use export::LiveBlock;
pub use history::{frames_of, HistoryEvent};
pub use leak::{LeakGuard, LeakReport};
pub use pool::{BlockState, MAX_STREAMS};
pub use size::{checked_round_size, pool_of, round_size, segment_size, Pool, MAX_REQUEST};
pub use stats::{PoolStat, Stat, Stats};
