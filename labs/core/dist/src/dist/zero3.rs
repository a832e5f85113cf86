//! ZeRO stage 3 (DeepSpeed's stage 3, PyTorch's FSDP with `fully_shard` on each layer):
//! the parameters are sharded too. Between uses a rank keeps only its 1/N of each
//! layer's parameters, of their gradients and of the optimizer's state; a layer's
//! whole parameters exist only while it runs.
//!
//! The model is cut into units as FSDP wraps it: each layer the model hands out
//! ([`Module::layer_prefixes`]: GPT-2's blocks, the Transformer's encoder and decoder
//! layers), and the root (the parameters in no layer: embeddings, final norms). Each
//! unit's parameters are laid end to end, padded to a multiple of N and cut into N
//! chunks; rank `r` keeps chunk `r` of every unit, end to end in one flat shard of
//! parameters, with a flat shard of gradients beside it. The module keeps its
//! parameter tensors, but their storage is freed ([`Tensor::free_storage`]) whenever
//! their unit is not in use. Around each unit ([`LayerHooks`]), on every rank:
//!
//! - **before its forward**, the unit's chunks are all-gathered into a buffer, copied
//!   into its parameters' storage (allocated again) and the buffer freed; the next
//!   layer's all-gather is started at once on the communication stream, so that it
//!   overlaps this layer's compute (FSDP's forward prefetch);
//! - **after its forward**, a layer's parameters are freed again (FSDP's
//!   `reshard_after_forward`), and a hook is set on its output's gradient; the root
//!   stays gathered, as FSDP's root does, since backward starts with it;
//! - **when backward reaches the layer's output**, its parameters are gathered again and
//!   the layer before it starts gathering (backward prefetch);
//! - **when all its parameters have their gradients**, they are copied into a buffer,
//!   reduce-scattered with an average into this rank's shard of the gradients (added,
//!   for the second micro-batch on), and the gradients and the parameters freed.
//!
//! The optimizer steps the flat shard of parameters with its shard of gradients, one
//! leaf; nothing is gathered by the step: the next forward gathers the new values.
//! `zero_grad(set_to_none)` drops the shard of gradients, as FSDP's does: the first
//! reduce-scatter of the next backward makes a new one.
//!
//! Memory per rank: 1/N of the parameters, gradients and optimizer state, plus the
//! whole parameters of the root and of at most two layers (the running one and the one
//! prefetched), and one layer's gradients while they are reduce-scattered.

use std::sync::{Arc, Mutex, Weak};

use super::communicator::{Communicator, Work};
use super::grad_shard::GradientShard;
use super::zero::check_and_broadcast;
use crate::alloc::Category;
use crate::autograd::HookHandle;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::nn::{parameters_by_unit, LayerHooks, Module, Unit};
use crate::optim::Optimizer;
use crate::tensor::{no_grad, Tensor};

/// One unit: its parameters, where its chunk lives in the flat shards, and where it is
/// in the step.
struct ShardUnit {
    /// The root or a layer's prefix, for errors.
    name: String,
    /// Its parameters (the module's tensors) with their offsets in the unit.
    params: Vec<(Tensor, usize)>,
    /// The unit's elements, padded to a multiple of the world size.
    len: usize,
    /// Where this rank's chunk (`len / world` elements) starts in the flat shards.
    shard_offset: usize,
    /// Whether its parameters' storage holds their whole values now.
    gathered: bool,
    /// An all-gather under way (the prefetch): its buffer and its end.
    coming: Option<(Tensor, Work)>,
    /// Its gradients while they arrive in backward; `None` between backward passes.
    grads: Option<Tensor>,
    /// Parameters whose gradient has not arrived in this backward pass.
    waiting: usize,
    /// Whether the shard of gradients holds a micro-batch's chunk since the last
    /// `zero_grad` (later micro-batches add theirs).
    reduced: bool,
}

/// What the hooks, the step and [`ShardedParameters`] share.
struct Shards {
    comm: Arc<Communicator>,
    dtype: DType,
    /// Index 0 the root, then layer `i` at `i + 1`.
    units: Vec<ShardUnit>,
    /// This rank's chunks of every unit's parameters, end to end.
    shard_params: Tensor,
    /// And of their averaged gradients, the gradient of the inner optimizer's leaf.
    shard_grads: GradientShard,
    /// Units reduce-scattered in this backward pass: once every unit with parameters
    /// is, the pass's reduce-scatters are waited for.
    reduced_in_pass: usize,
    /// Per parameter (in the module's `named_parameters` order): its unit and its place
    /// in the unit's `params`.
    slots: Vec<(usize, usize)>,
}

