//! Activation checkpointing with PyTorch's non-reentrant semantics
//! (`torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False)`), built as
//! PyTorch builds it: out of saved-tensor hooks.
//!
//! In forward, the region runs under a pack hook that keeps nothing but a number (the
//! tensor's position among those the region saved): the region's internal activations
//! are freed as soon as the region no longer uses them, and only its inputs are kept.
//! The first time backward unpacks one of those numbers, the region runs again from its
//! inputs, with recording on and the device generators put back to where they were at
//! the forward (so dropout draws the same masks), under a hook that keeps what it saves;
//! unpacking then hands back the recomputed tensor at that position. The original
//! graph's nodes differentiate with the recomputed tensors, so the gradients are those
//! of the run without checkpointing, bit for bit.
//!
//! **Selective** checkpointing (`create_selective_checkpoint_contexts(policy_fn)`): a
//! policy decides, per op, whether to keep its output from the forward (matrix
//! products, attention: costly to redo) or to recompute it (cheap elementwise and norm
//! ops). As in PyTorch, a kept op's output is kept whether or not backward saves it
//! (a feed-forward layer's first product, which only the activation after it reads, is
//! kept too), a saved tensor is kept when the op that produced it is, and the
//! recomputation hands each kept op its output back, so that no second copy exists.
//! The recomputation skips the kernels of the kept products (`matmul`, `linear`), as
//! PyTorch's skips every kept op; the other kept ops (attention) run again and their
//! results are dropped for the kept ones.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::{
    enable_grad, push_saved_tensors_hooks, GradOp, Packed, SavedTensorsHooks, Tensor,
};

/// What to do with a saved tensor in a selectively checkpointed region (PyTorch's
/// `torch.utils.checkpoint.CheckpointPolicy`). `Must` and `Prefer` behave the same
/// here; the names follow PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointPolicy {
    MustSave,
    PreferSave,
    MustRecompute,
    PreferRecompute,
}

impl CheckpointPolicy {
    fn saves(self) -> bool {
        matches!(
            self,
            CheckpointPolicy::MustSave | CheckpointPolicy::PreferSave
        )
    }
}

/// A selective policy: given the op that produced a saved tensor (its `grad_fn`'s op,
/// or the saving op itself for a tensor it made: its own output, a dropout mask, a
/// norm's statistics), whether to keep it.
pub type PolicyFn = Arc<dyn Fn(&GradOp) -> CheckpointPolicy + Send + Sync>;

/// The common selective policy: keep what matrix products (PyTorch's `mm`, `bmm`, and
/// `addmm`: a linear layer with its bias) and attention produced, recompute the rest
/// (elementwise ops, norms, softmax, dropout).
pub fn save_matmul_and_attention(op: &GradOp) -> CheckpointPolicy {
    match op {
        GradOp::Matmul | GradOp::Linear { .. } | GradOp::Attention { .. } => {
            CheckpointPolicy::MustSave
        }
        _ => CheckpointPolicy::PreferRecompute,
    }
}

/// Options of [`checkpoint_with`].
#[derive(Clone, Default)]
pub struct CheckpointOptions {
    /// `None`: recompute everything (plain checkpointing).
    pub policy: Option<PolicyFn>,
}

type RegionFn = dyn Fn(&[Tensor]) -> Result<Tensor> + Send + Sync;

/// What a checkpointed region keeps between its forward and its recomputation.
struct Frame {
    f: Box<RegionFn>,
    /// The region's inputs, detached, and whether each required a gradient.
    inputs: Vec<(Tensor, bool)>,
    /// Each device's generator state when the forward began.
    rng: Vec<(Device, (u64, u64))>,
    policy: Option<PolicyFn>,
    /// Tensors saved in the forward so far (the next one's position).
    saved_count: AtomicUsize,
    /// Positions whose tensor the forward kept (selective policy).
    kept: Mutex<HashSet<usize>>,
    /// Recomputed tensors not yet unpacked, by position.
    recomputed: Mutex<HashMap<usize, Tensor>>,
    /// The outputs of the ops the region recorded, in order, where the selective
    /// policy keeps them, with the op's name: taken by the recomputation (the nodes
    /// that saved them hold them from then on).
    outputs: Mutex<Vec<Option<(String, Tensor)>>>,
}

