//! ZeRO stage 1 (PyTorch's `ZeroRedundancyOptimizer`, DeepSpeed's stage 1): the
//! optimizer's state is split across the ranks instead of replicated. Adam keeps two
//! float32 tensors per parameter element, twice the parameters' own memory in float32;
//! here each rank keeps them for a contiguous 1/N of the parameters only.
//!
//! The parameters are laid end to end in one flat gradient buffer (padded to a multiple
//! of N); rank `r` owns the `r`-th N-th of it, its shard. As DDP does with its buckets,
//! a post-accumulate-grad hook copies each finished gradient into its slot of the flat
//! buffer and makes `.grad` a view of it, so no second copy of the gradients persists.
//! A step, on every rank:
//!
//! 1. the flat gradients are reduce-scattered with an average, in place: rank `r`'s
//!    shard now holds the averaged gradient of its elements (half an all-reduce's
//!    traffic);
//! 2. the inner optimizer steps this rank's copy of its shard of the parameters;
//! 3. the shards are all-gathered into the flat buffer, whose gradients are spent, and
//!    copied into the parameters.
//!
//! The gradients are consumed by the step: afterwards every `.grad` is `None` (their
//! buffer carried the all-gather), as after the `zero_grad()` that follows a step.
//! Memory per rank: the flat gradients (as DDP's buckets), the shard's parameters and
//! the shard's optimizer state, 1/N each.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::communicator::{Communicator, ReduceOp};
use super::ddp::check_parameter;
use crate::alloc::Category;
use crate::autograd::HookHandle;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::tensor::{no_grad, Tensor};

/// `torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, ...)`,
/// with the gradients reduce-scattered by the optimizer itself (no DDP wrapper).
pub struct ZeroRedundancyOptimizer {
    comm: Arc<Communicator>,
    params: Vec<Tensor>,
    offsets: Vec<usize>,
    flat_grads: Tensor,
    shard_params: Tensor,
    shard: Range<usize>,
    /// Per parameter: whether its gradient reached the flat buffer since the last step.
    ready: Arc<Mutex<Vec<bool>>>,
    inner: Box<dyn Optimizer + Send>,
    hooks: Vec<HookHandle>,
}

/// What ZeRO's stages ask of their parameters, checked, then rank 0's parameters
/// broadcast to every rank: leaves that require a gradient, on the communicator's
/// device, all of one dtype (the flat shard's, returned). `who` names the optimizer in
/// the errors.
pub(super) fn check_and_broadcast(
    who: &str,
    params: &[Tensor],
    comm: &Communicator,
) -> Result<crate::dtype::DType> {
    let Some(first) = params.first() else {
        return Err(Error::InvalidArgument(format!("{who}: no parameters")));
    };
    let dtype = first.dtype();
    for (i, p) in params.iter().enumerate() {
        check_parameter(&format!("#{i}"), p, comm)?;
        if p.dtype() != dtype {
            return Err(Error::InvalidArgument(format!(
                "{who}: parameter #{i} is {}, parameter #0 {dtype}; the flat shard holds \
                 one dtype",
                p.dtype()
            )));
        }
    }
    for p in params {
        comm.broadcast(p, 0)?.wait()?;
    }
    Ok(dtype)
}

