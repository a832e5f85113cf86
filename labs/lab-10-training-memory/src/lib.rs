//! Lab 10: training memory. The chapter's experiments and exercises, run on the training
//! driver of `labs-train` (the one chapters 5 and 7 share): a Transformer or a GPT-2
//! trained with accumulation, checkpointing, offload, fused attention and autocast,
//! measured.

pub mod exercises;
pub mod experiments;
pub mod formula;
