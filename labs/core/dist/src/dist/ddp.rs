//! Data-parallel training with PyTorch's `DistributedDataParallel` semantics: every
//! rank holds a replica of the model and runs its own micro-batch; after backward,
//! every rank's gradients are the average over the ranks, so an optimizer step leaves
//! the replicas identical, and equal to one step on the concatenated batch.
//!
//! As PyTorch's reducer does, the averaging overlaps backward. The parameters are
//! grouped into buckets (`buckets.rs`), each bucket one flat gradient buffer; a
//! post-accumulate-grad hook on each parameter copies its finished gradient into its
//! bucket's slot, and when a bucket's last gradient has arrived its all-reduce is
//! enqueued on the communicator's stream, while backward goes on with the layers below.
//! Buckets are launched in bucket order, as PyTorch's `next_bucket_` does, so that
//! every rank issues the same collectives in the same order.
//!
//! Once copied, a parameter's `.grad` *is* a view of its bucket slot (PyTorch's
//! `gradient_as_bucket_view=True`): the gradient the engine made is freed at once, so
//! no second gradient-sized buffer persists, and [`finish`](DistributedDataParallel::finish)
//! copies nothing back. (The engine accumulates out of place, so each backward pass
//! still makes its gradient before the hook copies it: a transient, not a copy kept.)
//! The buckets are counted as [`Category::Gradient`].
//!
//! PyTorch's reducer also rebuilds its buckets after the first iteration in the order
//! the gradients actually arrived; here the reverse registration order is kept.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::buckets::{assign_buckets, cap_bytes, BucketInput};
use super::buckets::{DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES_CAP};
use super::communicator::{Communicator, ReduceOp, Work};
use crate::alloc::Category;
use crate::autograd::HookHandle;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{GradCell, Tensor};

/// The constructor's options, PyTorch's names and defaults.
#[derive(Debug, Clone, Copy)]
pub struct DdpOptions {
    /// Cap of every bucket but the first of each dtype, in MiB (25).
    pub bucket_cap_mb: f64,
    /// Cap of the first bucket of each dtype, in bytes (1 MiB): small, so that the
    /// first all-reduce starts early in backward.
    pub first_bucket_bytes_cap: usize,
}

impl Default for DdpOptions {
    fn default() -> DdpOptions {
        DdpOptions {
            bucket_cap_mb: DEFAULT_BUCKET_CAP_MB,
            first_bucket_bytes_cap: DEFAULT_FIRST_BUCKET_BYTES_CAP,
        }
    }
}

/// What the reducer did, in order: the trace the overlap of communication with backward
/// is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpEvent {
    /// Parameter `param`'s gradient was complete and copied into its bucket.
    GradReady { param: usize },
    /// Bucket `bucket`'s all-reduce was enqueued.
    BucketLaunched { bucket: usize },
}

/// One flat gradient buffer and the parameters whose gradients it holds.
struct Bucket {
    buffer: Tensor,
    /// Parameter indices, with the element offset of each in `buffer`.
    params: Vec<(usize, usize)>,
    /// Gradients still missing in this pass.
    pending: usize,
    work: Option<Work>,
}

/// What the hooks and `finish` share.
struct Reducer {
    comm: Arc<Communicator>,
    buckets: Vec<Bucket>,
    /// Per parameter: its bucket, its offset there, and whether its gradient arrived.
    slots: Vec<(usize, usize)>,
    ready: Vec<bool>,
    /// The first bucket not launched yet in this pass.
    next_bucket: usize,
    /// False inside `no_sync`: gradients accumulate locally.
    sync: bool,
    events: Vec<DdpEvent>,
}