impl ZeroRedundancyOptimizer {
    /// Broadcasts rank 0's parameters, hooks every parameter, and builds the inner
    /// optimizer over this rank's shard, one flat tensor: `make_optimizer(vec![shard])`,
    /// e.g. `|p| Box::new(AdamW::new(p, 1e-3))`. Every parameter must have one dtype.
    pub fn new(
        params: Vec<Tensor>,
        comm: Arc<Communicator>,
        make_optimizer: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer + Send>,
    ) -> Result<ZeroRedundancyOptimizer> {
        let dtype = check_and_broadcast("ZeroRedundancyOptimizer", &params, &comm)?;
        let mut offsets = Vec::with_capacity(params.len());
        let mut total = 0;
        for p in &params {
            offsets.push(total);
            total += p.numel();
        }
        let world = comm.world_size();
        let shard_len = total.div_ceil(world);
        let device = comm.device().clone();
        let flat_grads = {
            let _g = Category::Gradient.scope();
            Tensor::zeros(&[shard_len * world], dtype, &device)?
        };
        let shard_params = {
            let _p = Category::Parameter.scope();
            Tensor::zeros(&[shard_len], dtype, &device)?
        };
        let shard = comm.rank() * shard_len..(comm.rank() + 1) * shard_len;
        let leaf = shard_params.detach().requires_grad_(true);
        *leaf.grad_slot().expect("requires grad").lock().unwrap() =
            Some(flat_grads.narrow(0, shard.start, shard_len)?);
        let inner = make_optimizer(vec![leaf]);
        let ready = Arc::new(Mutex::new(vec![false; params.len()]));
        let mut hooks = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let slot = flat_grads
                .narrow(0, offsets[i], p.numel())?
                .view(p.shape())?;
            let cell = Arc::downgrade(&p.grad_slot().expect("checked to require grad"));
            let ready = Arc::downgrade(&ready);
            hooks.push(p.register_post_accumulate_grad_hook(move |grad| {
                let Some(ready) = ready.upgrade() else {
                    return Ok(()); // the optimizer is gone
                };
                if !grad.is_same_view(&slot) {
                    slot.copy_(&grad.contiguous()?)?;
                    if let Some(cell) = cell.upgrade() {
                        *cell.lock().unwrap() = Some(slot.clone());
                    }
                }
                ready.lock().unwrap()[i] = true;
                Ok(())
            })?);
        }
        Ok(ZeroRedundancyOptimizer {
            comm,
            params,
            offsets,
            flat_grads,
            shard_params,
            shard,
            ready,
            inner,
            hooks,
        })
    }

    /// The elements of the flat parameters whose optimizer state this rank keeps.
    pub fn shard_range(&self) -> Range<usize> {
        self.shard.clone()
    }

    /// The optimizer over this rank's shard.
    pub fn inner(&self) -> &dyn Optimizer {
        self.inner.as_ref()
    }

    /// Copies the part of every parameter that falls in this rank's shard into the
    /// shard's parameters (they may have been changed outside the optimizer, by a state
    /// dict loaded).
    fn refresh_shard(&self) -> Result<()> {
        for (p, &offset) in self.params.iter().zip(&self.offsets) {
            let (start, end) = (
                offset.max(self.shard.start),
                (offset + p.numel()).min(self.shard.end),
            );
            if start >= end {
                continue;
            }
            let flat = p.view(&[p.numel()])?;
            self.shard_params
                .narrow(0, start - self.shard.start, end - start)?
                .copy_(&flat.narrow(0, start - offset, end - start)?)?;
        }
        Ok(())
    }
}

impl Drop for ZeroRedundancyOptimizer {
    /// The hooks go with the optimizer: the parameters are left as they were.
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

impl Optimizer for ZeroRedundancyOptimizer {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Reduce-scatters the gradients, steps this rank's shard, all-gathers the
    /// parameters; the gradients are consumed (`.grad` is `None` afterwards). Every
    /// parameter must have received a gradient since the last step (the shards cut
    /// across parameters, so a missing one cannot be skipped as PyTorch skips it).
    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        {
            let mut ready = self.ready.lock().unwrap();
            if let Some(i) = ready.iter().position(|r| !r) {
                return Err(Error::InvalidArgument(format!(
                    "ZeroRedundancyOptimizer (rank {}): parameter #{i} of shape {:?} \
                     received no gradient since the last step; every parameter needs one",
                    self.comm.rank(),
                    self.params[i].shape()
                )));
            }
            ready.iter_mut().for_each(|r| *r = false);
        }
        // ANCHOR: zero_step
        let shard_grad = self
            .flat_grads
            .narrow(0, self.shard.start, self.shard.len())?;
        self.comm
            .reduce_scatter(&self.flat_grads, &shard_grad, ReduceOp::Avg)?
            .wait()?;
        self.refresh_shard()?;
        self.inner.step()?;
        self.comm
            .all_gather(&self.shard_params, &self.flat_grads)?
            .wait()?;
        for (p, &offset) in self.params.iter().zip(&self.offsets) {
            p.copy_(
                &self
                    .flat_grads
                    .narrow(0, offset, p.numel())?
                    .view(p.shape())?,
            )?;
            p.clear_grad();
        }
        // ANCHOR_END: zero_step
        Ok(())
    }
}
