//! Lab 3: looking at memory. Snapshots (ours and PyTorch's) summarised, drawn and
//! exported for replay, explored in a browser page, and two of them compared. The device-wide view `nvidia-smi`
//! gives is lab 12's.

pub mod demo;
pub mod exercises;
pub mod report;
pub mod training;
pub mod view;