impl Reducer {
    /// Marks parameter `i` ready with gradient `grad`: copies it into its bucket slot,
    /// makes `.grad` a view of that slot, and launches every bucket that is complete
    /// and next in order.
    fn mark_ready(
        &mut self,
        i: usize,
        name: &str,
        grad: &Tensor,
        shape: &[usize],
        cell: &Weak<GradCell>,
    ) -> Result<()> {
        if !self.sync {
            return Ok(());
        }
        if self.ready[i] {
            return Err(Error::InvalidArgument(format!(
                "DistributedDataParallel: parameter {name} was marked ready twice; call \
                 finish() after each backward pass (outside no_sync)"
            )));
        }
        let (b, offset) = self.slots[i];
        let bucket = &mut self.buckets[b];
        let slot = bucket.buffer.narrow(0, offset, grad.numel())?.view(shape)?;
        if !grad.is_same_view(&slot) {
            let grad = grad.contiguous()?;
            if grad.dtype() != slot.dtype() || grad.numel() != slot.numel() {
                return Err(Error::InvalidArgument(format!(
                    "DistributedDataParallel: the gradient of {name} is {} of shape {:?}, \
                     its parameter {} of shape {shape:?}",
                    grad.dtype(),
                    grad.shape(),
                    slot.dtype()
                )));
            }
            slot.copy_(&grad)?;
            if let Some(cell) = cell.upgrade() {
                *cell.lock().unwrap() = Some(slot);
            }
        }
        // ANCHOR: launch_buckets
        self.buckets[b].pending -= 1;
        self.ready[i] = true;
        self.events.push(DdpEvent::GradReady { param: i });
        while self.next_bucket < self.buckets.len() && self.buckets[self.next_bucket].pending == 0 {
            let bucket = &mut self.buckets[self.next_bucket];
            bucket.work = Some(self.comm.all_reduce(&bucket.buffer, ReduceOp::Avg)?);
            self.events.push(DdpEvent::BucketLaunched {
                bucket: self.next_bucket,
            });
            self.next_bucket += 1;
        }
        // ANCHOR_END: launch_buckets
        Ok(())
    }

    /// Back to the start of a pass.
    fn reset(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        for b in &mut self.buckets {
            b.pending = b.params.len();
            b.work = None;
        }
        self.next_bucket = 0;
    }
}

/// `torch.nn.parallel.DistributedDataParallel` over a module's named parameters and
/// one rank's communicator. After each `loss.backward()`, call
/// [`finish`](Self::finish) before the optimizer's step: it waits for the bucket
/// all-reduces (PyTorch's reducer does that inside backward, in a callback queued on
/// the engine).
pub struct DistributedDataParallel {
    names: Vec<String>,
    params: Vec<Tensor>,
    reducer: Arc<Mutex<Reducer>>,
    hooks: Vec<HookHandle>,
}

impl DistributedDataParallel {
    /// Wraps `named_parameters` (from `Module::named_parameters`), with the default
    /// bucket caps.
    pub fn new(
        named_parameters: Vec<(String, Tensor)>,
        comm: Arc<Communicator>,
    ) -> Result<DistributedDataParallel> {
        Self::with_options(named_parameters, comm, DdpOptions::default())
    }

    /// Broadcasts rank 0's parameters to every rank, assigns the buckets, allocates
    /// their buffers and hooks every parameter.
    pub fn with_options(
        named_parameters: Vec<(String, Tensor)>,
        comm: Arc<Communicator>,
        options: DdpOptions,
    ) -> Result<DistributedDataParallel> {
        let (names, params): (Vec<String>, Vec<Tensor>) = named_parameters.into_iter().unzip();
        for (name, p) in names.iter().zip(&params) {
            check_parameter(name, p, &comm)?;
        }
        // Every replica starts from rank 0's values, as PyTorch's constructor ensures.
        for p in &params {
            comm.broadcast(p, 0)?.wait()?;
        }
        let inputs: Vec<BucketInput> = params
            .iter()
            .map(|p| BucketInput {
                dtype: p.dtype(),
                numel: p.numel(),
            })
            .collect();
        let assignment = assign_buckets(
            &inputs,
            options.first_bucket_bytes_cap,
            cap_bytes(options.bucket_cap_mb)?,
        )?;
        let mut slots = vec![(0, 0); params.len()];
        let mut buckets = Vec::with_capacity(assignment.len());
        for (b, members) in assignment.iter().enumerate() {
            let mut offset = 0;
            let mut placed = Vec::with_capacity(members.len());
            for &i in members {
                slots[i] = (b, offset);
                placed.push((i, offset));
                offset += params[i].numel();
            }
            let buffer = {
                let _gradients = Category::Gradient.scope();
                Tensor::zeros(&[offset], params[members[0]].dtype(), comm.device())?
            };
            buckets.push(Bucket {
                buffer,
                pending: placed.len(),
                params: placed,
                work: None,
            });
        }
        let reducer = Arc::new(Mutex::new(Reducer {
            comm,
            buckets,
            slots,
            ready: vec![false; params.len()],
            next_bucket: 0,
            sync: true,
            events: Vec::new(),
        }));
        // ANCHOR: hooks
        let mut hooks = Vec::with_capacity(params.len());
        for (i, (name, p)) in names.iter().zip(&params).enumerate() {
            let reducer = Arc::downgrade(&reducer);
            let cell = Arc::downgrade(&p.grad_slot().expect("checked to require grad"));
            let (name, shape) = (name.clone(), p.shape().to_vec());
            hooks.push(p.register_post_accumulate_grad_hook(move |grad| {
                let Some(reducer) = reducer.upgrade() else {
                    return Ok(()); // the wrapper is gone
                };
                let mut r = reducer.lock().unwrap();
                r.mark_ready(i, &name, grad, &shape, &cell)
            })?);
        }
        // ANCHOR_END: hooks
        Ok(DistributedDataParallel {
            names,
            params,
            reducer,
            hooks,
        })
    }

