//! Which computation serves [`Tensor::fused_attention`](super::Tensor::fused_attention):
//! the fused kernels (`kernels/attention.cu`) or the chunked matrix products
//! (`attention_chunked.rs`), and the bound on the chunks' temporaries. Chunked unless
//! this thread or the environment forces the fused kernels (to compare the two).

use std::cell::Cell;

use crate::error::{Error, Result};

/// How fused attention computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// One kernel per step, tiles in shared memory (`kernels/attention.cu`): kept to
    /// check the chunked path against, and as the reference of the book's kernel.
    Fused,
    /// Chunks of query rows as matrix products and row kernels (`attention_chunked.rs`):
    /// the default.
    Chunked,
}

/// The bound on a chunk's score temporaries unless set otherwise: 64 MiB.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

thread_local! {
    static FORCED_PATH: Cell<Option<AttentionPath>> = const { Cell::new(None) };
    static CHUNK_BYTES: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Forces this thread's fused attention onto `path` (`None`: back to the default),
/// returning what was set before.
pub fn set_attention_path(path: Option<AttentionPath>) -> Option<AttentionPath> {
    FORCED_PATH.with(|c| c.replace(path))
}

/// Bounds this thread's chunk temporaries at `bytes` (`None`: back to the default),
/// returning what was set before.
pub fn set_attention_chunk_bytes(bytes: Option<usize>) -> Option<usize> {
    CHUNK_BYTES.with(|c| c.replace(bytes))
}

/// The path fused attention takes: what [`set_attention_path`] forced on this thread,
/// else the environment's `LABS_ATTENTION` (`fused` or `chunked`), else chunked, on
/// every backend. On `cuda` the products run on cuBLAS (tensor cores for the half
/// types) and beat the fused kernels' one-key-at-a-time loops at every length (an
/// H100's 100-position Transformer step: 68 ms fused, 45 ms chunked; GPT-2's 1024
/// positions: 300 ms and 90 ms under bfloat16); the simulator runs the same
/// composition on its twins and the dry run makes the same allocations, chunk
/// temporaries included, so that both predict the GPU's memory exactly.
pub fn attention_path() -> Result<AttentionPath> {
    if let Some(path) = FORCED_PATH.with(Cell::get) {
        return Ok(path);
    }
    match std::env::var("LABS_ATTENTION").as_deref() {
        Ok("fused") => Ok(AttentionPath::Fused),
        Ok("chunked") => Ok(AttentionPath::Chunked),
        Ok(other) => Err(Error::InvalidArgument(format!(
            "LABS_ATTENTION must be `fused` or `chunked`, got `{other}`"
        ))),
        Err(_) => Ok(AttentionPath::Chunked),
    }
}

/// The bound on a chunk's temporaries: [`set_attention_chunk_bytes`], else the
/// environment's `LABS_ATTENTION_CHUNK_BYTES`, else [`DEFAULT_CHUNK_BYTES`].
pub(super) fn chunk_bytes() -> Result<usize> {
    if let Some(bytes) = CHUNK_BYTES.with(Cell::get) {
        return Ok(bytes);
    }
    match std::env::var("LABS_ATTENTION_CHUNK_BYTES") {
        Ok(text) => text.parse().map_err(|_| {
            Error::InvalidArgument(format!(
                "LABS_ATTENTION_CHUNK_BYTES must be a number of bytes, got `{text}`"
            ))
        }),
        Err(_) => Ok(DEFAULT_CHUNK_BYTES),
    }
}
