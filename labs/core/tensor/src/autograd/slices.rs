//! How a backward pass sums the gradients of one tensor's slices. A tensor read as
//! several `narrow`ed parts (GPT-2's `c_attn` output split into query, key and value
//! heads; `nn.MultiheadAttention`'s packed `in_proj_weight` split into three
//! projections) gets one gradient per part, each zero outside its part. Rather than
//! building each as a zeroed full-size tensor and adding them, the pass writes every
//! part's gradient into one zeroed buffer, in place: one copy per part, no full-size
//! additions, no buffer per part. The sum is the same, element by element (each
//! element has one nonzero term).
//!
//! Only a buffer this pass made itself, and only parts that do not overlap the ones
//! already written, are written in place; anything else (a gradient accumulated from
//! a previous pass, a contribution over the whole tensor) is added as before.

use std::collections::HashMap;

use super::derivatives::narrow_backward;
use crate::error::Result;
use crate::tensor::Tensor;

/// One gradient for a tensor: over all of it, or over the part `narrow(dim, start,
/// len)` of it (with `full` entries along `dim`), `len` being `grad`'s size there.
pub(super) enum Contribution {
    Whole(Tensor),
    Part {
        grad: Tensor,
        dim: usize,
        start: usize,
        full: usize,
    },
}

/// The buffers this pass made from parts, by the gradient they hold (a pending node's
/// or a leaf's): the dimension they were cut along and the parts written so far. Every
/// element outside those parts is zero, and nothing outside the pass holds the buffer.
#[derive(Default)]
pub(super) struct PartBuffers {
    written: HashMap<usize, (usize, Vec<(usize, usize)>)>,
}

impl PartBuffers {
    /// `current + contribution` for the gradient keyed `key`: written in place into
    /// `current` when it is a buffer of parts and the contribution a part that does not
    /// overlap the others, else a new tensor. `dense` makes a whole first contribution
    /// dense (a leaf's `.grad`).
    pub(super) fn add(
        &mut self,
        key: usize,
        current: Option<Tensor>,
        contribution: Contribution,
        dense: bool,
    ) -> Result<Tensor> {
        match contribution {
            Contribution::Whole(g) => {
                self.written.remove(&key);
                match current {
                    None if dense => g.contiguous(),
                    None => Ok(g),
                    Some(prev) => prev.add(&g),
                }
            }
            Contribution::Part {
                grad,
                dim,
                start,
                full,
            } => {
                let len = grad.shape()[dim];
                let Some(prev) = current else {
                    let buffer = narrow_backward(&grad, dim, start, full)?;
                    if len < full {
                        self.written.insert(key, (dim, vec![(start, len)]));
                    }
                    return Ok(buffer);
                };
                let fits = self.written.get(&key).is_some_and(|(d, parts)| {
                    *d == dim
                        && prev.shape()[dim] == full
                        && prev.dtype() == grad.dtype()
                        && parts
                            .iter()
                            .all(|&(s, l)| start + len <= s || s + l <= start)
                });
                if fits {
                    prev.narrow(dim, start, len)?.scatter_(&grad)?;
                    if let Some((_, parts)) = self.written.get_mut(&key) {
                        parts.push((start, len));
                    }
                    return Ok(prev);
                }
                self.written.remove(&key);
                prev.add(&narrow_backward(&grad, dim, start, full)?)
            }
        }
    }
}
