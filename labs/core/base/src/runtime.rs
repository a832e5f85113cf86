//! The runtime's own crates and source folders, by which a backtrace's frames are told
//! apart: the runtime's, or its caller's (a lab, a test, a training script).

/// The path prefixes of the runtime's symbols: its crates, bottom to top, and the façade.
pub const CRATES: [&str; 7] = [
    "labs_base::",
    "labs_alloc::",
    "labs_device::",
    "labs_tensor::",
    "labs_nn::",
    "labs_dist::",
    "labs_core::",
];

/// The source folders of those crates, relative to the workspace (a release build keeps
/// line tables only, where an inlined frame has its bare name and a file).
pub const SOURCES: [&str; 7] = [
    "labs/core/base/src/",
    "labs/core/alloc/src/",
    "labs/core/device/src/",
    "labs/core/tensor/src/",
    "labs/core/nn/src/",
    "labs/core/dist/src/",
    "labs/core/src/",
];

/// Whether a symbol belongs to the runtime.
pub fn is_runtime_symbol(name: &str) -> bool {
    CRATES.iter().any(|c| name.starts_with(c))
}

/// Whether a source file (as a backtrace names it) belongs to the runtime.
pub fn is_runtime_file(file: &str) -> bool {
    SOURCES.iter().any(|s| file.starts_with(s))
}
