//! Host tensors in pinned memory (`tensor.pin_memory()`), non-blocking copies
//! (`tensor.to(device, non_blocking=True)`), and mapped host memory.

use std::sync::Arc;

use super::allocator::{HostAllocator, PinnedBuffer};
use crate::device::{Device, DevicePtr, HostPtr, Stream};
use crate::error::{Error, Result};
use crate::tensor::{DType, Element, Tensor};

/// A host tensor whose storage is a pinned block of a GPU's host allocator. The GPU's
/// copy engines read it directly, so copies from it are truly asynchronous.
#[derive(Clone)]
pub struct PinnedTensor {
    buffer: Arc<PinnedBuffer>,
    shape: Vec<usize>,
    dtype: DType,
}

impl PinnedTensor {
    /// Uninitialised pinned memory for `shape` elements of `dtype`, from the host
    /// allocator of `device` (the GPU it will be copied to).
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<PinnedTensor> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        let buffer = HostAllocator::get(device).allocate(bytes)?;
        Ok(PinnedTensor {
            buffer: Arc::new(buffer),
            shape: shape.to_vec(),
            dtype,
        })
    }

    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Self> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(Error::InvalidArgument(format!(
                "{} values do not fill shape {shape:?}",
                data.len()
            )));
        }
        let mut t = PinnedTensor::empty(shape, T::DTYPE, device)?;
        t.as_mut_slice::<T>()?.copy_from_slice(data);
        Ok(t)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn nbytes(&self) -> usize {
        self.buffer.len()
    }
    pub fn is_pinned(&self) -> bool {
        true
    }
    pub fn as_ptr(&self) -> HostPtr {
        self.buffer.as_ptr()
    }
    pub fn buffer(&self) -> &PinnedBuffer {
        &self.buffer
    }

    fn check<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::InvalidArgument(format!(
                "a {} view of a pinned tensor of dtype {}",
                T::DTYPE,
                self.dtype
            )));
        }
        Ok(())
    }

    /// The elements. Only meaningful once copies into the tensor have completed.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check::<T>()?;
        let n = self.shape.iter().product();
        // SAFETY: page-aligned memory of `n` elements, owned by the buffer.
        Ok(unsafe { std::slice::from_raw_parts(self.buffer.as_ptr() as *const T, n) })
    }

    /// Mutable elements; refused while another handle shares the storage.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check::<T>()?;
        let n = self.shape.iter().product();
        let buffer = Arc::get_mut(&mut self.buffer).ok_or_else(|| {
            Error::InvalidArgument("the pinned tensor's storage is shared".into())
        })?;
        // SAFETY: as above, and exclusively borrowed.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(buffer.as_mut_slice().as_mut_ptr() as *mut T, n)
        })
    }

    // ANCHOR: to_non_blocking_pinned
    /// `tensor.to(device, non_blocking=True)` from pinned memory: returns as soon as the
    /// copy is queued on `stream`. The block is recorded on the stream, so dropping this
    /// tensor before the copy ends cannot hand its memory to someone else.
    pub fn to_non_blocking(&self, device: &Device, stream: &Stream) -> Result<Tensor> {
        let t = self.to_non_blocking_unrecorded(device, stream)?;
        // The new tensor comes from the default stream's pool but is written on
        // `stream`: without this, dropping it early could recycle it under the copy.
        t.record_stream(stream)?;
        Ok(t)
    }
    // ANCHOR_END: to_non_blocking_pinned

    /// [`to_non_blocking`](Self::to_non_blocking) without recording the new tensor on
    /// `stream`: the caller makes every stream that uses it, or frees it, wait for the
    /// copy (an event recorded after it) first. Its memory is then given back in
    /// stream order when it is dropped, with no free pending on `stream` (a pending
    /// free is reusable only once the host sees the copy end, and the host runs ahead).
    pub(crate) fn to_non_blocking_unrecorded(
        &self,
        device: &Device,
        stream: &Stream,
    ) -> Result<Tensor> {
        let t = Tensor::empty(&self.shape, self.dtype, device)?;
        self.buffer
            .copy_to_device_async(t.ptr(), self.nbytes(), stream)?;
        Ok(t)
    }

    /// Enqueues a copy of a device tensor into this one (`out.copy_(t, non_blocking=True)`).
    pub fn copy_from_non_blocking(&mut self, src: &Tensor, stream: &Stream) -> Result<()> {
        self.copy_from_non_blocking_unrecorded(src, stream)?;
        // Recorded once queued: the free of `src` then waits for the copy.
        src.record_stream(stream)
    }

    /// [`copy_from_non_blocking`](Self::copy_from_non_blocking) without recording
    /// `src` on `stream`: the caller keeps `src` alive until the copy is done and makes
    /// the stream that frees it wait for the copy (an event) before dropping it.
    pub(crate) fn copy_from_non_blocking_unrecorded(
        &mut self,
        src: &Tensor,
        stream: &Stream,
    ) -> Result<()> {
        if src.nbytes() != self.nbytes() || src.dtype() != self.dtype {
            return Err(Error::Shape {
                op: "copy_from_non_blocking",
                a: self.shape.clone(),
                b: src.shape().to_vec(),
            });
        }
        let bytes = self.nbytes();
        let buffer = Arc::get_mut(&mut self.buffer).ok_or_else(|| {
            Error::InvalidArgument("the pinned tensor's storage is shared".into())
        })?;
        buffer.copy_from_device_async(src.ptr(), bytes, stream)
    }
}

