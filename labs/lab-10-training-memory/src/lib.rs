//! Lab 10: training memory. [`train`] is the training driver the later chapters share
//! (mixed precision, out of memory, data parallel): a Transformer or a GPT-2 trained
//! with accumulation, checkpointing, offload, fused attention and autocast, measured.

pub mod exercises;
pub mod experiments;
pub mod train;
