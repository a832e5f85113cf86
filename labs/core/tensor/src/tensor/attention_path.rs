//! Which computation serves [`Tensor::fused_attention`](super::Tensor::fused_attention):
//! the fused kernels (`kernels/attention.cu`, and their tensor-core form
//! `kernels/attention_flash.cu`) or the chunked matrix products
//! (`attention_chunked.rs`), and the bound on the chunks' temporaries. Fused where the
//! tensor-core kernels serve the call, else chunked, unless this thread or the
//! environment forces one (to compare them).

use std::cell::Cell;

use crate::error::{Error, Result};

/// How fused attention computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// One kernel per step, tiles in shared memory: on tensor cores without dropout and
    /// for head_dim 16 to 64 (`kernels/attention_flash.cu`, the default there), else
    /// the reference kernels (`kernels/attention.cu`, the book's kernel).
    Fused,
    /// Chunks of query rows as matrix products and row kernels (`attention_chunked.rs`):
    /// the default for dropout and larger heads.
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

/// The path forced on fused attention: what [`set_attention_path`] forced on this
/// thread, else the environment's `LABS_ATTENTION` (`fused` or `chunked`), else `None`,
/// the default of [`path_for`].
pub fn attention_path() -> Result<Option<AttentionPath>> {
    if let Some(path) = FORCED_PATH.with(Cell::get) {
        return Ok(Some(path));
    }
    match std::env::var("LABS_ATTENTION").as_deref() {
        Ok("fused") => Ok(Some(AttentionPath::Fused)),
        Ok("chunked") => Ok(Some(AttentionPath::Chunked)),
        Ok(other) => Err(Error::InvalidArgument(format!(
            "LABS_ATTENTION must be `fused` or `chunked`, got `{other}`"
        ))),
        Err(_) => Ok(None),
    }
}

/// The path a call takes: the forced one ([`attention_path`]), else the fused kernels
/// where their tensor-core form serves the call (`flash`: head_dim 16 to 64, no
/// dropout; `kernels::flash_serves`), else the chunked products, on every
/// backend. On `cuda` the chunked products run on cuBLAS and beat the reference fused
/// kernels' one-key-at-a-time loops at every length (an H100's 100-position
/// Transformer step: 68 ms fused, 45 ms chunked), while the tensor-core kernels beat
/// both where they apply, and keep no chunk temporaries. The simulator runs the same
/// choice on its twins and the dry run makes the same allocations, so that both predict
/// the GPU's memory exactly.
pub fn path_for(flash: bool) -> Result<AttentionPath> {
    Ok(attention_path()?.unwrap_or(if flash {
        AttentionPath::Fused
    } else {
        AttentionPath::Chunked
    }))
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
