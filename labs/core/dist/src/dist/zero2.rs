//! ZeRO stage 2 (DeepSpeed's stage 2; PyTorch FSDP's `SHARD_GRAD_OP` shards the same two
//! things): the optimizer's state *and the gradients* are split across the ranks. Each
//! rank keeps the whole model, but of the gradients only its 1/N, averaged: where DDP
//! and ZeRO-1 keep a gradient-sized buffer on every rank, here that buffer lives only
//! while its bucket fills.
//!
//! The parameters are grouped into buckets as DDP groups them (`buckets.rs`: reverse
//! registration order, one dtype, 25 MiB), each bucket padded to a multiple of N and cut
//! into N chunks; rank `r` owns chunk `r` of every bucket, and its shard is its chunks
//! end to end. During backward, a post-accumulate-grad hook copies each finished
//! gradient into its bucket's buffer (made when the bucket's first gradient arrives)
//! and drops `.grad`; when a bucket is complete, and every bucket before it has gone,
//! it is reduce-scattered with an average into this rank's shard of the gradients, and
//! the buffer is freed. Gradient accumulation adds each micro-batch's averaged chunk to
//! the shard. A step, on every rank:
//!
//! 1. the inner optimizer steps this rank's pieces of the parameters in place (views
//!    of the parameters, no copy), with their slices of the shard of the gradients;
//! 2. bucket by bucket, each rank's chunk is gathered from its pieces, the chunks are
//!    all-gathered into a buffer made for it and copied into the parameters, and the
//!    buffers freed.
//!
//! `zero_grad(set_to_none)` drops the shard of gradients; the next backward's first
//! reduce-scatter makes a new one.
//!
//! Memory per rank: the parameters, 1/N of the gradients (from the first bucket of
//! backward to `zero_grad`) and of the optimizer state, and at most a bucket or two in
//! flight.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::buckets::{assign_buckets, cap_bytes, BucketInput};
use super::buckets::{DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES_CAP};
use super::communicator::{Communicator, Work};
use super::grad_shard::GradientShard;
use super::zero::check_and_broadcast;
use crate::alloc::Category;
use crate::autograd::HookHandle;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::tensor::{no_grad, Tensor};

/// One bucket: its parameters at their offsets, its padded length (a multiple of the
/// world size), where its chunk lives in this rank's shard, and its buffer while it
/// fills.
struct Bucket {
    params: Vec<(usize, usize)>,
    len: usize,
    shard_offset: usize,
    buffer: Option<Tensor>,
    pending: usize,
    /// Whether the shard already holds a micro-batch's chunk since the last `zero_grad`
    /// (later ones add).
    reduced: bool,
}

impl Bucket {
    fn chunk(&self, world: usize) -> usize {
        self.len / world
    }
}

/// What the hooks and the step share.
struct Reducer {
    comm: Arc<Communicator>,
    dtype: DType,
    buckets: Vec<Bucket>,
    /// Per parameter: its bucket and its offset there.
    slots: Vec<(usize, usize)>,
    /// Per parameter: whether its gradient arrived since the last step.
    ready: Vec<bool>,
    /// The first bucket not reduced yet in this backward pass.
    next_bucket: usize,
    /// This rank's shard of the averaged gradients, the gradients of the optimizer's
    /// leaves (this rank's pieces of the parameters).
    shard_grads: GradientShard,
}

impl Reducer {
    /// Copies parameter `i`'s gradient into its bucket, then reduce-scatters every
    /// complete bucket that is next in order.
    fn mark_ready(&mut self, i: usize, grad: &Tensor) -> Result<()> {
        let (b, offset) = self.slots[i];
        let device = self.comm.device().clone();
        let bucket = &mut self.buckets[b];
        if bucket.buffer.is_none() {
            let _g = Category::Gradient.scope();
            bucket.buffer = Some(Tensor::zeros(&[bucket.len], self.dtype, &device)?);
        }
        let buffer = bucket.buffer.as_ref().expect("made above");
        buffer
            .narrow(0, offset, grad.numel())?
            .copy_(&grad.contiguous()?.view(&[grad.numel()])?)?;
        bucket.pending -= 1;
        self.ready[i] = true;
        while let Some(bucket) = self.buckets.get_mut(self.next_bucket) {
            if bucket.pending > 0 {
                break;
            }
            let buffer = bucket
                .buffer
                .take()
                .expect("a complete bucket has its buffer");
            self.shard_grads.reduce_scatter(
                &self.comm,
                &buffer,
                bucket.shard_offset,
                bucket.reduced,
            )?;
            bucket.reduced = true;
            bucket.pending = bucket.params.len();
            self.next_bucket += 1;
        }
        if self.next_bucket == self.buckets.len() {
            // The end of backward: the shard is whole, and no bucket waits past it.
            self.next_bucket = 0;
            self.shard_grads.finish()?;
        }
        Ok(())
    }
}