impl std::fmt::Debug for PinnedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedTensor(shape={:?}, dtype={}, pinned for {})",
            self.shape,
            self.dtype,
            self.buffer.allocator().device()
        )
    }
}

impl Tensor {
    /// `tensor.pin_memory()`: a copy of this host tensor in pinned memory from the
    /// host allocator of `device`, the GPU it is meant for.
    pub fn pin_memory(&self, device: &Device) -> Result<PinnedTensor> {
        let mut t = PinnedTensor::empty(self.shape(), self.dtype(), device)?;
        let bytes = self.nbytes();
        let src = self.device();
        let buffer = Arc::get_mut(&mut t.buffer).expect("a new tensor is not shared");
        src.backend()
            .copy_dtoh(buffer.as_mut_slice(), self.ptr(), &src.current_stream()?)?;
        debug_assert_eq!(bytes, t.nbytes());
        Ok(t)
    }

    // ANCHOR: to_non_blocking_pageable
    /// `tensor.to(device, non_blocking=True)` from an ordinary host tensor. The bytes
    /// are pageable, so the driver has to stage them through its own pinned buffer:
    /// the call returns only once the data has been read, asynchronous in name only.
    pub fn to_non_blocking(&self, device: &Device, stream: &Stream) -> Result<Tensor> {
        if self.device().id() == device.id() {
            return Ok(self.clone());
        }
        let mut host = vec![0u8; self.nbytes()];
        let src = self.device();
        src.backend()
            .copy_dtoh(&mut host, self.ptr(), &src.current_stream()?)?;
        let t = Tensor::empty(self.shape(), self.dtype(), device)?;
        t.record_stream(stream)?;
        // SAFETY: pageable memory is staged before the call returns, so `host` may go.
        unsafe {
            device
                .backend()
                .copy_htod_async(t.ptr(), host.as_ptr(), host.len(), stream)?
        };
        Ok(t)
    }
    // ANCHOR_END: to_non_blocking_pageable
}

// ANCHOR: mapped_buffer
/// Pinned host memory mapped into the device's address space: a kernel given
/// `device_ptr()` reads and writes host RAM over the bus, no copy involved. This is
/// what Windows shows as "shared GPU memory".
pub struct MappedBuffer {
    device: Device,
    host: HostPtr,
    device_ptr: DevicePtr,
    bytes: usize,
}
// ANCHOR_END: mapped_buffer

// SAFETY: owns its memory like a `Box<[u8]>`.
unsafe impl Send for MappedBuffer {}
unsafe impl Sync for MappedBuffer {}

impl MappedBuffer {
    pub fn new(device: &Device, bytes: usize) -> Result<MappedBuffer> {
        let backend = device.backend();
        let host = backend.host_alloc(bytes, true)?;
        let device_ptr = match backend.host_device_ptr(host) {
            Ok(d) => d,
            Err(e) => {
                let _ = backend.host_free(host);
                return Err(e);
            }
        };
        Ok(MappedBuffer {
            device: device.clone(),
            host,
            device_ptr,
            bytes,
        })
    }
    pub fn device_ptr(&self) -> DevicePtr {
        self.device_ptr
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The bytes as the host sees them; synchronise with kernels that write them first.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: live memory of `bytes` bytes.
        unsafe { std::slice::from_raw_parts(self.host, self.bytes) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.bytes) }
    }
}

impl Drop for MappedBuffer {
    fn drop(&mut self) {
        // cuMemFreeHost does not wait for kernels that use the memory: do it here.
        let _ = self.device.synchronize();
        if let Err(e) = self.device.backend().host_free(self.host) {
            eprintln!("warning: freeing mapped memory on {}: {e}", self.device);
        }
    }
}
