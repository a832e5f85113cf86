//! Copy bandwidth between host and device memory, from pageable and from pinned host
//! memory, by size: `labs_core::bandwidth` measures it (chapter 8's bench measures the
//! same); this lab adds what the simulated GPU models of it.

pub use labs_core::bandwidth::*;

/// What the simulated GPU models of these copies.
pub const SIM: &str = "a pinned copy is one memcpy on the stream's thread, a pageable one \
two, through a 2 MiB staging buffer as the driver does; there is no bus, so the figures are \
the host's memory speed";
