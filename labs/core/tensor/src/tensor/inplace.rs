//! In place: what an optimizer, a checkpoint loader or a gradient bucket writes into a
//! tensor that already exists (`zero_`, `fill_`, bytes from the host; `copy_` is in
//! `views.rs`), the checks an op of the layers above runs on its arguments before it
//! writes, and whether two tensors are one view. Each write is enqueued on the device's
//! default stream and refused on a tensor that requires grad while autograd records
//! (it would change what the graph saved).

use super::{Element, Tensor};
use crate::dtype::FillPattern;
use crate::error::{Error, Result};

impl Tensor {
    /// Every element set to zero, in place (PyTorch's `zero_()`): one fill of the
    /// tensor's bytes when they are dense in memory (contiguous, or a transpose or
    /// permutation of a contiguous tensor), else a copy from a zero tensor into the view.
    /// A view that repeats elements (stride 0) is refused.
    pub fn zero_(&self) -> Result<()> {
        self.check_not_recording("zero_")?;
        if self.is_dense_in_memory() {
            return self.fill_pattern(FillPattern::U8(0), self.nbytes());
        }
        self.copy_(&Tensor::zeros(self.shape(), self.dtype, self.device())?)
    }

    /// Every element set to `value`, in place (PyTorch's `fill_`): `value`'s type must
    /// be the tensor's dtype (`fill_(1.0f32)` on a float32 tensor). Written as `zero_`
    /// writes.
    pub fn fill_<T: Element>(&self, value: T) -> Result<()> {
        self.check_not_recording("fill_")?;
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "fill_",
                a: self.dtype,
                b: T::DTYPE,
            });
        }
        if self.is_dense_in_memory() {
            return self.fill_pattern(value.pattern(), self.numel());
        }
        self.copy_(&Tensor::full(self.shape(), value, self.device())?)
    }

    /// Whether the elements fill `numel` consecutive slots from the first one (in some
    /// order): then a fill from `ptr()` writes exactly them.
    fn is_dense_in_memory(&self) -> bool {
        self.is_contiguous() || self.layout.dense_order().is_some()
    }

    fn fill_pattern(&self, pattern: FillPattern, count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let device = self.device();
        device
            .backend()
            .fill(self.ptr(), pattern, count, &device.current_stream()?)
    }

    /// Copies `bytes` from host memory into this contiguous tensor's bytes from
    /// `byte_offset` on, in place: a tensor filled piece by piece from a file without
    /// holding all of it in host memory. Returns once `bytes` may be reused.
    pub fn write_bytes(&self, byte_offset: usize, bytes: &[u8]) -> Result<()> {
        self.check_not_recording("write_bytes")?;
        self.check_contiguous("write_bytes")?;
        let end = byte_offset.checked_add(bytes.len());
        if end.is_none_or(|end| end > self.nbytes()) {
            return Err(Error::InvalidArgument(format!(
                "write_bytes: {} bytes at offset {byte_offset} do not fit a tensor of {} bytes",
                bytes.len(),
                self.nbytes()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let device = self.device();
        device.backend().copy_htod(
            self.ptr() + byte_offset as u64,
            bytes,
            &device.current_stream()?,
        )
    }

    /// Whether two tensors are one view: the same storage, dtype and layout (shape,
    /// strides, offset), as PyTorch's `a is b` holds for two handles of one tensor.
    pub fn is_same_view(&self, other: &Tensor) -> bool {
        self.shares_storage(other) && self.dtype == other.dtype && self.layout == other.layout
    }

    /// An error naming `op` unless the tensor is contiguous (dense row-major).
    pub fn check_contiguous(&self, op: &str) -> Result<()> {
        if !self.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "{op}: the tensor of shape {:?} is not contiguous (strides {:?})",
                self.shape(),
                self.strides()
            )));
        }
        Ok(())
    }

    /// An error naming `op` unless `other` has this tensor's shape.
    pub fn check_same_shape(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.shape() != other.shape() {
            return Err(Error::Shape {
                op,
                a: self.shape().to_vec(),
                b: other.shape().to_vec(),
            });
        }
        Ok(())
    }

    /// An error naming `op` unless `other` has this tensor's dtype.
    pub fn check_same_dtype(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.dtype != other.dtype {
            return Err(Error::DTypeMismatch {
                op,
                a: self.dtype,
                b: other.dtype,
            });
        }
        Ok(())
    }
}
