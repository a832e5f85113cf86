//! Lab 1: where tensors live, what moving them costs, and why the first call and the
//! unsynchronised timer both mislead. Each module is one experiment of chapter 1; the
//! binary prints them as tables.

pub mod async_timing;
pub mod bandwidth;
pub mod exercises;
pub mod lazy_init;
pub mod placement;
pub mod raw_alloc;
