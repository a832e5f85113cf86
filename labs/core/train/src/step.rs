//! One optimizer step as PyTorch's recipes write it: for each of `accum`
//! micro-batches, the forward and loss (under autocast, with saved activations
//! offloaded), the loss divided by `accum` and backward (scaled by the gradient scaler
//! for float16), gradients summing in `.grad`; then one optimizer step (through the
//! scaler, which skips it on an overflow) and `zero_grad(set_to_none=True)`, so the
//! gradients are freed before the next step's forward.
//!
//! The attention backend holds over forward and backward: a checkpointed layer
//! recomputes its attention in backward.

use std::sync::Arc;

use anyhow::{Context, Result};
use labs_core::autograd::{CopyTimes, OffloadHooks, OffloadOptions, OffloadStats};
use labs_core::device::Graph;
use labs_core::dist::{
    Communicator, DistributedDataParallel, FullyShardedDataParallel, ShardedGradientOptimizer,
    ShardedParameters, ZeroRedundancyOptimizer,
};
use labs_core::nn::{sdpa_kernel, SdpaBackend};
use labs_core::optim::{Adam, AdamW, GradScaler, Optimizer, Sgd};
use labs_core::tensor::{autocast, push_saved_tensors_hooks, AutocastGuard};
use labs_core::{DType, Device, Tensor};

use super::config::{AmpMode, AttentionMode, OptimizerKind, TrainConfig};
use super::model::{Batch, TrainModel};

/// A model with its optimizer, scaler and offload hooks: what a run steps.
pub struct Trainer {
    pub config: TrainConfig,
    pub model: TrainModel,
    optimizer: Box<dyn Optimizer>,
    scaler: Option<GradScaler>,
    offload: Option<Arc<OffloadHooks>>,
    device: Device,
    /// Steps the gradient scaler skipped for an overflow.
    pub skipped_steps: usize,
    /// Data-parallel training with DDP: the gradients averaged over the ranks after the
    /// last micro-batch's backward.
    ddp: Option<Arc<DistributedDataParallel>>,
    /// The configuration the micro-batches are drawn from: this rank's data seed.
    data: TrainConfig,
    /// ZeRO-3's shards of the parameters, to read them back whole.
    sharded: Option<ShardedParameters>,
    /// `--graph`: the captured step, once captured.
    captured: Option<CapturedStep>,
}

/// A step captured as a graph (`--graph`): its inputs, into which each step's data is
/// copied before a replay, and the sum of its micro-batches' divided losses, which
/// each replay writes.
struct CapturedStep {
    graph: Graph,
    inputs: Vec<Batch>,
    loss: Tensor,
}

/// How a rank of a data-parallel run shares the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataParallel {
    /// `DistributedDataParallel`: gradients all-reduced in buckets during backward,
    /// the optimizer replicated.
    Ddp,
    /// ZeRO stage 1: gradients reduce-scattered, the optimizer's state sharded.
    Zero1,
    /// ZeRO stage 2: gradients reduce-scattered bucket by bucket during backward and
    /// kept as a shard, the optimizer's state sharded.
    Zero2,
    /// ZeRO stage 3 (FSDP): the parameters sharded too, each layer's gathered for its
    /// forward and again for its backward.
    Zero3,
}

impl Trainer {
    /// The model (parameters allocated) and its optimizer (no state yet: Adam's
    /// moments appear at the first step, as in PyTorch). Seeds the device's generator
    /// (dropout) with `config.seed`.
    pub fn new(config: &TrainConfig, device: &Device) -> Result<Trainer> {
        Self::build(config, device, None)
    }

    /// One rank of a data-parallel run over `comm`'s group, as `torchrun` with
    /// PyTorch's DDP trains: the same initial weights on every rank (rank 0's,
    /// broadcast), data and dropout seeded `seed + rank`, gradient accumulation without
    /// communication but on the last micro-batch.
    pub fn data_parallel(
        config: &TrainConfig,
        device: &Device,
        comm: Arc<Communicator>,
        how: DataParallel,
    ) -> Result<Trainer> {
        if how != DataParallel::Ddp && config.amp == AmpMode::F16 {
            anyhow::bail!(
                "--{} with --amp f16: the gradient scaler checks the parameters' \
                 gradients, which under ZeRO are not all there, nor averaged, on a rank, \
                 so the ranks could disagree on skipping a step; use --amp bf16 or DDP",
                super::data_parallel::name(how)
            );
        }
        Self::build(config, device, Some((comm, how)))
    }

