//! Tensors: a dtype and a [`Layout`] (shape, strides, offset) over a storage shared by
//! every view of it. Placement follows PyTorch: `to(device)` returns the same tensor
//! when it is already there and copies otherwise, and an operation on tensors of two
//! devices is an error.

mod attention;
mod attention_chunked;
mod attention_path;
mod autocast;
mod broadcast;
mod cast;
mod collective;
mod compare;
mod concat;
mod dropout;
pub mod fused;
mod graph;
mod host_reads;
mod index;
mod inplace;
mod layout;
mod linear_cross_entropy;
mod loss;
mod matmul;
mod mixed;
mod norm;
mod ops;
mod pointwise;
mod promote;
mod reduce;
mod saved_hooks;
mod softmax;
mod stats;
mod storage;
mod views;

/// What a tensor's memory is counted as ([`Tensor::category`]; a scope makes new
/// tensors count as one).
pub use crate::alloc::Category;
pub use crate::dtype::{DType, Element};
/// The largest head size the fused attention kernel serves.
pub use crate::kernels::ATTENTION_MAX_HEAD_DIM;
pub use attention_path::{
    attention_path, path_for, set_attention_chunk_bytes, set_attention_path, AttentionPath,
    DEFAULT_CHUNK_BYTES,
};
pub use autocast::{
    autocast, autocast_cache_len, autocast_disabled, autocast_dtype, cast_policy,
    clear_autocast_cache, ops_with, AutocastGuard, AutocastOp, CastPolicy,
};
pub(crate) use autocast::{autocast_args, engine_autocast};
pub use broadcast::broadcast_shapes;
pub use collective::run_collective;
pub use graph::{
    enable_grad, is_grad_enabled, no_grad, Edge, GradCell, GradHook, GradOp, GradSlot, NoGradGuard,
    Node, PostAccumulateGradHook,
};
pub use host_reads::host_reads;
pub use layout::Layout;
pub use loss::IGNORE_INDEX;
pub use matmul::MatmulOptions;
pub use promote::{is_floating_point, promote_types, result_type, Scalar};
pub use saved_hooks::{
    current_saved_tensors_hooks, push_saved_tensors_hooks, Packed, PackedSaved, Packs,
    SavedTensorsHooks, SavedTensorsHooksGuard,
};

use std::sync::{Arc, Weak};

use crate::alloc::Allocation;
use crate::device::{copy_between, CopyPath, CopyVia, Device, DevicePtr};
use crate::error::{Error, Result};
use storage::Storage;

/// A weak name for a tensor's storage ([`Tensor::storage_key`]). Held, it keeps the
/// storage's record (not its memory) from being reused, so two keys are equal exactly
/// when they name one storage.
#[derive(Clone)]
pub struct StorageKey(Weak<Storage>);

impl PartialEq for StorageKey {
    fn eq(&self, other: &StorageKey) -> bool {
        Weak::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StorageKey {}

impl std::hash::Hash for StorageKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.0.as_ptr() as usize).hash(state)
    }
}

impl std::fmt::Debug for StorageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StorageKey({:p})", self.0.as_ptr())
    }
}

// ANCHOR: tensor_struct
/// A tensor. Cloning is cheap and shares the storage, like a Python reference; views
/// (`transpose`, `narrow`, `expand`, `view`) share it too, with their own layout.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    /// The tensor's place in the autograd graph, if it needs a gradient.
    grad: Option<graph::Grad>,
}
// ANCHOR_END: tensor_struct

use layout::numel;

