//! Lab 8: keeping a GPU fed from host memory. What `non_blocking` really does from
//! pinned and pageable memory, a prefetching loader that hides copies behind compute,
//! and `bench`, which measures copy bandwidth and the loop together. The memory itself
//! (pinning's cost, mapped and managed memory) is chapter 11's, in lab-11.

pub mod bandwidth;
pub mod bench;
pub mod driver_work;
pub mod exercises;
pub mod loader;
pub mod non_blocking;
pub mod training;