/// What the forward's pack hook returned.
enum Slot {
    /// Recomputed when needed.
    Recompute(usize),
    /// Kept from the forward (selective policy), detached.
    Kept(Tensor),
}

/// The forward's hooks.
struct ForwardHooks(Arc<Frame>);

/// The recomputation's hooks: they keep what the region saves, by position, and hand
/// the kept ops' outputs back.
struct RecomputeHooks {
    frame: Arc<Frame>,
    next: AtomicUsize,
    next_output: AtomicUsize,
}

/// The op whose output `t` is, for a policy: its producer, or the saving op for a
/// tensor with no graph of its own that the saving op made (a mask, statistics).
fn producer(t: &Tensor, saved_by: &GradOp) -> GradOp {
    t.grad_fn()
        .map_or_else(|| saved_by.clone(), |n| n.op.clone())
}

impl ForwardHooks {
    /// Keeps `t` when it lives anyway (a leaf that requires grad, a parameter: keeping
    /// it costs nothing) or the policy saves what `producer` made; else it is
    /// recomputed. `None`: no policy, or an op autograd cannot name (recomputed, as
    /// PyTorch's policy recomputes a copy of an input that needs no gradient).
    fn pack_made_by(&self, t: &Tensor, saved_by: &GradOp, producer: Option<GradOp>) -> Packed {
        let frame = &self.0;
        let position = frame.saved_count.fetch_add(1, Ordering::SeqCst);
        let keep = (t.requires_grad() && t.is_leaf())
            || producer.is_some_and(|op| frame.policy.as_ref().is_some_and(|p| p(&op).saves()));
        if keep {
            frame.kept.lock().unwrap().insert(position);
            t.mark_saved(saved_by);
            return Box::new(Slot::Kept(t.detach()));
        }
        Box::new(Slot::Recompute(position))
    }
}

impl SavedTensorsHooks for ForwardHooks {
    fn pack_untracked_input(&self, t: &Tensor, saved_by: &GradOp) -> Result<Packed> {
        Ok(self.pack_made_by(t, saved_by, None))
    }

    fn pack(&self, t: &Tensor, saved_by: &GradOp) -> Result<Packed> {
        // The producer is looked up only for a policy to ask.
        let op = self.0.policy.is_some().then(|| producer(t, saved_by));
        Ok(self.pack_made_by(t, saved_by, op))
    }

    fn output(&self, op: &GradOp, out: Tensor) -> Tensor {
        let frame = &self.0;
        let Some(policy) = &frame.policy else {
            return out;
        };
        let keep = policy(op).saves().then(|| {
            out.mark_saved(op);
            (op.name(), out.detach())
        });
        frame.outputs.lock().unwrap().push(keep);
        out
    }

    fn unpack(&self, packed: &Packed) -> Result<Tensor> {
        let slot = ForwardHooks::slot(packed)
            .ok_or_else(|| Error::InvalidArgument("checkpoint: a foreign packed value".into()))?;
        let position = match slot {
            Slot::Kept(t) => return Ok(t.clone()),
            Slot::Recompute(p) => *p,
        };
        let frame = &self.0;
        let present = frame.recomputed.lock().unwrap().contains_key(&position);
        if !present {
            recompute(frame)?;
        }
        frame
            .recomputed
            .lock()
            .unwrap()
            .remove(&position)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "checkpoint: the recomputation did not save tensor {position} of the \
                     forward (is the region deterministic in what it computes?)"
                ))
            })
    }

    fn resident(&self, packed: &Packed) -> Option<Tensor> {
        match ForwardHooks::slot(packed)? {
            Slot::Kept(t) => Some(t.clone()),
            Slot::Recompute(_) => None,
        }
    }
}

impl ForwardHooks {
    fn slot(packed: &Packed) -> Option<&Slot> {
        packed.downcast_ref::<Slot>()
    }
}

impl SavedTensorsHooks for RecomputeHooks {
    fn pack(&self, t: &Tensor, saved_by: &GradOp) -> Result<Packed> {
        let position = self.next.fetch_add(1, Ordering::SeqCst);
        if !self.frame.kept.lock().unwrap().contains(&position) {
            t.mark_saved(saved_by);
            self.frame
                .recomputed
                .lock()
                .unwrap()
                .insert(position, t.detach());
        }
        Ok(Box::new(()))
    }