/// ZeRO stage 2 over `params`, stepping each rank's shard with an inner optimizer (no
/// DDP wrapper: the reduce-scatters are its own).
pub struct ShardedGradientOptimizer {
    comm: Arc<Communicator>,
    params: Vec<Tensor>,
    reducer: Arc<Mutex<Reducer>>,
    /// Per bucket: this rank's pieces of its parameters, as (parameter, range of the
    /// parameter's elements, offset in the bucket's chunk).
    pieces: Vec<Vec<(usize, Range<usize>, usize)>>,
    inner: Box<dyn Optimizer + Send>,
    hooks: Vec<HookHandle>,
}

impl ShardedGradientOptimizer {
    /// Copies a bucket's gathered parameters back into the parameters, `(parameter,
    /// offset in the bucket)`, and drops their gradients.
    fn unpack(&self, params: &[(usize, usize)], gathered: &Tensor) -> Result<()> {
        for &(i, offset) in params {
            let p = &self.params[i];
            p.copy_(&gathered.narrow(0, offset, p.numel())?.view(p.shape())?)?;
            p.clear_grad();
        }
        Ok(())
    }

    /// Broadcasts rank 0's parameters, buckets and hooks every parameter, and builds
    /// the inner optimizer over this rank's pieces of the parameters (views of them,
    /// each with its slice of the shard of the gradients): `make_optimizer(pieces)`.
    /// Every parameter must have one dtype.
    pub fn new(
        params: Vec<Tensor>,
        comm: Arc<Communicator>,
        make_optimizer: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer + Send>,
    ) -> Result<ShardedGradientOptimizer> {
        let dtype = check_and_broadcast("ZeRO-2", &params, &comm)?;
        let world = comm.world_size();
        let inputs: Vec<BucketInput> = params
            .iter()
            .map(|p| BucketInput {
                dtype,
                numel: p.numel(),
            })
            .collect();
        let groups = assign_buckets(
            &inputs,
            DEFAULT_FIRST_BUCKET_BYTES_CAP,
            cap_bytes(DEFAULT_BUCKET_CAP_MB)?,
        )?;
        let mut slots = vec![(0, 0); params.len()];
        let mut buckets = Vec::with_capacity(groups.len());
        let mut shard_len = 0;
        for (b, group) in groups.into_iter().enumerate() {
            let mut len = 0;
            let mut members = Vec::with_capacity(group.len());
            for i in group {
                slots[i] = (b, len);
                members.push((i, len));
                len += params[i].numel();
            }
            let len = len.div_ceil(world) * world;
            buckets.push(Bucket {
                pending: members.len(),
                params: members,
                len,
                shard_offset: shard_len,
                buffer: None,
                reduced: false,
            });
            shard_len += len / world;
        }
        // This rank's pieces of the parameters: where its chunk of each bucket meets
        // each parameter of the bucket. The optimizer steps views of the parameters
        // themselves (detached: leaves of their own), each with its slice of the shard
        // of the gradients as its gradient.
        let rank = comm.rank();
        let mut pieces = Vec::with_capacity(buckets.len());
        let mut leaves = Vec::new();
        let mut grad_places = Vec::new();
        for bucket in &buckets {
            let chunk = bucket.chunk(world);
            let mine = rank * chunk..(rank + 1) * chunk;
            let mut here = Vec::new();
            for &(i, offset) in &bucket.params {
                let p = &params[i];
                let (start, end) = (offset.max(mine.start), (offset + p.numel()).min(mine.end));
                if start >= end {
                    continue;
                }
                let range = start - offset..end - offset;
                let leaf = p
                    .detach()
                    .view(&[p.numel()])?
                    .narrow(0, range.start, range.len())?
                    .requires_grad_(true);
                grad_places.push((
                    leaf.clone(),
                    bucket.shard_offset + start - mine.start,
                    range.len(),
                ));
                leaves.push(leaf);
                here.push((i, range, start - mine.start));
            }
            pieces.push(here);
        }
        let inner = make_optimizer(leaves);
        let reducer = Arc::new(Mutex::new(Reducer {
            comm: comm.clone(),
            dtype,
            buckets,
            slots,
            ready: vec![false; params.len()],
            next_bucket: 0,
            shard_grads: GradientShard::new(dtype, shard_len, grad_places),
        }));
        let mut hooks = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let cell = Arc::downgrade(&p.grad_slot().expect("checked to require grad"));
            let reducer = Arc::downgrade(&reducer);
            hooks.push(p.register_post_accumulate_grad_hook(move |grad| {
                let Some(reducer) = reducer.upgrade() else {
                    return Ok(()); // the optimizer is gone
                };
                let _off = no_grad();
                reducer.lock().unwrap().mark_ready(i, grad)?;
                // The gradient lives on in this rank's shard only.
                if let Some(cell) = cell.upgrade() {
                    *cell.lock().unwrap() = None;
                }
                Ok(())
            })?);
        }
        Ok(ShardedGradientOptimizer {
            comm,
            params,
            reducer,
            pieces,
            inner,
            hooks,
        })
    }

    /// This rank's shard of the averaged gradients (its chunk of every bucket).
    pub fn shard_len(&self) -> usize {
        self.reducer.lock().unwrap().shard_grads.len()
    }
}

