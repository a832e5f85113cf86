//! Lab 3: looking at memory. Snapshots (ours and PyTorch's) summarised, drawn and
//! exported for replay, two of them compared, and the device-wide view `nvidia-smi`
//! gives.

pub mod demo;
pub mod exercises;
pub mod report;
pub mod smi;
pub mod training;
