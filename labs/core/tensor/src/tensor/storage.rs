//! A tensor's storage: one block of the device's caching allocator, shared by the
//! tensor and all its views, returned to the cache when the last of them goes away.
//!
//! A storage can also give its block back while tensors still hold it, and take a new
//! one later ([`Tensor::free_storage`], [`Tensor::alloc_storage`]): what PyTorch's FSDP
//! does with `untyped_storage().resize_(0)` and `resize_(n)` to a layer's unsharded
//! parameters between uses. The module, the optimizer and the autograd graph keep
//! their tensors; only the memory under them comes and goes.

use std::sync::Mutex;

use super::Tensor;
use crate::alloc::{Allocation, Category};
use crate::device::Device;
use crate::error::{Error, Result};

/// What a storage holds now.
#[derive(Clone, Copy)]
enum Held {
    Block(Allocation),
    /// Given back by `free_storage`; the category its block was counted as, for the
    /// next one.
    Freed(Category),
}

pub(super) struct Storage {
    pub(super) device: Device,
    held: Mutex<Held>,
    /// The bytes asked of the allocator (`untyped_storage().nbytes()` while allocated).
    pub(super) nbytes: u64,
}

impl Storage {
    pub(super) fn new(device: &Device, block: Allocation) -> Storage {
        Storage {
            device: device.clone(),
            nbytes: block.requested(),
            held: Mutex::new(Held::Block(block)),
        }
    }

    /// The block, or the error of a freed storage.
    pub(super) fn held(&self) -> Result<Allocation> {
        match *self.held.lock().unwrap() {
            Held::Block(b) => Ok(b),
            Held::Freed(_) => Err(freed(self.nbytes)),
        }
    }

    /// The block; a freed storage is a bug of the program that freed it.
    pub(super) fn block(&self) -> Allocation {
        self.held().unwrap_or_else(|e| panic!("{e}"))
    }
}

fn freed(nbytes: u64) -> Error {
    Error::InvalidArgument(format!(
        "a tensor's storage of {nbytes} bytes is freed (free_storage) and was not \
         allocated again (alloc_storage) before use"
    ))
}

impl Drop for Storage {
    fn drop(&mut self) {
        let Held::Block(block) = *self.held.get_mut().unwrap() else {
            return;
        };
        let freed = self.device.allocator().and_then(|a| a.free(block));
        if let Err(e) = freed {
            // Drop cannot return an error; this is a bookkeeping bug worth seeing.
            eprintln!(
                "warning: freeing {:#x} on {}: {e}",
                block.ptr(),
                self.device
            );
        }
    }
}

// ANCHOR: free_storage
impl Tensor {
    /// Gives the storage's block back to the cache while this tensor, its views and
    /// whatever holds them (a module, an optimizer, the autograd graph's saved tensors)
    /// keep their handles: FSDP's `untyped_storage().resize_(0)`. Using the tensor
    /// before [`Tensor::alloc_storage`] is an error (or, where an op asks for its
    /// address, a panic). Work already enqueued on the block's stream finishes first,
    /// as for any freed block. A freed storage stays freed.
    pub fn free_storage(&self) -> Result<()> {
        let mut held = self.storage.held.lock().unwrap();
        let Held::Block(block) = *held else {
            return Ok(());
        };
        let allocator = self.device().allocator()?;
        let category = allocator.category(&block)?;
        allocator.free(block)?;
        *held = Held::Freed(category);
        Ok(())
    }

    /// A new block for a freed storage, of its size and counted as before, on the
    /// device's default stream; its contents are undefined (the caller fills it, as
    /// FSDP's all-gather does). An allocated storage is left as it is.
    pub fn alloc_storage(&self) -> Result<()> {
        let mut held = self.storage.held.lock().unwrap();
        let Held::Freed(category) = *held else {
            return Ok(());
        };
        let device = &self.storage.device;
        let block = device.allocator()?.malloc_as(
            self.storage.nbytes as usize,
            &device.current_stream()?,
            category,
        )?;
        *held = Held::Block(block);
        Ok(())
    }

    // ANCHOR_END: free_storage

    /// Whether the storage holds a block (`untyped_storage().size() > 0` for a storage
    /// that is not empty): false between [`Tensor::free_storage`] and
    /// [`Tensor::alloc_storage`].
    pub fn is_storage_allocated(&self) -> bool {
        matches!(*self.storage.held.lock().unwrap(), Held::Block(_))
    }
}