fn index(unit: Unit) -> usize {
    match unit {
        Unit::Root => 0,
        Unit::Layer(i) => i + 1,
    }
}

impl Shards {
    fn chunk(&self, u: usize) -> usize {
        self.units[u].len / self.comm.world_size()
    }

    /// Starts all-gathering unit `u`'s chunks into a buffer, unless it is gathered or
    /// on its way.
    fn prefetch(&mut self, u: usize) -> Result<()> {
        match self.units.get(u) {
            Some(unit) if !unit.gathered && unit.coming.is_none() && unit.len > 0 => {}
            _ => return Ok(()),
        }
        let (chunk, unit) = (self.chunk(u), &self.units[u]);
        let buffer = {
            let _p = Category::Parameter.scope();
            Tensor::empty(&[unit.len], self.dtype, self.comm.device())?
        };
        let mine = self.shard_params.narrow(0, unit.shard_offset, chunk)?;
        let work = self.comm.all_gather(&mine, &buffer)?;
        self.units[u].coming = Some((buffer, work));
        Ok(())
    }

    // ANCHOR: gather
    /// Unit `u`'s parameters whole in their storage: the all-gather waited for (started
    /// here if it was not under way) and copied out.
    fn gather(&mut self, u: usize) -> Result<()> {
        if self.units[u].gathered || self.units[u].len == 0 {
            return Ok(());
        }
        self.prefetch(u)?;
        let unit = &mut self.units[u];
        let (buffer, work) = unit.coming.take().expect("started above");
        work.wait()?;
        let _off = no_grad();
        for (p, offset) in &unit.params {
            p.alloc_storage()?;
            p.copy_(&buffer.narrow(0, *offset, p.numel())?.view(p.shape())?)?;
        }
        unit.gathered = true;
        Ok(())
    }

    // ANCHOR_END: gather

    /// Frees unit `u`'s parameters' storage (their values live on in the shards).
    fn reshard(&mut self, u: usize) -> Result<()> {
        let unit = &mut self.units[u];
        for (p, _) in &unit.params {
            p.free_storage()?;
        }
        unit.gathered = false;
        Ok(())
    }

    /// Parameter `i`'s gradient arrived: into its unit's buffer; once the unit's are
    /// all there, reduce-scattered into the shard and the parameters resharded.
    fn gradient_ready(&mut self, i: usize, grad: &Tensor) -> Result<()> {
        let (u, k) = self.slots[i];
        let device = self.comm.device().clone();
        let unit = &mut self.units[u];
        if unit.grads.is_none() {
            let _g = Category::Gradient.scope();
            unit.grads = Some(Tensor::zeros(&[unit.len], self.dtype, &device)?);
        }
        let (p, offset) = &unit.params[k];
        unit.grads
            .as_ref()
            .expect("made above")
            .narrow(0, *offset, p.numel())?
            .copy_(&grad.contiguous()?.view(&[grad.numel()])?)?;
        unit.waiting -= 1;
        if unit.waiting > 0 {
            return Ok(());
        }
        let grads = unit.grads.take().expect("made above");
        unit.waiting = unit.params.len();
        let (offset, add) = (unit.shard_offset, unit.reduced);
        unit.reduced = true;
        self.shard_grads
            .reduce_scatter(&self.comm, &grads, offset, add)?;
        drop(grads);
        self.reduced_in_pass += 1;
        if self.reduced_in_pass == self.units.iter().filter(|u| !u.params.is_empty()).count() {
            // The end of backward: the shard is whole, and no bucket waits past it.
            self.reduced_in_pass = 0;
            self.shard_grads.finish()?;
        }
        self.reshard(u)
    }

    /// The whole parameters, as new tensors: every unit all-gathered into a buffer,
    /// leaving the module's storage as it is. A collective: every rank calls it.
    fn full_parameters(&self) -> Result<Vec<Tensor>> {
        let _off = no_grad();
        let mut by_unit = Vec::with_capacity(self.units.len());
        for (u, unit) in self.units.iter().enumerate() {
            let buffer = Tensor::empty(&[unit.len], self.dtype, self.comm.device())?;
            let mine = self
                .shard_params
                .narrow(0, unit.shard_offset, self.chunk(u))?;
            self.comm.all_gather(&mine, &buffer)?.wait()?;
            by_unit.push(buffer);
        }
        self.slots
            .iter()
            .map(|&(u, k)| {
                let (p, offset) = &self.units[u].params[k];
                by_unit[u]
                    .narrow(0, *offset, p.numel())?
                    .contiguous()?
                    .view(p.shape())
            })
            .collect()
    }
}

