//! Size classes: how a request is rounded, which pool serves it, how big a new segment is.
//! The constants are PyTorch's, so that replayed traces compare like with like.

// ANCHOR: size_constants
/// Every block is a multiple of this.
pub const MIN_BLOCK: u64 = 512;
/// Requests up to this size come from the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Fixed segments of the small pool.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Fixed segments for 1-10 MiB requests.
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests below this share 20 MiB segments; larger ones get their own.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger requests' segments are rounded to this.
pub const ROUND_LARGE: u64 = 2 << 20;
/// The virtual size of an expandable segment: address space is free, so it is large
/// enough that a pool rarely needs a second one.
pub const EXPANDABLE_VA: u64 = 1 << 30;
// ANCHOR_END: size_constants

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    Small = 0,
    Large = 1,
}

pub fn pool_of(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

// ANCHOR: round_size
/// The size a request of `size` bytes occupies.
pub fn round_size(size: u64, divisions: u32) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    if divisions > 1 && size > MIN_BLOCK * divisions as u64 && !size.is_power_of_two() {
        // One of `divisions` equal steps between the powers of two around `size`.
        let floor = 1u64 << (63 - size.leading_zeros());
        let step = floor / divisions as u64;
        return size.div_ceil(step) * step;
    }
    size.div_ceil(MIN_BLOCK) * MIN_BLOCK
}
// ANCHOR_END: round_size

/// The largest request the allocator considers: its rounding, the largest segment it
/// could need and the 48-bit size field of the parked table's key (`parked.rs`) all
/// stay in range below it (256 TiB, far beyond any GPU).
pub const MAX_REQUEST: u64 = 1 << 48;

/// [`round_size`] for a size from outside (a program, a trace): `None` when the request
/// could never be served by a device of `limit` bytes, so that the caller reports an
/// out-of-memory error before any work, and before any host memory proportional to the
/// size is touched. `round_size` alone would wrap for sizes near 2^64.
pub fn checked_round_size(size: u64, divisions: u32, limit: u64) -> Option<u64> {
    if size > MAX_REQUEST.min(limit) {
        return None;
    }
    let rounded = round_size(size, divisions);
    (rounded <= limit && segment_size(rounded) <= MAX_REQUEST).then_some(rounded)
}

// ANCHOR: segment_size
/// The size of a fixed segment for a rounded request.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}
// ANCHOR_END: segment_size

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_classes() {
        assert_eq!(round_size(1, 0), 512);
        assert_eq!(round_size(513, 0), 1024);
        assert_eq!(round_size(1 << 20, 0), 1 << 20);
        // 1,200 KiB with 4 divisions: between 1 MiB and 2 MiB in 256 KiB steps.
        assert_eq!(round_size(1200 << 10, 4), 1280 << 10);
        assert_eq!(round_size(1 << 21, 4), 1 << 21);
        assert_eq!(pool_of(1 << 20), Pool::Small);
        assert_eq!(pool_of((1 << 20) + 512), Pool::Large);
        assert_eq!(segment_size(512), SMALL_BUFFER);
        assert_eq!(segment_size(5 << 20), LARGE_BUFFER);
        assert_eq!(segment_size((11 << 20) + 1), 12 << 20);
    }

    #[test]
    fn checked_rounding_refuses_what_cannot_fit() {
        let limit = 80 << 30;
        assert_eq!(checked_round_size(1, 0, limit), Some(512));
        assert_eq!(checked_round_size(1200 << 10, 4, limit), Some(1280 << 10));
        assert_eq!(checked_round_size(limit, 0, limit), Some(limit));
        assert_eq!(checked_round_size(limit + 1, 0, limit), None);
        for size in [u64::MAX, u64::MAX - 511, 1 << 63, MAX_REQUEST + 1] {
            for divisions in [0, 4, 16] {
                assert_eq!(
                    checked_round_size(size, divisions, u64::MAX),
                    None,
                    "{size}"
                );
            }
        }
        assert_eq!(
            checked_round_size(MAX_REQUEST, 0, u64::MAX),
            Some(MAX_REQUEST)
        );
    }
}