impl Tensor {
    // ANCHOR: tensor_empty
    /// Uninitialised memory for `shape` elements of `dtype` on `device`.
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let bytes = numel(shape)?
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} is too large")))?;
        // A tensor made outside any category scope is an op's temporary until autograd
        // saves it or the program says otherwise (`set_category`).
        let category = Category::current().unwrap_or(Category::Temporary);
        let block = device
            .allocator()?
            .malloc_as(bytes, &device.current_stream()?, category)?;
        Ok(Tensor {
            storage: Arc::new(Storage::new(device, block)),
            layout: Layout::contiguous(shape, 0),
            dtype,
            grad: None,
        })
    }
    // ANCHOR_END: tensor_empty

    /// What the tensor's storage is counted as in the allocator's statistics.
    pub fn category(&self) -> Result<Category> {
        self.device().allocator()?.category(&self.storage.held()?)
    }

    /// Counts the tensor's storage (shared by its views) as `category` from now on.
    pub fn set_category(&self, category: Category) -> Result<()> {
        self.device()
            .allocator()?
            .set_category(&self.storage.held()?, category)
    }

    /// Autograd saved this tensor for `op`'s backward: its storage is an activation
    /// now (unless it is a parameter or an input), saved by `op` in the memory history.
    pub(crate) fn mark_saved(&self, op: &GradOp) {
        if let Ok(allocator) = self.device().allocator() {
            // Only a stale handle fails, and a live tensor's is not; a freed storage
            // (a sharded parameter's) is no activation.
            if let Ok(block) = self.storage.held() {
                let _ = allocator.mark_saved(&block, || op.name());
            }
        }
    }

    /// Another layout over the same storage (the views' constructor).
    fn with_layout(&self, layout: Layout) -> Tensor {
        debug_assert!(layout.end() * self.dtype.size() <= self.storage.nbytes as usize);
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
            grad: None,
        }
    }

    /// Every element set to `value`.
    pub fn full<T: Element>(shape: &[usize], value: T, device: &Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, T::DTYPE, device)?;
        let stream = device.current_stream()?;
        device
            .backend()
            .fill(t.ptr(), value.pattern(), t.numel(), &stream)?;
        Ok(t)
    }

    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, dtype, device)?;
        let stream = device.current_stream()?;
        device.backend().fill(
            t.ptr(),
            crate::device::FillPattern::U8(0),
            t.nbytes(),
            &stream,
        )?;
        Ok(t)
    }

    /// A tensor holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        if numel(shape)? != data.len() {
            return Err(Error::InvalidArgument(format!(
                "{} values do not fill shape {shape:?}",
                data.len()
            )));
        }
        let t = Tensor::empty(shape, T::DTYPE, device)?;
        let stream = device.current_stream()?;
        device
            .backend()
            .copy_htod(t.ptr(), crate::dtype::as_bytes(data), &stream)?;
        Ok(t)
    }

    /// Standard-normal float32 samples. The same `(seed, shape)` gives the same values
    /// on every device (to within the last bits of the GPU's `logf`/`cosf`).
    pub fn randn(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        let t = Tensor::empty(shape, DType::F32, device)?;
        device.launch(&crate::kernels::Kernel::Randn {
            out: t.ptr(),
            n: t.numel(),
            seed,
            offset: 0,
        })?;
        Ok(t)
    }

    /// `torch.arange(start, start + n)`: int64 `[n]`, computed on the device (so that a
    /// captured graph can make it again; a copy of host values cannot be captured).
    pub fn arange(start: i64, n: usize, device: &Device) -> Result<Tensor> {
        let t = Tensor::empty(&[n], DType::I64, device)?;
        device.launch(&crate::kernels::Kernel::Arange {
            out: t.ptr(),
            n,
            start,
        })?;
        Ok(t)
    }

    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }
    /// Elements to step over in storage for one step along each dimension.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Dense row-major: element `i` follows element `i - 1` in memory.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> &Device {
        &self.storage.device
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// The device address of the first element (the storage's start plus the view's
    /// offset).
    ///
    /// # Panics
    ///
    /// When the storage was freed ([`Tensor::free_storage`]) and not allocated again:
    /// reading or writing it would touch memory the cache may have handed out.
    pub fn ptr(&self) -> DevicePtr {
        self.storage.block().ptr() + (self.layout.offset() * self.dtype.size()) as u64
    }

    /// The allocation behind the tensor (shared by all its views).
    ///
    /// # Panics
    ///
    /// As [`Tensor::ptr`], when the storage is freed.
    pub fn allocation(&self) -> Allocation {
        self.storage.block()
    }

    /// Tells the allocator that work on `stream` uses this tensor, so that its memory is
    /// reused only after that work completes (PyTorch's `Tensor.record_stream`).
    pub fn record_stream(&self, stream: &crate::device::Stream) -> Result<()> {
        self.device()
            .allocator()?
            .record_stream(&self.storage.held()?, stream)
    }

    /// Do two tensors share storage (as `a.untyped_storage().data_ptr()` would tell)?
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// A name for this tensor's storage that outlives it without keeping its memory
    /// (PyTorch's `StorageWeakRef`): equal for every view of one storage, and never
    /// equal to a later storage, even one given the same device memory.
    pub fn storage_key(&self) -> StorageKey {
        StorageKey(Arc::downgrade(&self.storage))
    }

    /// The whole storage behind this tensor as a flat, dense, detached tensor, when
    /// this tensor's elements are exactly the storage's (a dense tensor, or a
    /// transpose or permutation of one, starting at its first element): one copy of it
    /// serves every view of the storage ([`Tensor::over`] rebuilds them).
    pub(crate) fn whole_storage(&self) -> Option<Tensor> {
        let layout = &self.layout;
        let dense = layout.is_contiguous() || layout.dense_order().is_some();
        let bytes = (layout.numel() * self.dtype.size()) as u64;
        (dense && layout.offset() == 0 && layout.numel() > 0 && bytes == self.storage_nbytes())
            .then(|| self.with_layout(Layout::contiguous(&[layout.numel()], 0)))
    }

    /// `layout` over this tensor's storage, detached: a view of another copy of a
    /// storage rebuilt over this one (a flat copy from [`Tensor::whole_storage`]).
    pub(crate) fn over(&self, layout: &Layout) -> Result<Tensor> {
        if layout.end() * self.dtype.size() > self.storage_nbytes() as usize {
            return Err(Error::InvalidArgument(format!(
                "a view of shape {:?} reaching element {} does not fit a storage of {} bytes",
                layout.shape(),
                layout.end(),
                self.storage_nbytes()
            )));
        }
        Ok(self.with_layout(layout.clone()))
    }

    /// The bytes of the storage behind this tensor, all of it: what freeing it gives
    /// back (the size asked of the allocator, as `untyped_storage().nbytes()`).
    pub fn storage_nbytes(&self) -> u64 {
        self.storage.nbytes
    }

    // ANCHOR: tensor_to
    /// This tensor on `device`: itself (no copy) when already there, else a copy. From
    /// one GPU to another the copy goes directly where the two can (peer access), else
    /// through pinned host memory in chunks.
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if self.device().id() == device.id() {
            return Ok(self.clone());
        }
        Ok(self.to_via(device, CopyVia::Any)?.0)
    }

    /// A copy of this tensor on another device, by the paths `via` allows, and the
    /// path it took.
    pub fn to_via(&self, device: &Device, via: CopyVia) -> Result<(Tensor, CopyPath)> {
        let dense = self.contiguous()?;
        let t = Tensor::empty(self.shape(), self.dtype, device)?;
        let path = copy_between(
            dense.device(),
            dense.ptr(),
            device,
            t.ptr(),
            self.nbytes(),
            via,
        )?;
        Ok((t, path))
    }
    // ANCHOR_END: tensor_to

    /// This tensor in host memory.
    pub fn cpu(&self) -> Result<Tensor> {
        self.to(&Device::cpu())
    }

    /// A new contiguous tensor with a copy of the data, on the same device.
    pub fn deep_clone(&self) -> Result<Tensor> {
        if !self.is_contiguous() {
            return self.contiguous(); // already a copy
        }
        let device = self.device();
        let t = Tensor::empty(self.shape(), self.dtype, device)?;
        let stream = device.current_stream()?;
        device
            .backend()
            .copy_dtod(t.ptr(), self.ptr(), self.nbytes(), &stream)?;
        Ok(t)
    }

    /// The elements in row-major order (a strided view is gathered on the device first).
    /// A read of a device's tensor waits for the device: it is counted ([`host_reads`]).
    fn read_bytes(&self, out: &mut [u8]) -> Result<()> {
        let dense = self.contiguous()?;
        let device = self.device();
        if device.id() != crate::device::DeviceId::Cpu {
            host_reads::count_host_read();
        }
        let stream = device.current_stream()?;
        device.backend().copy_dtoh(out, dense.ptr(), &stream)
    }

    /// The elements, copied to the host (waits for pending work on the default stream).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::InvalidArgument(format!(
                "to_vec::<{}> on a tensor of dtype {}",
                T::DTYPE,
                self.dtype
            )));
        }
        let mut bytes = vec![0u8; self.nbytes()];
        self.read_bytes(&mut bytes)?;
        Ok(crate::dtype::from_bytes(&bytes))
    }

    /// The value of a one-element tensor, copied to the host (PyTorch's `item()`):
    /// a number with no graph and no device memory, what a training loop should keep
    /// for its logs. Waits for the work that produces it.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::InvalidArgument(format!(
                "item: a tensor with {} elements (shape {:?}) cannot be converted to a \
                 scalar; only one-element tensors can",
                self.numel(),
                self.shape()
            )));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    // ANCHOR: check_same_device
    /// An error unless `other` is on this tensor's device.
    pub fn check_same_device(&self, other: &Tensor) -> Result<()> {
        if self.device().id() != other.device().id() {
            return Err(Error::DeviceMismatch {
                a: self.device().id(),
                b: other.device().id(),
            });
        }
        Ok(())
    }
    // ANCHOR_END: check_same_device
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor(shape={:?}, dtype={}, device={})",
            self.shape(),
            self.dtype,
            self.device()
        )
    }
}