    fn build(
        config: &TrainConfig,
        device: &Device,
        parallel: Option<(Arc<Communicator>, DataParallel)>,
    ) -> Result<Trainer> {
        config.validate()?;
        if config.graph && parallel.is_some() {
            anyhow::bail!(
                "--graph captures one GPU's step: the collectives of data-parallel training are not captured here"
            );
        }
        if config.amp != AmpMode::None && device.id() == labs_core::DeviceId::Cpu {
            anyhow::bail!(
                "--amp {}: autocast here is CUDA's; run it on cuda, sim or dry, not on cpu",
                amp_name(config.amp)
            );
        }
        let rank = parallel.as_ref().map_or(0, |(c, _)| c.rank());
        let mut data = config.clone();
        data.seed = config.seed.wrapping_add(rank as u64);
        device.manual_seed(config.seed);
        let mut model = TrainModel::new(config, device).context("building the model")?;
        // Dropout differs between ranks, as `torch.cuda.manual_seed(seed + rank)`.
        device.manual_seed(data.seed);
        let params = model.module().parameters();
        let (kind, lr, capturable) = (config.optimizer, config.lr, config.graph);
        let make = move |params: Vec<Tensor>| -> Box<dyn Optimizer + Send> {
            let adam = |mut a: Adam| {
                // Under a graph the step counts live on the device.
                a.capturable = capturable;
                Box::new(a)
            };
            match kind {
                OptimizerKind::Adam => adam(Adam::new(params, lr)),
                OptimizerKind::Adamw => adam(AdamW::new(params, lr)),
                OptimizerKind::Sgd => Box::new(Sgd::new(params, lr)),
            }
        };
        let mut sharded = None;
        // ANCHOR: data_parallel_choice
        let (optimizer, ddp): (Box<dyn Optimizer>, _) = match parallel {
            None => (make(params), None),
            Some((comm, DataParallel::Ddp)) => {
                let named = model.module().named_parameters();
                let ddp = DistributedDataParallel::new(named, comm).context("wrapping in DDP")?;
                (make(params), Some(Arc::new(ddp)))
            }
            Some((comm, DataParallel::Zero1)) => (
                Box::new(ZeroRedundancyOptimizer::new(params, comm, make)?),
                None,
            ),
            Some((comm, DataParallel::Zero2)) => (
                Box::new(ShardedGradientOptimizer::new(params, comm, make)?),
                None,
            ),
            Some((comm, DataParallel::Zero3)) => {
                let fsdp = FullyShardedDataParallel::new(model.module_mut(), comm, make)?;
                sharded = Some(fsdp.sharded_parameters());
                (Box::new(fsdp), None)
            }
        };
        // ANCHOR_END: data_parallel_choice
        // ANCHOR: offload_setup
        let offload = config.offload.then(|| {
            Arc::new(OffloadHooks::new(OffloadOptions {
                min_bytes: config.offload_min_bytes,
                share: config.offload_share,
                max_in_flight_bytes: config.offload_in_flight,
                // Each copy timed, to tell how much of it the step's compute hides.
                time_copies: !device.is_dry(),
                ..OffloadOptions::default()
            }))
        });
        // ANCHOR_END: offload_setup
        Ok(Trainer {
            config: config.clone(),
            model,
            optimizer,
            scaler: (config.amp == AmpMode::F16).then(GradScaler::new),
            offload,
            device: device.clone(),
            skipped_steps: 0,
            ddp,
            data,
            sharded,
            captured: None,
        })
    }

    /// Every parameter's values, as new tensors in the module's parameter order; under
    /// ZeRO-3 gathered from the ranks' shards (a collective: every rank calls it).
    pub fn full_parameters(&self) -> Result<Vec<Tensor>> {
        let _off = labs_core::tensor::no_grad();
        match &self.sharded {
            Some(s) => Ok(s.full_parameters()?),
            None => Ok(self
                .model
                .module()
                .parameters()
                .iter()
                .map(|p| p.detach().contiguous())
                .collect::<labs_core::Result<_>>()?),
        }
    }

    /// What the offload hooks did so far, when offloading.
    pub fn offload_stats(&self) -> Option<OffloadStats> {
        self.offload.as_ref().map(|h| h.stats())
    }

    /// How long the offload copies since the last call kept the copy stream busy, when
    /// offloading on a device that runs them (after a synchronisation).
    pub fn take_offload_copy_times(&self) -> Result<Option<CopyTimes>> {
        match &self.offload {
            Some(h) if !self.device.is_dry() => Ok(Some(h.take_copy_times()?)),
            _ => Ok(None),
        }
    }

    /// Forward and backward of one micro-batch, its loss divided by `divisor` (the
    /// micro-batches per step), the gradients added to `.grad`. Returns the divided
    /// loss, or `None` on the dry-run device (which computes no values).
    pub fn micro_batch(&mut self, batch: &Batch, divisor: usize) -> Result<Option<f64>> {
        let loss = self.micro_batch_loss(batch, divisor)?;
        if self.device.is_dry() {
            return Ok(None);
        }
        let value = if loss.dtype() == DType::F32 {
            loss.item::<f32>()?
        } else {
            loss.to_dtype(DType::F32)?.item::<f32>()?
        };
        Ok(Some(value as f64))
    }

