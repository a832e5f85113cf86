//! Lab 12: the device-wide view. `nvidia-smi`'s figures read from NVML (the simulated
//! GPU's own on `sim`), set beside the caching allocator's counters: what the device
//! shows, the gap between a process's line and `memory_reserved()`, what polling sees of
//! a training loop, and which process holds what.

pub mod exercises;
pub mod gap;
pub mod model;
pub mod poll;
pub mod processes;
pub mod smi;