// ANCHOR: schedule
/// The hooks the model calls: the schedule of the module docs. Once the optimizer is
/// dropped they do nothing (and the parameters stay where they were: freed).
struct Schedule(Weak<Mutex<Shards>>);

impl LayerHooks for Schedule {
    fn before(&self, unit: Unit) -> Result<()> {
        let Some(shards) = self.0.upgrade() else {
            return Ok(());
        };
        let mut s = shards.lock().unwrap();
        if unit == Unit::Root {
            // A new forward pass: whatever a failed one left half done starts over.
            for unit in &mut s.units {
                unit.grads = None;
                unit.waiting = unit.params.len();
            }
        }
        let u = index(unit);
        s.gather(u)?;
        // The next unit in forward order starts coming while this one computes.
        s.prefetch(u + 1)
    }

    fn after(&self, unit: Unit, output: &Tensor) -> Result<()> {
        let u = index(unit);
        let Some(shards) = self.0.upgrade() else {
            return Ok(());
        };
        let mut s = shards.lock().unwrap();
        if !output.requires_grad() {
            // No backward will follow (an evaluation): nothing stays gathered.
            return s.reshard(u);
        }
        if unit == Unit::Root {
            return Ok(()); // backward starts with the root's parameters
        }
        s.reshard(u)?;
        let shards = self.0.clone();
        output.register_hook(move |_| {
            let Some(shards) = shards.upgrade() else {
                return Ok(()); // the optimizer is gone
            };
            let mut s = shards.lock().unwrap();
            s.gather(u)?;
            // The layer before it in forward order is the next one backward reaches.
            if u > 1 {
                s.prefetch(u - 1)?;
            }
            Ok(())
        })
    }
}

// ANCHOR_END: schedule

/// ZeRO stage 3 over a model's layers, stepping this rank's shard with an inner
/// optimizer; `Optimizer::params` are the module's parameters (their storage freed
/// between uses).
pub struct FullyShardedDataParallel {
    shards: Arc<Mutex<Shards>>,
    params: Vec<Tensor>,
    inner: Box<dyn Optimizer + Send>,
    hooks: Vec<HookHandle>,
}

/// A handle on a [`FullyShardedDataParallel`]'s shards that outlives borrowing it.
#[derive(Clone)]
pub struct ShardedParameters(Arc<Mutex<Shards>>);

impl ShardedParameters {
    /// Every parameter whole, as new tensors in the module's parameter order (FSDP's
    /// `full_tensor()` of each): a collective, every rank calls it.
    pub fn full_parameters(&self) -> Result<Vec<Tensor>> {
        self.0.lock().unwrap().full_parameters()
    }
}

