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
    /// tensor's bytes. The tensor must be contiguous.
    pub fn zero_(&self) -> Result<()> {
        self.check_not_recording("zero_")?;
        self.check_contiguous("zero_")?;
        self.fill_pattern(FillPattern::U8(0), self.nbytes())
    }

    /// Every element set to `value`, in place (PyTorch's `fill_`): `value`'s type must
    /// be the tensor's dtype (`fill_(1.0f32)` on a float32 tensor). The tensor must be
    /// contiguous.
    pub fn fill_<T: Element>(&self, value: T) -> Result<()> {
        self.check_not_recording("fill_")?;
        self.check_contiguous("fill_")?;
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "fill_",
                a: self.dtype,
                b: T::DTYPE,
            });
        }
        self.fill_pattern(value.pattern(), self.numel())
    }

    fn fill_pattern(&self, pattern: FillPattern, count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let device = self.device();
        device
            .backend()
            .fill(self.ptr(), pattern, count, &device.default_stream()?)
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
            &device.default_stream()?,
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
