//! Time, where the runtime reads it: the standard library's clocks natively, and in a
//! browser (the book's calculator runs the dry run there, where `std::time` panics)
//! the page's, through `web-time`, which is the standard library's types elsewhere.

pub use web_time::Instant;

/// The time since the Unix epoch (zero where the host gives none).
pub fn since_epoch() -> std::time::Duration {
    web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .unwrap_or_default()
}
