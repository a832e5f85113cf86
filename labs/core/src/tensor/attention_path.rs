//! Which computation serves [`Tensor::fused_attention`](super::Tensor::fused_attention):
//! the fused kernels (`kernels/attention.cu`) or the chunked matrix products
//! (`attention_chunked.rs`), and the bound on the chunks' temporaries. The backend
//! chooses unless this thread or the environment forces a path (to compare the two, or
//! to run the chunked composition on the simulator's twins).

use std::cell::Cell;

use crate::device::Device;
use crate::error::{Error, Result};

/// How fused attention computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// One kernel per step, tiles in shared memory (`kernels/attention.cu`): the
    /// simulator's default.
    Fused,
    /// Chunks of query rows as matrix products and row kernels (`attention_chunked.rs`):
    /// the GPU's default.
    Chunked,
}

/// Fewer keys than this stay on the fused kernels on the GPU too: with short rows the
/// chunked path is thousands of small products (one per batch element and chunk), and
/// their launches cost more than the fused kernels' arithmetic (measured on an H100:
/// a 100-position Transformer step took four times longer chunked).
pub const MIN_CHUNKED_KEYS: usize = 256;

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

/// The path fused attention over `keys` keys takes on `device`: what
/// [`set_attention_path`] forced on this thread, else the environment's
/// `LABS_ATTENTION` (`fused` or `chunked`), else the backend's choice: chunked on
/// `cuda` for rows of at least [`MIN_CHUNKED_KEYS`] keys, where the products run on
/// tensor cores;
/// fused elsewhere (the simulator's twins, and the dry run's allocations, which are
/// the fused kernels' and leave out the chunks' transient temporaries).
pub fn attention_path(device: &Device, keys: usize) -> Result<AttentionPath> {
    if let Some(path) = FORCED_PATH.with(Cell::get) {
        return Ok(path);
    }
    match std::env::var("LABS_ATTENTION").as_deref() {
        Ok("fused") => Ok(AttentionPath::Fused),
        Ok("chunked") => Ok(AttentionPath::Chunked),
        Ok(other) => Err(Error::InvalidArgument(format!(
            "LABS_ATTENTION must be `fused` or `chunked`, got `{other}`"
        ))),
        Err(_) if device.is_cuda() && keys >= MIN_CHUNKED_KEYS => Ok(AttentionPath::Chunked),
        Err(_) => Ok(AttentionPath::Fused),
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