    fn output(&self, _op: &GradOp, out: Tensor) -> Tensor {
        let position = self.next_output.fetch_add(1, Ordering::SeqCst);
        let kept = (self.frame.outputs.lock().unwrap())
            .get_mut(position)
            .and_then(Option::take);
        // The forward's output, bit for bit the one the op would recompute (the region
        // is deterministic, dropout replayed): handed back, so that no second copy
        // lives (an op that asked `replayed_output` first did not even compute one).
        kept.map_or(out, |(_, t)| t)
    }

    fn replayed_output(&self, op: &GradOp) -> Option<Tensor> {
        let position = self.next_output.load(Ordering::SeqCst);
        let outputs = self.frame.outputs.lock().unwrap();
        match outputs.get(position) {
            Some(Some((name, t))) if *name == op.name() => Some(t.clone()),
            _ => None,
        }
    }

    fn unpack(&self, _: &Packed) -> Result<Tensor> {
        Err(Error::InvalidArgument(
            "checkpoint: the recomputed graph is not differentiated itself".into(),
        ))
    }
}

/// Re-runs the region from its inputs with the forward's generator states, recording,
/// keeping what it saves in the frame.
fn recompute(frame: &Arc<Frame>) -> Result<()> {
    let _recording = enable_grad();
    let now: Vec<(u64, u64)> = frame.rng.iter().map(|(d, _)| d.rng_state()).collect();
    for (device, state) in &frame.rng {
        device.set_rng_state(*state);
    }
    let hooks = Arc::new(RecomputeHooks {
        frame: frame.clone(),
        next: AtomicUsize::new(0),
        next_output: AtomicUsize::new(0),
    });
    let result = {
        let _hooks = push_saved_tensors_hooks(hooks.clone());
        let inputs: Vec<Tensor> = (frame.inputs.iter())
            .map(|(t, requires)| t.detach().requires_grad_(*requires))
            .collect();
        (frame.f)(&inputs)
    };
    for ((device, _), state) in frame.rng.iter().zip(now) {
        device.set_rng_state(state);
    }
    drop(result?);
    let (forward, again) = (
        frame.saved_count.load(Ordering::SeqCst),
        hooks.next.load(Ordering::SeqCst),
    );
    if forward != again {
        return Err(Error::InvalidArgument(format!(
            "checkpoint: the recomputation saved {again} tensors, the forward {forward}: \
             the region must run the same ops each time"
        )));
    }
    Ok(())
}

/// Runs `f(inputs)` without keeping the region's internal activations; backward
/// recomputes them (`checkpoint(fn, *inputs, use_reentrant=False)`). `f` is kept for
/// the recomputation, hence `'static`: capture modules through an `Arc`.
pub fn checkpoint<F>(f: F, inputs: &[Tensor]) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    checkpoint_with(f, inputs, CheckpointOptions::default())
}

/// [`checkpoint`] with options: a selective policy
/// (`create_selective_checkpoint_contexts`).
pub fn checkpoint_with<F>(f: F, inputs: &[Tensor], options: CheckpointOptions) -> Result<Tensor>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
{
    let mut rng: Vec<(Device, (u64, u64))> = Vec::new();
    for t in inputs {
        let d = t.device();
        if !rng.iter().any(|(known, _)| known.same(d)) {
            rng.push((d.clone(), d.rng_state()));
        }
    }
    for t in inputs {
        // The inputs are what the region keeps: activations of the step.
        if let Ok(allocator) = t.device().allocator() {
            let _ = allocator.mark_saved(&t.allocation(), || "CheckpointBackward".into());
        }
    }
    let frame = Arc::new(Frame {
        f: Box::new(f),
        inputs: inputs
            .iter()
            .map(|t| (t.detach(), t.requires_grad()))
            .collect(),
        rng,
        policy: options.policy,
        saved_count: AtomicUsize::new(0),
        kept: Mutex::new(HashSet::new()),
        recomputed: Mutex::new(HashMap::new()),
        outputs: Mutex::new(Vec::new()),
    });
    let _hooks = push_saved_tensors_hooks(Arc::new(ForwardHooks(frame.clone())));
    (frame.f)(inputs)
}
