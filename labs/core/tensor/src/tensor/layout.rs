//! Where a tensor's elements lie in its storage: a shape, a stride per dimension (in
//! elements) and the offset of the first element. Views (transpose, narrow, expand,
//! reshape of contiguous data) are new layouts over the same storage.

use crate::error::{Error, Result};
use crate::kernels::Strided;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// The number of elements of `shape`, or an error if it overflows.
pub(crate) fn numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} has too many elements")))
}

/// Row-major strides of a dense tensor of `shape`.
fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

impl Layout {
    /// A dense row-major layout starting at `offset`.
    pub fn contiguous(shape: &[usize], offset: usize) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// The storage element where the view starts.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Dense and row-major, so that element `i` is storage element `offset + i`.
    /// Dimensions of size 1 may have any stride, and an empty view is contiguous.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size;
        }
        true
    }

    /// For a view that is a reordering of dense row-major memory (a transpose or
    /// permutation of a contiguous tensor), the order of dimensions `order` such that
    /// `permute(order)` is contiguous; `None` for any other layout, and for one that
    /// is contiguous already (nothing to reorder).
    pub fn dense_order(&self) -> Option<Vec<usize>> {
        if self.is_contiguous() {
            return None;
        }
        let rank = self.shape.len();
        // Outermost first: larger strides first; size-1 dimensions anywhere stable.
        let mut order: Vec<usize> = (0..rank).collect();
        order.sort_by_key(|&d| (std::cmp::Reverse(self.strides[d]), d));
        let permuted = self.permute(&order).ok()?;
        permuted.is_contiguous().then_some(order)
    }

    /// One past the last storage element the view can touch (what its storage must hold).
    pub fn end(&self) -> usize {
        if self.numel() == 0 {
            return self.offset;
        }
        let reach: usize = self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&size, &stride)| (size - 1) * stride)
            .sum();
        self.offset + reach + 1
    }

    pub(crate) fn check_dim(&self, op: &str, dim: usize) -> Result<()> {
        if dim >= self.shape.len() {
            return Err(Error::InvalidArgument(format!(
                "{op}: dimension {dim} out of range for shape {:?}",
                self.shape
            )));
        }
        Ok(())
    }

    /// Dimensions `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Layout> {
        self.check_dim("transpose", a)?;
        self.check_dim("transpose", b)?;
        let mut t = self.clone();
        t.shape.swap(a, b);
        t.strides.swap(a, b);
        Ok(t)
    }

    /// The dimensions reordered: dimension `i` of the result is dimension `dims[i]`.
    pub fn permute(&self, dims: &[usize]) -> Result<Layout> {
        let mut seen = vec![false; self.shape.len()];
        for &d in dims {
            if d >= seen.len() || std::mem::replace(&mut seen[d], true) {
                return Err(Error::InvalidArgument(format!(
                    "permute: {dims:?} is not an order of the {} dimensions of shape {:?}",
                    self.shape.len(),
                    self.shape
                )));
            }
        }
        if dims.len() != self.shape.len() {
            return Err(Error::InvalidArgument(format!(
                "permute: {dims:?} names {} dimensions, shape {:?} has {}",
                dims.len(),
                self.shape,
                self.shape.len()
            )));
        }
        Ok(Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        })
    }

    /// `len` entries of dimension `dim` from `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        self.check_dim("narrow", dim)?;
        if start
            .checked_add(len)
            .is_none_or(|end| end > self.shape[dim])
        {
            return Err(Error::InvalidArgument(format!(
                "narrow: {start}..{start}+{len} is outside dimension {dim} of shape {:?}",
                self.shape
            )));
        }
        let mut n = self.clone();
        n.offset += start * self.strides[dim];
        n.shape[dim] = len;
        Ok(n)
    }

    /// Size-1 dimensions repeated to `shape` with stride 0 (no data is copied); new
    /// leading dimensions may be added, as in PyTorch's `expand`.
    pub fn expand(&self, shape: &[usize]) -> Result<Layout> {
        let fail = || {
            Error::InvalidArgument(format!(
                "expand: shape {:?} cannot be expanded to {shape:?}",
                self.shape
            ))
        };
        let extra = shape.len().checked_sub(self.shape.len()).ok_or_else(fail)?;
        let mut strides = vec![0; shape.len()];
        for (d, &size) in shape.iter().enumerate().skip(extra) {
            let (old, stride) = (self.shape[d - extra], self.strides[d - extra]);
            strides[d] = match (old, size) {
                (o, s) if o == s => stride,
                (1, _) => 0,
                _ => return Err(fail()),
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// The same elements in row-major order under another shape: only for contiguous
    /// layouts (otherwise the caller copies first, as `reshape` does).
    pub fn view(&self, shape: &[usize]) -> Result<Layout> {
        if numel(shape)? != self.numel() {
            return Err(Error::Shape {
                op: "view",
                a: self.shape.clone(),
                b: shape.to_vec(),
            });
        }
        if !self.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "view: a non-contiguous tensor of shape {:?} (strides {:?}) cannot be viewed \
                 as {shape:?}; use reshape, which copies",
                self.shape, self.strides
            )));
        }
        Ok(Layout::contiguous(shape, self.offset))
    }

    /// The launch form for the strided-copy kernel.
    pub fn strided(&self) -> Result<Strided> {
        let strides: Vec<isize> = self.strides.iter().map(|&s| s as isize).collect();
        Strided::new(&self.shape, &strides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layouts_are_row_major() {
        let l = Layout::contiguous(&[2, 3, 4], 5);
        assert_eq!(l.strides(), [12, 4, 1]);
        assert!(l.is_contiguous());
        assert_eq!(l.end(), 5 + 24);
        assert_eq!(Layout::contiguous(&[], 0).numel(), 1);
    }

    #[test]
    fn transpose_and_narrow_change_strides_and_offset_only() {
        let l = Layout::contiguous(&[2, 3], 0);
        let t = l.transpose(0, 1).unwrap();
        assert_eq!((t.shape(), t.strides()), (&[3, 2][..], &[1, 3][..]));
        assert!(!t.is_contiguous());
        assert_eq!(t.end(), 6);
        let n = l.narrow(1, 1, 2).unwrap();
        assert_eq!((n.shape(), n.offset()), (&[2, 2][..], 1));
        assert!(!n.is_contiguous());
        // Narrowing the leading dimension keeps rows dense.
        assert!(l.narrow(0, 1, 1).unwrap().is_contiguous());
        assert!(l.narrow(1, 2, 2).is_err());
        assert!(l.transpose(0, 2).is_err());
    }

    #[test]
    fn expand_broadcasts_size_one_dimensions_with_stride_zero() {
        let l = Layout::contiguous(&[3, 1], 0);
        let e = l.expand(&[2, 3, 4]).unwrap();
        assert_eq!(e.strides(), [0, 1, 0]);
        assert_eq!(e.end(), 3);
        assert!(l.expand(&[3, 2, 1]).is_err());
        assert!(l.expand(&[1]).is_err());
    }

    #[test]
    fn view_needs_contiguity_and_the_same_element_count() {
        let l = Layout::contiguous(&[4, 6], 2);
        assert_eq!(l.view(&[2, 12]).unwrap().offset(), 2);
        assert!(matches!(l.view(&[5, 5]), Err(Error::Shape { .. })));
        assert!(l.transpose(0, 1).unwrap().view(&[24]).is_err());
    }
}
