//! Lab 8: keeping a GPU fed from host memory. Pinned memory and what it buys, what
//! `non_blocking` really does, mapped and managed memory, and a prefetching loader
//! that hides copies behind compute. Each module is one experiment of chapter 8.

pub mod bandwidth;
pub mod bench;
pub mod driver_work;
pub mod exercises;
pub mod loader;
pub mod mapped;
pub mod non_blocking;
pub mod training;
