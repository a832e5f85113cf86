//! Lab 2's library: only the workshop exercises, so that their tests can reach them.
//! The experiments, the replay and the benchmarks live in the binary.

pub mod exercises;