    fn reducer(&self) -> MutexGuard<'_, Reducer> {
        self.reducer.lock().unwrap()
    }

    /// Waits (on the default stream) for every bucket's all-reduce of this backward
    /// pass: afterwards every parameter's `.grad` is the average over the ranks. An
    /// error names the parameters that got no gradient in the pass (PyTorch's error
    /// without `find_unused_parameters=True`, which is not offered here). Inside
    /// [`no_sync`](Self::no_sync), does nothing.
    pub fn finish(&self) -> Result<()> {
        let mut r = self.reducer();
        if !r.sync {
            return Ok(());
        }
        let works: Vec<Work> = r.buckets.iter_mut().filter_map(|b| b.work.take()).collect();
        let missing: Vec<&str> = r
            .ready
            .iter()
            .enumerate()
            .filter(|(_, &ready)| !ready)
            .map(|(i, _)| self.names[i].as_str())
            .collect();
        let rank = r.comm.rank();
        r.reset();
        for w in &works {
            w.wait()?;
        }
        if !missing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "DistributedDataParallel (rank {rank}): these parameters received no \
                 gradient in this backward pass: {}. Every parameter must take part in \
                 the loss (or be left out of the wrapper), and finish() must follow a \
                 backward pass",
                missing.join(", ")
            )));
        }
        Ok(())
    }

    /// Gradients accumulate locally, with no all-reduce, until the guard is dropped
    /// (PyTorch's `no_sync()` context): the micro-batches of gradient accumulation but
    /// the last run under it, and the last one's backward reduces the sum.
    pub fn no_sync(&self) -> NoSync<'_> {
        self.reducer().sync = false;
        NoSync { ddp: self }
    }

    /// The reducer's events since the last call, in order.
    pub fn take_events(&self) -> Vec<DdpEvent> {
        std::mem::take(&mut self.reducer().events)
    }

    /// The parameter indices of each bucket, in launch order.
    pub fn bucket_assignment(&self) -> Vec<Vec<usize>> {
        self.reducer()
            .buckets
            .iter()
            .map(|b| b.params.iter().map(|&(i, _)| i).collect())
            .collect()
    }

    /// The bytes of the bucket buffers (the gradients' memory under DDP).
    pub fn bucket_bytes(&self) -> usize {
        self.reducer()
            .buckets
            .iter()
            .map(|b| b.buffer.nbytes())
            .sum()
    }

    /// The wrapped parameters, in registration order.
    pub fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    /// The communicator.
    pub fn communicator(&self) -> Arc<Communicator> {
        self.reducer().comm.clone()
    }
}

impl Drop for DistributedDataParallel {
    /// The hooks go with the wrapper: the parameters are left as they were.
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

/// Turns gradient synchronisation back on when dropped.
pub struct NoSync<'a> {
    ddp: &'a DistributedDataParallel,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.ddp.reducer().sync = true;
    }
}

/// A parameter DDP can reduce: a floating-point leaf that requires grad, contiguous,
/// on the communicator's device.
pub(super) fn check_parameter(name: &str, p: &Tensor, comm: &Communicator) -> Result<()> {
    if p.grad_slot().is_none() {
        return Err(Error::InvalidArgument(format!(
            "DistributedDataParallel: parameter {name} is not a leaf that requires grad"
        )));
    }
    if !matches!(p.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(Error::InvalidArgument(format!(
            "DistributedDataParallel: parameter {name} is {}; gradients are averaged, so \
             parameters must be float32, float16 or bfloat16",
            p.dtype()
        )));
    }
    if !p.is_contiguous() {
        return Err(Error::InvalidArgument(format!(
            "DistributedDataParallel: parameter {name} is not contiguous"
        )));
    }
    if p.device().id() != comm.device().id() {
        return Err(Error::InvalidArgument(format!(
            "DistributedDataParallel: parameter {name} is on {} but this rank's \
             communicator drives {}",
            p.device().id(),
            comm.device().id()
        )));
    }
    Ok(())
}
