//! ZeRO stage 1 (PyTorch's `ZeroRedundancyOptimizer`, DeepSpeed's stage 1): the
//! optimizer's state is split across the ranks instead of replicated. Adam keeps two
//! float32 tensors per parameter element, twice the parameters' own memory in float32;
//! here each rank keeps them for a contiguous 1/N of the parameters only.
//!
//! A step, on every rank:
//!
//! 1. the gradients are flattened into one buffer (padded to a multiple of N) and
//!    reduce-scattered with an average: rank `r` receives the averaged gradient of its
//!    shard, the `r`-th N-th of the flat buffer (half the traffic of an all-reduce);
//! 2. the inner optimizer steps the shard of a flat copy of the parameters;
//! 3. the shards are all-gathered into the flat copy, and copied into the parameters.
//!
//! The collectives run in place (the shard is a view of the flat buffer, at the offset
//! NCCL requires for in-place reduce-scatter and all-gather). The flat copies of the
//! parameters and gradients are this implementation's own cost (the model's tensors
//! are not views of one buffer): counted as parameters and gradients.

use std::ops::Range;
use std::sync::Arc;

use super::communicator::{Communicator, ReduceOp};
use super::ddp::check_parameter;
use crate::alloc::Category;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::tensor::{no_grad, Tensor};

/// `torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, ...)`,
/// with gradients reduce-scattered by the optimizer itself (no DDP wrapper needed).
pub struct ZeroRedundancyOptimizer {
    comm: Arc<Communicator>,
    params: Vec<Tensor>,
    offsets: Vec<usize>,
    flat_params: Tensor,
    flat_grads: Tensor,
    shard: Range<usize>,
    inner: Box<dyn Optimizer + Send>,
}

impl ZeroRedundancyOptimizer {
    /// Broadcasts rank 0's parameters, and builds the inner optimizer over this rank's
    /// shard, a flat tensor: `make_optimizer(vec![shard])`, e.g.
    /// `|p| Box::new(AdamW::new(p, 1e-3))`. Every parameter must have one dtype.
    pub fn new(
        params: Vec<Tensor>,
        comm: Arc<Communicator>,
        make_optimizer: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer + Send>,
    ) -> Result<ZeroRedundancyOptimizer> {
        let Some(first) = params.first() else {
            return Err(Error::InvalidArgument(
                "ZeroRedundancyOptimizer: no parameters".into(),
            ));
        };
        let dtype = first.dtype();
        for (i, p) in params.iter().enumerate() {
            check_parameter(&format!("#{i}"), p, &comm)?;
            if p.dtype() != dtype {
                return Err(Error::InvalidArgument(format!(
                    "ZeroRedundancyOptimizer: parameter #{i} is {}, parameter #0 {dtype}; \
                     the flat shard holds one dtype",
                    p.dtype()
                )));
            }
        }
        for p in &params {
            comm.broadcast(p, 0)?.wait()?;
        }
        let mut offsets = Vec::with_capacity(params.len());
        let mut total = 0;
        for p in &params {
            offsets.push(total);
            total += p.numel();
        }
        let world = comm.world_size();
        let shard_len = total.div_ceil(world);
        let padded = shard_len * world;
        let device = comm.device().clone();
        let flat_params = {
            let _p = Category::Parameter.scope();
            Tensor::zeros(&[padded], dtype, &device)?
        };
        let flat_grads = {
            let _g = Category::Gradient.scope();
            Tensor::zeros(&[padded], dtype, &device)?
        };
        let shard = comm.rank() * shard_len..(comm.rank() + 1) * shard_len;
        let shard_param = flat_params
            .narrow(0, shard.start, shard_len)?
            .requires_grad_(true);
        let shard_grad = flat_grads.narrow(0, shard.start, shard_len)?;
        *shard_param
            .grad_slot()
            .expect("requires grad")
            .lock()
            .unwrap() = Some(shard_grad);
        let inner = make_optimizer(vec![shard_param]);
        Ok(ZeroRedundancyOptimizer {
            comm,
            params,
            offsets,
            flat_params,
            flat_grads,
            shard,
            inner,
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

    fn shard_of(&self, flat: &Tensor) -> Result<Tensor> {
        flat.narrow(0, self.shard.start, self.shard.len())
    }
}

/// Copies `src` into `dst` (dense, same bytes) on `dst`'s default stream.
fn copy(dst: &Tensor, src: &Tensor) -> Result<()> {
    let device = dst.device();
    device.backend().copy_dtod(
        dst.ptr(),
        src.ptr(),
        dst.nbytes(),
        &device.default_stream()?,
    )
}

impl Optimizer for ZeroRedundancyOptimizer {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Reduce-scatters the gradients, steps this rank's shard, all-gathers the
    /// parameters. Every parameter must have a gradient (each rank's shard boundaries
    /// cut across parameters, so a missing one cannot be skipped as PyTorch skips it).
    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        for (i, (p, &offset)) in self.params.iter().zip(&self.offsets).enumerate() {
            let Some(g) = p.grad() else {
                return Err(Error::InvalidArgument(format!(
                    "ZeroRedundancyOptimizer (rank {}): parameter #{i} of shape {:?} has \
                     no gradient; every parameter needs one at each step",
                    self.comm.rank(),
                    p.shape()
                )));
            };
            if g.dtype() != p.dtype() || g.numel() != p.numel() {
                return Err(Error::InvalidArgument(format!(
                    "ZeroRedundancyOptimizer: the gradient of parameter #{i} is {} of \
                     shape {:?}, the parameter {} of shape {:?}",
                    g.dtype(),
                    g.shape(),
                    p.dtype(),
                    p.shape()
                )));
            }
            let g = g.contiguous()?;
            copy(&self.flat_grads.narrow(0, offset, p.numel())?, &g)?;
            // The parameters may have been changed outside this optimizer (a state dict
            // loaded): the flat copy is refreshed from them.
            copy(&self.flat_params.narrow(0, offset, p.numel())?, p)?;
        }
        let shard_grad = self.shard_of(&self.flat_grads)?;
        self.comm
            .reduce_scatter(&self.flat_grads, &shard_grad, ReduceOp::Avg)?
            .wait()?;
        self.inner.step()?;
        let shard_param = self.shard_of(&self.flat_params)?;
        self.comm
            .all_gather(&shard_param, &self.flat_params)?
            .wait()?;
        for (p, &offset) in self.params.iter().zip(&self.offsets) {
            copy(p, &self.flat_params.narrow(0, offset, p.numel())?)?;
        }
        Ok(())
    }
}