impl Drop for ShardedGradientOptimizer {
    /// The hooks go with the optimizer: the parameters are left as they were.
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

impl Optimizer for ShardedGradientOptimizer {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Steps this rank's shard and all-gathers the parameters, bucket by bucket. Every
    /// parameter must have received a gradient since the last step.
    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        {
            let r = self.reducer.lock().unwrap();
            if let Some(i) = r.ready.iter().position(|ready| !ready) {
                return Err(Error::InvalidArgument(format!(
                    "ZeRO-2 (rank {}): parameter #{i} of shape {:?} received no gradient \
                     since the last zero_grad; every parameter needs one",
                    self.comm.rank(),
                    self.params[i].shape()
                )));
            }
        }
        self.reducer.lock().unwrap().shard_grads.finish()?;
        self.inner.step()?;
        let world = self.comm.world_size();
        let r = self.reducer.lock().unwrap();
        let device = self.comm.device().clone();
        let dtype = r.dtype;
        // Bucket b's all-gather runs while bucket b + 1 is packed; its parameters are
        // copied out once that one has started.
        let mut previous: Option<(usize, Tensor, Work)> = None;
        for (b, bucket) in r.buckets.iter().enumerate() {
            let chunk = bucket.chunk(world);
            let _t = Category::Temporary.scope();
            // This rank's chunk, from its pieces of the parameters (the padding zero).
            let mine = Tensor::zeros(&[chunk], dtype, &device)?;
            for (i, range, at) in &self.pieces[b] {
                let p = self.params[*i].view(&[self.params[*i].numel()])?;
                mine.narrow(0, *at, range.len())?.copy_(&p.narrow(
                    0,
                    range.start,
                    range.len(),
                )?)?;
            }
            let gathered = Tensor::empty(&[bucket.len], dtype, &device)?;
            let work = self.comm.all_gather(&mine, &gathered)?;
            if let Some((done, gathered, work)) = previous.replace((b, gathered, work)) {
                work.wait()?;
                self.unpack(&r.buckets[done].params, &gathered)?;
            }
        }
        if let Some((done, gathered, work)) = previous {
            work.wait()?;
            self.unpack(&r.buckets[done].params, &gathered)?;
        }
        Ok(())
    }

    /// Drops this rank's shard of the gradients (`set_to_none`, PyTorch's default: the
    /// next backward's first reduce-scatter makes a new one), or zeroes it.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        let mut r = self.reducer.lock().unwrap();
        r.ready.iter_mut().for_each(|ready| *ready = false);
        r.buckets.iter_mut().for_each(|b| b.reduced = false);
        r.shard_grads.zero_grad(set_to_none)?;
        for p in &self.params {
            p.clear_grad();
        }
        Ok(())
    }
}
