//! The reading exercise 1 takes, shared by the starter code and the solutions.

// ANCHOR: reading
/// Two figures read at the same point of one step of a loop, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// `memory_reserved()`.
    pub reserved: u64,
    /// NVML's line for the process; `None` where NVML did not list it at that moment.
    pub process: Option<u64>,
}
// ANCHOR_END: reading