impl FullyShardedDataParallel {
    /// Broadcasts rank 0's parameters, keeps this rank's chunk of every unit of `model`,
    /// frees the parameters' storage, sets the schedule's hooks on the model, and builds
    /// the inner optimizer over the flat shard: `make_optimizer(vec![shard])`. Every
    /// parameter must have one dtype.
    pub fn new(
        model: &mut dyn Module,
        comm: Arc<Communicator>,
        make_optimizer: impl FnOnce(Vec<Tensor>) -> Box<dyn Optimizer + Send>,
    ) -> Result<FullyShardedDataParallel> {
        let by_unit = parameters_by_unit(model);
        let named = model.named_parameters();
        let params: Vec<Tensor> = named.iter().map(|(_, p)| p.clone()).collect();
        let dtype = check_and_broadcast("FullyShardedDataParallel", &params, &comm)?;
        let (world, rank) = (comm.world_size(), comm.rank());
        let device = comm.device().clone();
        let mut units = Vec::with_capacity(by_unit.len());
        let mut slots = vec![(0, 0); params.len()];
        let mut shard_len = 0;
        for (u, (unit, members_named)) in by_unit.into_iter().enumerate() {
            let name = match unit {
                Unit::Root => "the root".to_string(),
                Unit::Layer(i) => model.layer_prefixes()[i].clone(),
            };
            let mut len = 0;
            let mut members = Vec::with_capacity(named.len());
            for (k, (name, p)) in members_named.into_iter().enumerate() {
                let i = named
                    .iter()
                    .position(|(n, _)| *n == name)
                    .expect("a parameter of the module");
                slots[i] = (u, k);
                let n = p.numel();
                members.push((p, len));
                len += n;
            }
            let len = len.div_ceil(world) * world;
            units.push(ShardUnit {
                name,
                waiting: members.len(),
                params: members,
                len,
                shard_offset: shard_len,
                gathered: true,
                coming: None,
                grads: None,
                reduced: false,
            });
            shard_len += len / world;
        }
        let shard_params = {
            let _p = Category::Parameter.scope();
            Tensor::zeros(&[shard_len], dtype, &device)?
        };
        {
            // This rank's chunk of each unit, from the (broadcast) parameters.
            let _off = no_grad();
            for unit in &units {
                let chunk = unit.len / world;
                let mine = rank * chunk..(rank + 1) * chunk;
                for (p, offset) in &unit.params {
                    let (start, end) = (
                        (*offset).max(mine.start),
                        (offset + p.numel()).min(mine.end),
                    );
                    if start < end {
                        shard_params
                            .narrow(0, unit.shard_offset + start - mine.start, end - start)?
                            .copy_(&p.view(&[p.numel()])?.narrow(
                                0,
                                start - offset,
                                end - start,
                            )?)?;
                    }
                }
            }
        }
        let leaf = shard_params.detach().requires_grad_(true);
        let inner = make_optimizer(vec![leaf.clone()]);
        let mut shards = Shards {
            comm,
            dtype,
            units,
            shard_params,
            shard_grads: GradientShard::new(dtype, shard_len, vec![(leaf, 0, shard_len)]),
            reduced_in_pass: 0,
            slots,
        };
        for u in 0..shards.units.len() {
            shards.reshard(u)?;
        }
        let shards = Arc::new(Mutex::new(shards));
        let mut hooks = Vec::with_capacity(params.len());
        for (i, p) in params.iter().enumerate() {
            let cell = Arc::downgrade(&p.grad_slot().expect("checked to require grad"));
            let shards = Arc::downgrade(&shards);
            hooks.push(p.register_post_accumulate_grad_hook(move |grad| {
                let Some(shards) = shards.upgrade() else {
                    return Ok(()); // the optimizer is gone
                };
                let _off = no_grad();
                shards.lock().unwrap().gradient_ready(i, grad)?;
                // The gradient lives on in this rank's shard only.
                if let Some(cell) = cell.upgrade() {
                    *cell.lock().unwrap() = None;
                }
                Ok(())
            })?);
        }
        model.set_layer_hooks(Some(Arc::new(Schedule(Arc::downgrade(&shards)))))?;
        Ok(FullyShardedDataParallel {
            shards,
            params,
            inner,
            hooks,
        })
    }

    /// A handle that reads the whole parameters back.
    pub fn sharded_parameters(&self) -> ShardedParameters {
        ShardedParameters(self.shards.clone())
    }

    /// This rank's chunks of every unit, in elements.
    pub fn shard_len(&self) -> usize {
        self.shards.lock().unwrap().shard_params.numel()
    }
}

impl Drop for FullyShardedDataParallel {
    /// The gradient hooks go with the optimizer; the model's schedule finds its shards
    /// gone and does nothing (the parameters' storage stays freed).
    fn drop(&mut self) {
        for h in self.hooks.drain(..) {
            h.remove();
        }
    }
}

impl Optimizer for FullyShardedDataParallel {
    fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Steps this rank's shard. Every unit must have had its gradients reduce-scattered
    /// since the last `zero_grad`.
    fn step(&mut self) -> Result<()> {
        let _off = no_grad();
        {
            let mut s = self.shards.lock().unwrap();
            s.shard_grads.finish()?;
            if let Some(unit) = s.units.iter().find(|u| !u.reduced && u.len > 0) {
                return Err(Error::InvalidArgument(format!(
                    "FullyShardedDataParallel (rank {}): {} received no gradients since the \
                     last zero_grad (or not all of them); every parameter needs one",
                    s.comm.rank(),
                    unit.name
                )));
            }
        }
        self.inner.step()
    }

    /// Drops this rank's shard of the gradients (`set_to_none`, PyTorch's default: the
    /// memory goes back to the cache until the next backward reduce-scatters into a new
    /// one), or zeroes it; the module's parameters hold no gradient between backward
    /// passes either way.
    fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        let mut s = self.shards.lock().unwrap();
        s.units.iter_mut().for_each(|u| u.reduced = false);
        s.reduced_in_pass = 0;
        s.shard_grads.zero_grad(set_to_none)?;
        for p in &self.params {
            p.clear_grad();
        }
        Ok(())
    }
}
