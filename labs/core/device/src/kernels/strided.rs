//! The launch form of a strided layout: what the strided-copy kernel needs to find each
//! element of a view, in a fixed-size record that is passed to the GPU by value.

use crate::device_id::DevicePtr;
use crate::error::{Error, Result};

/// Views of more dimensions than this are refused (PyTorch's CUDA kernels have a
/// limit of 25; eight covers every tensor of the labs with room to spare).
pub const MAX_DIMS: usize = 8;

/// The side, in elements, of the square tiles the GPU transposes through shared memory
/// (`STRIDED_TILE` in `kernels/strided.cu`).
pub const TILE: usize = 32;

/// The smallest size of both tiled dimensions for which a transpose goes through tiles:
/// below it the plain kernel's reads already come in runs of several elements, and
/// tiles would be mostly empty.
pub const TILED_MIN_SIZE: u64 = 8;

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

    /// Whether a copy or scatter of this view with elements of `width` bytes between
    /// `src` and `dst` can move 16 bytes at a time: the last dimension contiguous and a
    /// whole number of vectors long, every other stride (of a dimension longer than 1) a
    /// whole number of vectors, both addresses 16-byte aligned. The same rule as
    /// `moves_in_vectors` in `kernels/strided.cu`, which decides on the GPU; the host
    /// sizes the grid by it (one thread per vector).
    pub fn moves_in_vectors(&self, width: usize, src: DevicePtr, dst: DevicePtr) -> bool {
        let rank = self.rank as usize;
        if !matches!(width, 1 | 2 | 4 | 8) || rank == 0 || rank > MAX_DIMS {
            return false;
        }
        let v = (16 / width) as i64;
        let last = rank - 1;
        (src | dst).is_multiple_of(16)
            && self.strides[last] == 1
            && self.shape[last].is_multiple_of(v as u64)
            && (0..last).all(|d| self.shape[d] == 1 || self.strides[d] % v == 0)
    }

    /// The dimension a tiled transpose of this view runs along, if it is one: a view
    /// whose last dimension is neither contiguous nor repeated (stride not 0 or +-1)
    /// while an earlier one is contiguous (the innermost such), both at least
    /// [`TILED_MIN_SIZE`] long. Element by element, a warp would touch one element per
    /// 32-byte sector of the strided side; tiles read along the contiguous dimension and
    /// write along the last, whole sectors on both sides.
    pub fn transposed_dim(&self) -> Option<usize> {
        let rank = self.rank as usize;
        if !(2..=MAX_DIMS).contains(&rank) {
            return None;
        }
        let last = rank - 1;
        if matches!(self.strides[last], -1..=1) || self.shape[last] < TILED_MIN_SIZE {
            return None;
        }
        (0..last)
            .rev()
            .find(|&d| self.strides[d].abs() == 1 && self.shape[d] >= TILED_MIN_SIZE)
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
    fn vectors_need_a_contiguous_last_dimension_of_whole_vectors_and_aligned_ends() {
        let rows = Strided::new(&[8, 8, 100, 32], &[76800, 32, 768, 1]).unwrap();
        assert!(rows.moves_in_vectors(4, 0x1000, 0x2000));
        assert!(rows.moves_in_vectors(8, 0x1000, 0x2000));
        // An address off 16 bytes, an element too wide or too odd.
        assert!(!rows.moves_in_vectors(4, 0x1004, 0x2000));
        assert!(!rows.moves_in_vectors(4, 0x1000, 0x2008));
        assert!(!rows.moves_in_vectors(16, 0x1000, 0x2000));
        assert!(!rows.moves_in_vectors(3, 0x1000, 0x2000));
        // Rows of 12 elements: 1.5 vectors of 2-byte elements, 0.75 of bytes; 3 of
        // 4-byte ones.
        let short = Strided::new(&[5, 12], &[16, 1]).unwrap();
        assert!(!short.moves_in_vectors(2, 0, 0));
        assert!(!short.moves_in_vectors(1, 0, 0));
        assert!(short.moves_in_vectors(4, 0, 0));
        // An outer stride that is not a whole number of vectors, unless its size is 1.
        assert!(!Strided::new(&[3, 8], &[10, 1])
            .unwrap()
            .moves_in_vectors(4, 0, 0));
        assert!(Strided::new(&[1, 8], &[10, 1])
            .unwrap()
            .moves_in_vectors(4, 0, 0));
        // Broadcast rows, negative outer strides: whole vectors all the same.
        assert!(Strided::new(&[3, 8], &[0, 1])
            .unwrap()
            .moves_in_vectors(4, 0, 0));
        assert!(Strided::new(&[3, 8], &[-8, 1])
            .unwrap()
            .moves_in_vectors(4, 0, 0));
        // A transposed last dimension, and the scalar of rank 0.
        assert!(!Strided::new(&[8, 8], &[1, 8])
            .unwrap()
            .moves_in_vectors(4, 0, 0));
        assert!(!Strided::new(&[], &[]).unwrap().moves_in_vectors(4, 0, 0));
    }

    #[test]
    fn transposes_are_tiled_along_their_innermost_contiguous_dimension() {
        let dim = |shape: &[usize], strides: &[isize]| {
            Strided::new(shape, strides).unwrap().transposed_dim()
        };
        // [B, T, D] read as [B, D, T].
        assert_eq!(dim(&[4, 64, 100], &[6400, 1, 64]), Some(1));
        assert_eq!(dim(&[64, 100], &[1, 64]), Some(0));
        // A reversed contiguous dimension reads whole sectors as well.
        assert_eq!(dim(&[64, 100], &[-1, 64]), Some(0));
        // Of two contiguous candidates, the inner one.
        assert_eq!(dim(&[9, 9, 100], &[1, 1, 9]), Some(1));
        // Not transposes: a contiguous, reversed or repeated last dimension, no
        // contiguous dimension, a rank of 1.
        assert_eq!(dim(&[64, 100], &[100, 1]), None);
        assert_eq!(dim(&[64, 100], &[100, -1]), None);
        assert_eq!(dim(&[64, 100], &[1, 0]), None);
        assert_eq!(dim(&[64, 100], &[400, 2]), None);
        assert_eq!(dim(&[100], &[3]), None);
        // Too short to fill tiles on either side.
        assert_eq!(dim(&[7, 100], &[1, 7]), None);
        assert_eq!(dim(&[100, 7], &[1, 100]), None);
        assert_eq!(dim(&[8, 8], &[1, 8]), Some(0));
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
