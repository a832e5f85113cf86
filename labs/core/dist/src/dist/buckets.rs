//! How data-parallel training groups gradients for its all-reduces (PyTorch's
//! `compute_bucket_assignment_by_size`): parameters are taken in *reverse*
//! registration order, since backward produces the last layers' gradients first, so
//! that the first bucket fills, and its all-reduce starts, while backward still works on
//! the layers below. Each bucket holds one dtype (it is one flat buffer), and holds at
//! most its cap in bytes: the first bucket of each dtype is small
//! (`first_bucket_bytes_cap`, 1 MiB), so that communication starts early; the later ones
//! are larger (`bucket_cap_mb`, 25 MiB), so that each all-reduce is long enough to run
//! near the link's bandwidth. A parameter larger than the cap has a bucket of its own.

use std::collections::HashMap;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// PyTorch's `bucket_cap_mb` default: 25 MiB.
pub const DEFAULT_BUCKET_CAP_MB: f64 = 25.0;

/// PyTorch's `first_bucket_bytes_cap` default: 1 MiB.
pub const DEFAULT_FIRST_BUCKET_BYTES_CAP: usize = 1 << 20;

/// One parameter as the assignment sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketInput {
    pub dtype: DType,
    pub numel: usize,
}

// ANCHOR: assign_buckets
/// The parameter indices of each bucket, in bucket order: the order in which their
/// gradients are expected during backward, so the order in which they are reduced.
/// Within a bucket, the indices are in reverse registration order as well.
pub fn assign_buckets(
    params: &[BucketInput],
    first_bucket_bytes_cap: usize,
    bucket_cap_bytes: usize,
) -> Result<Vec<Vec<usize>>> {
    if first_bucket_bytes_cap == 0 || bucket_cap_bytes == 0 {
        return Err(Error::InvalidArgument(format!(
            "bucket caps must be positive (first bucket {first_bucket_bytes_cap} bytes, \
             others {bucket_cap_bytes} bytes)"
        )));
    }
    // Per dtype: the open bucket (its position in `buckets`, its bytes) and whether a
    // bucket of that dtype was closed already (the later ones take the larger cap).
    let mut open: HashMap<DType, (usize, usize, bool)> = HashMap::new();
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    for (i, p) in params.iter().enumerate().rev() {
        let bytes = p.numel * p.dtype.size();
        let entry = open.entry(p.dtype).or_insert((usize::MAX, 0, false));
        let cap = if entry.2 {
            bucket_cap_bytes
        } else {
            first_bucket_bytes_cap
        };
        if entry.0 != usize::MAX && entry.1 + bytes > cap {
            // Full: the next one of this dtype is opened below, with the larger cap.
            *entry = (usize::MAX, 0, true);
        }
        if entry.0 == usize::MAX {
            entry.0 = buckets.len();
            buckets.push(Vec::new());
        }
        entry.1 += bytes;
        buckets[entry.0].push(i);
    }
    Ok(buckets)
}
// ANCHOR_END: assign_buckets

/// Megabytes (PyTorch's MiB) to bytes, refused when not a positive finite number.
pub fn cap_bytes(bucket_cap_mb: f64) -> Result<usize> {
    if !(bucket_cap_mb.is_finite() && bucket_cap_mb > 0.0) {
        return Err(Error::InvalidArgument(format!(
            "bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb}"
        )));
    }
    Ok(((bucket_cap_mb * (1 << 20) as f64) as usize).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(numels: &[usize]) -> Vec<BucketInput> {
        numels
            .iter()
            .map(|&numel| BucketInput {
                dtype: DType::F32,
                numel,
            })
            .collect()
    }

    #[test]
    fn reverse_order_first_cap_then_cap() {
        // 4-byte elements: the first bucket holds up to 40 bytes, the others 80.
        let b = assign_buckets(&f32s(&[5, 5, 10, 10, 5, 5]), 40, 80).unwrap();
        assert_eq!(b, vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
    }

    #[test]
    fn a_parameter_larger_than_the_cap_is_alone() {
        let b = assign_buckets(&f32s(&[1, 100, 1]), 8, 8).unwrap();
        assert_eq!(b, vec![vec![2], vec![1], vec![0]]);
    }

    #[test]
    fn one_dtype_per_bucket() {
        let mut p = f32s(&[1, 1, 1]);
        p[1].dtype = DType::F16;
        let b = assign_buckets(&p, 1 << 20, 1 << 20).unwrap();
        assert_eq!(b, vec![vec![2, 0], vec![1]]);
    }

    #[test]
    fn bad_caps_are_refused() {
        assert!(assign_buckets(&f32s(&[1]), 0, 8).is_err());
        assert!(cap_bytes(0.0).is_err());
        assert!(cap_bytes(f64::NAN).is_err());
        assert_eq!(cap_bytes(25.0).unwrap(), 25 << 20);
    }
}
