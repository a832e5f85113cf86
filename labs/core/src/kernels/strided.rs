//! The launch form of a strided layout: what the strided-copy kernel needs to find each
//! element of a view, in a fixed-size record that is passed to the GPU by value.

use crate::error::{Error, Result};

/// Views of more dimensions than this are refused (PyTorch's CUDA kernels have a
/// limit of 25; eight covers every tensor of the labs with room to spare).
pub const MAX_DIMS: usize = 8;

/// Shape and strides (in elements) of a view, row-major. Mirrors `struct Strided` in
/// `kernels/strided.cu`: the same field order and widths, no padding.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    pub rank: u64,
    pub shape: [u64; MAX_DIMS],
    pub strides: [i64; MAX_DIMS],
}

impl Strided {
    pub fn new(shape: &[usize], strides: &[isize]) -> Result<Strided> {
        if shape.len() != strides.len() || shape.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "a strided view needs one stride per dimension and at most {MAX_DIMS} \
                 dimensions, got shape {shape:?} and strides {strides:?}"
            )));
        }
        let mut s = Strided {
            rank: shape.len() as u64,
            shape: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        for (d, (&size, &stride)) in shape.iter().zip(strides).enumerate() {
            s.shape[d] = size as u64;
            s.strides[d] = stride as i64;
        }
        Ok(s)
    }

    /// The same view with fewer dimensions where it can have them: size-1 dimensions
    /// dropped, and each dimension merged into the one before it when the two step
    /// through memory as one (`stride[d] == stride[d + 1] * shape[d + 1]`). Element `i`
    /// lies at the same offset in both, so a copy over either moves the same bytes, and
    /// the merged one divides less per element: the query part `[B, T, H, D]` of packed
    /// heads `[B, T, 3 H, D]` is `[B T, H D]` rows of a longer stride.
    pub fn coalesced(&self) -> Strided {
        let mut out = Strided {
            rank: 0,
            shape: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
        };
        if self.numel() == 0 {
            return *self;
        }
        for (size, stride) in self.dims().filter(|&(size, _)| size != 1) {
            let r = out.rank as usize;
            if r > 0 && out.strides[r - 1] == stride * size as i64 {
                out.shape[r - 1] *= size;
                out.strides[r - 1] = stride;
            } else {
                out.shape[r] = size;
                out.strides[r] = stride;
                out.rank += 1;
            }
        }
        out
    }

    fn dims(&self) -> impl DoubleEndedIterator<Item = (u64, i64)> + '_ {
        let rank = self.rank as usize;
        self.shape[..rank]
            .iter()
            .copied()
            .zip(self.strides[..rank].iter().copied())
    }

    pub fn numel(&self) -> usize {
        self.dims().map(|(size, _)| size as usize).product()
    }

    // ANCHOR: strided_offset
    /// The element offset, from the view's first element, of the `i`-th element in
    /// row-major order (the same arithmetic as `strided_offset` in `strided.cu`).
    pub fn offset(&self, mut i: u64) -> i64 {
        let mut offset = 0;
        for (size, stride) in self.dims().rev() {
            offset += (i % size) as i64 * stride;
            i /= size;
        }
        offset
    }
    // ANCHOR_END: strided_offset

    /// The span of elements the view touches, from its lowest to its highest offset
    /// relative to the first element: `(lowest, count)`. Empty views touch nothing.
    pub fn extent(&self) -> (i64, usize) {
        if self.numel() == 0 {
            return (0, 0);
        }
        let (mut low, mut high) = (0i64, 0i64);
        for (size, stride) in self.dims() {
            let reach = (size as i64 - 1) * stride;
            if reach < 0 {
                low += reach;
            } else {
                high += reach;
            }
        }
        (low, (high - low + 1) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_walk_a_transposed_matrix_column_by_column() {
        // A 2x3 row-major matrix viewed as its 3x2 transpose.
        let t = Strided::new(&[3, 2], &[1, 3]).unwrap();
        let offsets: Vec<i64> = (0..6).map(|i| t.offset(i)).collect();
        assert_eq!(offsets, [0, 3, 1, 4, 2, 5]);
        assert_eq!(t.extent(), (0, 6));
        assert_eq!(std::mem::size_of::<Strided>(), 8 + 16 * MAX_DIMS);
    }

    #[test]
    fn coalescing_merges_dimensions_that_step_as_one_and_keeps_every_offset() {
        let views = [
            // Dense: one dimension.
            Strided::new(&[2, 3, 4], &[12, 4, 1]).unwrap(),
            // Heads narrowed from packed [2, 5, 3 * 4 * 8]: rows of 4 * 8 stay whole.
            Strided::new(&[2, 5, 4, 8], &[480, 96, 8, 1]).unwrap(),
            // Transposed last two dimensions: nothing to merge.
            Strided::new(&[3, 4, 5], &[20, 1, 4]).unwrap(),
            // Size-1 dimensions with any stride, and a broadcast one.
            Strided::new(&[1, 3, 1, 4], &[99, 4, 7, 1]).unwrap(),
            Strided::new(&[3, 2, 4], &[4, 0, 1]).unwrap(),
        ];
        let ranks: Vec<u64> = views.iter().map(|v| v.coalesced().rank).collect();
        assert_eq!(ranks, [1, 2, 3, 1, 3]);
        for v in views {
            let c = v.coalesced();
            assert_eq!(c.numel(), v.numel());
            for i in 0..v.numel() as u64 {
                assert_eq!(c.offset(i), v.offset(i), "{v:?} at {i}");
            }
        }
        let empty = Strided::new(&[0, 3], &[3, 1]).unwrap();
        assert_eq!(empty.coalesced(), empty);
    }

    #[test]
    fn broadcast_dimensions_repeat_and_empty_views_touch_nothing() {
        let e = Strided::new(&[2, 3], &[0, 1]).unwrap();
        let offsets: Vec<i64> = (0..6).map(|i| e.offset(i)).collect();
        assert_eq!(offsets, [0, 1, 2, 0, 1, 2]);
        assert_eq!(e.extent(), (0, 3));
        assert_eq!(Strided::new(&[4, 0], &[1, 1]).unwrap().extent(), (0, 0));
        assert!(Strided::new(&[1; 9], &[1; 9]).is_err());
        assert!(Strided::new(&[2], &[1, 1]).is_err());
    }
}