    // ANCHOR: micro_batch
    /// Forward and backward of one micro-batch, as [`Trainer::micro_batch`], returning
    /// the divided loss as a tensor, unread: what a captured step can do.
    fn micro_batch_loss(&mut self, batch: &Batch, divisor: usize) -> Result<Tensor> {
        let _backend = sdpa_kernel(match self.config.attention {
            AttentionMode::Naive => SdpaBackend::Math,
            AttentionMode::Fused => SdpaBackend::Fused,
        });
        let loss = {
            let _offload = (self.offload.as_ref()).map(|h| push_saved_tensors_hooks(h.clone()));
            let _autocast = self.autocast()?;
            self.model.loss(batch)?.scale(1.0 / divisor as f32)?
        };
        match &self.scaler {
            Some(scaler) => scaler.scale(&loss)?.backward()?,
            None => loss.backward()?,
        }
        Ok(loss.detach())
    }
    // ANCHOR_END: micro_batch

    fn autocast(&self) -> Result<Option<AutocastGuard>> {
        Ok(match self.config.amp {
            AmpMode::None => None,
            AmpMode::Bf16 => Some(autocast(DType::BF16)?),
            AmpMode::F16 => Some(autocast(DType::F16)?),
        })
    }

    /// The optimizer step (through the scaler with float16), then the gradients
    /// dropped. Returns whether the step ran.
    pub fn optimizer_step(&mut self) -> Result<bool> {
        let stepped = match &mut self.scaler {
            Some(scaler) => {
                let stepped = scaler.step(self.optimizer.as_mut())?;
                scaler.update()?;
                stepped
            }
            None => {
                self.optimizer.step()?;
                true
            }
        };
        if !stepped {
            self.skipped_steps += 1;
        }
        self.optimizer.zero_grad(true)?;
        Ok(stepped)
    }

    // ANCHOR: accumulation_loop
    /// Optimizer step `step`: `accum` fresh micro-batches, each made just before its
    /// forward, then the update. Returns the mean loss (the sum of the divided losses),
    /// `None` on the dry-run device.
    pub fn step(&mut self, step: usize) -> Result<Option<f64>> {
        let k = self.config.accum;
        let mut total = Some(0.0);
        let ddp = self.ddp.clone();
        for micro in 0..k {
            let batch = Batch::random(&self.data, step, micro, &self.device)?;
            // DDP's no_sync on all but the last micro-batch: the gradients sum locally.
            let _local = ddp.as_ref().filter(|_| micro + 1 < k).map(|d| d.no_sync());
            let loss = self.micro_batch(&batch, k)?;
            total = total.zip(loss).map(|(a, b)| a + b);
        }
        if let Some(ddp) = &ddp {
            ddp.finish()?;
        }
        self.optimizer_step()?;
        Ok(total)
    }
    // ANCHOR_END: accumulation_loop

    /// The captured step's figures (`--graph`), once captured.
    pub fn graph_report(&self) -> Result<Option<crate::GraphReport>> {
        let Some(c) = &self.captured else {
            return Ok(None);
        };
        let pool = c.graph.pool().context("a captured graph has a pool")?;
        let stats = self.device.allocator()?.pool_stats(pool.id())?;
        Ok(Some(crate::GraphReport {
            nodes: c.graph.nodes(),
            pool_reserved: stats.reserved,
            pool_allocated: stats.allocated,
        }))
    }

    // ANCHOR: graph_step
    /// Optimizer step `step` under `--graph`, after the warm-up steps (which are
    /// [`Trainer::step`]'s): the step's data copied into the captured inputs, then one
    /// replay; the first time, the step is captured first, on the data made for it (a
    /// capture records the work without running it).
    pub fn graph_step(&mut self, step: usize) -> Result<Option<f64>> {
        let k = self.config.accum;
        let batches = (0..k)
            .map(|micro| Batch::random(&self.data, step, micro, &self.device))
            .collect::<Result<Vec<_>>>()?;
        let captured = match self.captured.take() {
            Some(c) => {
                for (input, data) in c.inputs.iter().zip(&batches) {
                    input.copy_from(data)?;
                }
                c
            }
            None => {
                let mut graph = Graph::new(&self.device)?;
                let loss = graph
                    .capture(None, || {
                        let mut total: Option<Tensor> = None;
                        for batch in &batches {
                            let loss = self.micro_batch_loss(batch, k)?.to_dtype(DType::F32)?;
                            total = Some(match total {
                                Some(t) => t.add(&loss)?,
                                None => loss,
                            });
                        }
                        self.optimizer_step()?;
                        total.context("a step of no micro-batch")
                    })
                    .context("capturing the step as a graph")?;
                CapturedStep {
                    graph,
                    inputs: batches,
                    loss,
                }
            }
        };
        captured.graph.replay()?;
        let value = match self.device.is_dry() {
            true => None,
            false => Some(captured.loss.item::<f32>()? as f64),
        };
        self.captured = Some(captured);
        Ok(value)
    }
    // ANCHOR_END: graph_step
}

pub fn amp_name(amp: AmpMode) -> &'static str {
    match amp {
        AmpMode::None => "none",
        AmpMode::Bf16 => "bf16",
        AmpMode::F16 => "f16",
    }
}
