//! What autograd records as ops run: a node per op that produced a tensor needing a
//! gradient, naming the op, the inputs its gradient flows to, and the tensors it saved
//! for backward. This file only records; the backward pass (the engine and each op's
//! derivative) lives above, in `autograd`.
//!
//! As in PyTorch, a node holds its inputs' *edges* (their nodes, or a leaf's gradient
//! slot), not the inputs themselves: an input the derivative does not need is freed as
//! soon as the program drops it. What the derivative needs is saved explicitly, listed
//! on the node, and released by a backward pass that does not retain the graph.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use super::saved_hooks::PackedSaved;
use super::{DType, Tensor};
use crate::kernels::{AttentionDropout, BinaryOp, UnaryOp};

/// The op a node differentiates, with what its derivative needs besides saved tensors.
#[derive(Debug, Clone, PartialEq)]
pub enum GradOp {
    /// An elementwise op and its scalar.
    Unary(UnaryOp, f32),
    Binary(BinaryOp),
    /// A sum (times `scale`, for means) over `dims` of an input of shape `input`.
    Sum {
        dims: Vec<usize>,
        keepdim: bool,
        input: Vec<usize>,
        scale: f32,
    },
    /// A reordering of dimensions.
    Permute(Vec<usize>),
    /// `len` entries of dimension `dim` from `start` of an input with `full` entries
    /// there: the gradient goes back into its place, zeros around it.
    Narrow {
        dim: usize,
        start: usize,
        full: usize,
    },
    /// Another shape over the same elements (view, reshape) of an input of this shape.
    Reshape(Vec<usize>),
    /// A dense copy (`contiguous`): the gradient passes through.
    Identity,
    /// A matrix product (`matmul`): 2-D, batched, or batched with a shared `[k, n]`
    /// weight.
    Matmul,
    /// `linear` with its bias added by the product (`addmm`); inputs: x, weightᵀ (the
    /// transposed view), the bias; saved: x and weightᵀ, as by `Matmul`. The bias's
    /// gradient (the sum of the output gradient's rows) is computed only when
    /// `bias_needs_grad`.
    Linear {
        bias_needs_grad: bool,
    },
    /// A cast between float dtypes from `from`: the gradient is cast back.
    Cast {
        from: DType,
    },
    /// A binary op whose operands of shapes `a` and `b` were broadcast: each input's
    /// gradient is summed back to its shape. `needs` says which inputs need one (the
    /// scalar of `add_scalar` does not, and its sum over every element is skipped).
    BroadcastBinary {
        op: BinaryOp,
        a: Vec<usize>,
        b: Vec<usize>,
        needs: [bool; 2],
    },
    /// A binary op on float operands of two different dtypes, each read in its own
    /// (`tensor/mixed.rs`), of shapes `a` and `b`: each input's gradient is computed in
    /// float32, summed back to its shape and cast to its dtype (`dtypes`); `needs` as
    /// for `BroadcastBinary`.
    MixedBinary {
        op: BinaryOp,
        a: Vec<usize>,
        b: Vec<usize>,
        dtypes: [DType; 2],
        needs: [bool; 2],
    },
    /// `where(cond, a, b)` with operands of shapes `a` and `b` (the condition saved);
    /// `needs` as for `BroadcastBinary`.
    Where {
        a: Vec<usize>,
        b: Vec<usize>,
        needs: [bool; 2],
    },
    /// `softmax` (or with `log`, `log_softmax`) over `dim`; saved: the output (in its
    /// own dtype, float32 when a half input was asked for a float32 output). The
    /// gradient is written in `input_dtype`.
    Softmax {
        dim: usize,
        log: bool,
        input_dtype: DType,
    },
    /// `layer_norm` over the trailing `normalized_shape`; inputs: x, then the weight and
    /// the bias when given; saved: x (dense), mean, rstd, then the weight if any.
    LayerNorm {
        normalized_shape: Vec<usize>,
        has_weight: bool,
        has_bias: bool,
    },
    /// `dropout` with its `1 / (1 - p)` scale; saved: the uint8 mask.
    Dropout {
        scale: f32,
    },
    /// `embedding` into a weight of `vocab` rows; input: the weight; saved: the indices.
    Embedding {
        vocab: usize,
    },
    /// `cat` along `dim` of inputs of these sizes along it.
    Cat {
        dim: usize,
        sizes: Vec<usize>,
    },
    /// `nll_loss` (mean) over `[N, classes]` log-probabilities; saved: the targets and
    /// the count of rows not ignored.
    NllLoss {
        ignore_index: i64,
        classes: usize,
    },
    /// `linear_cross_entropy` (mean) over `[rows, in]` inputs; inputs: x, the weight,
    /// the bias if any; `needs` says which of the three get a gradient. Saved: the
    /// count of rows counted (at least 1), then the unscaled gradients of the inputs
    /// that need one, computed in forward.
    LinearCrossEntropy {
        needs: [bool; 3],
    },
    /// `mse_loss` (mean) of an input and a target of one shape and dtype; saved: the
    /// two (their difference is recomputed in backward, as PyTorch's).
    MseLoss {
        target_needs_grad: bool,
    },
    /// `max` over `dim` of an input of shape `input`; saved: the int64 indices.
    MaxDim {
        dim: usize,
        keepdim: bool,
        input: Vec<usize>,
    },
    /// `var` over `dims` with `correction`; saved: the input.
    Var {
        dims: Vec<usize>,
        correction: usize,
        keepdim: bool,
    },
    /// Fused attention (`fused_attention`) with its scale, causal mask and dropout (the
    /// generator state its mask was drawn from); inputs: q, k, v; saved: q, k, v (the
    /// caller's views), the output and the float32 log-sum-exp of each query row: never
    /// the scores nor the dropout mask.
    Attention {
        scale: f32,
        causal: bool,
        dropout: AttentionDropout,
    },
}

impl GradOp {
    /// PyTorch's name for the node (`MulBackward0`), as `grad_fn` prints it.
    pub fn name(&self) -> String {
        match self {
            GradOp::Unary(op, _) => format!("{}Backward", capitalised(op.name())),
            GradOp::Binary(op) => format!("{}Backward", capitalised(op.name())),
            GradOp::Sum { scale, .. } if *scale != 1.0 => "MeanBackward".into(),
            GradOp::Sum { .. } => "SumBackward".into(),
            GradOp::Permute(_) => "PermuteBackward".into(),
            GradOp::Narrow { .. } => "NarrowBackward".into(),
            GradOp::Reshape(_) => "ViewBackward".into(),
            GradOp::Identity => "CloneBackward".into(),
            GradOp::Matmul => "MmBackward".into(),
            GradOp::Linear { .. } => "AddmmBackward".into(),
            GradOp::Cast { .. } => "ToCopyBackward".into(),
            GradOp::BroadcastBinary { op, .. } | GradOp::MixedBinary { op, .. } => {
                format!("{}Backward", capitalised(op.name()))
            }
            GradOp::Where { .. } => "WhereBackward".into(),
            GradOp::Softmax { log: false, .. } => "SoftmaxBackward".into(),
            GradOp::Softmax { log: true, .. } => "LogSoftmaxBackward".into(),
            GradOp::LayerNorm { .. } => "NativeLayerNormBackward".into(),
            GradOp::Dropout { .. } => "NativeDropoutBackward".into(),
            GradOp::Embedding { .. } => "EmbeddingBackward".into(),
            GradOp::Cat { .. } => "CatBackward".into(),
            GradOp::NllLoss { .. } => "NllLossBackward".into(),
            GradOp::LinearCrossEntropy { .. } => "LinearCrossEntropyBackward".into(),
            GradOp::MseLoss { .. } => "MseLossBackward".into(),
            GradOp::MaxDim { .. } => "MaxBackward".into(),
            GradOp::Var { .. } => "VarBackward".into(),
            GradOp::Attention { .. } => "ScaledDotProductFlashAttentionBackward".into(),
        }
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// A leaf's accumulated gradient (`.grad`), shared by the leaf and the edges to it.
pub type GradSlot = Arc<GradCell>;

/// A hook run after a backward pass has accumulated a leaf's gradient (PyTorch's
/// `register_post_accumulate_grad_hook`); it gets the accumulated `.grad`.
pub type PostAccumulateGradHook = Arc<dyn Fn(&Tensor) -> crate::error::Result<()> + Send + Sync>;

/// What a leaf's slot holds: its gradient and the hooks to run once a backward pass has
/// accumulated into it (`autograd/grad_hooks.rs`).
#[derive(Default)]
pub struct GradCell {
    grad: Mutex<Option<Tensor>>,
    /// `(id, hook)`, in registration order; the id removes it.
    pub(crate) hooks: Mutex<Vec<(u64, PostAccumulateGradHook)>>,
}

impl GradCell {
    /// The gradient, locked.
    pub fn lock(&self) -> std::sync::LockResult<std::sync::MutexGuard<'_, Option<Tensor>>> {
        self.grad.lock()
    }
}

/// Where an input's gradient goes.
#[derive(Clone)]
pub enum Edge {
    /// To the node that produced the input.
    Node(Arc<Node>),
    /// Into a leaf's `.grad`.
    Leaf(GradSlot),
}

/// One recorded op.
pub struct Node {
    pub op: GradOp,
    /// The order the node was recorded in (PyTorch's `sequence_nr`): backward runs, of
    /// the nodes whose gradients are complete, the latest recorded first, as PyTorch's
    /// engine does. The order decides when each node's saved tensors are released.
    pub sequence_nr: u64,
    /// One entry per input: `None` for an input that needs no gradient.
    pub inputs: Vec<Option<Edge>>,
    /// The tensors the derivative reads, stored without their own graph (detached);
    /// `None` once a backward pass released them. Empty when saved-tensor hooks were
    /// installed as the op ran: the tensors are then in `packed`.
    pub saved: Mutex<Option<Vec<Tensor>>>,
    /// The saved tensors as the installed saved-tensor hooks packed them, if any were.
    pub packed: Option<PackedSaved>,
    /// Hooks on the gradient of this node's output (`Tensor::register_hook` on a
    /// non-leaf), run in registration order when backward reaches the node, before its
    /// derivative.
    pub hooks: Mutex<Vec<GradHook>>,
}

/// A hook on a non-leaf tensor's gradient (PyTorch's `Tensor.register_hook`, observing
/// only): it gets the gradient as backward computed it.
pub type GradHook = Arc<dyn Fn(&Tensor) -> crate::error::Result<()> + Send + Sync>;

/// Drops a graph without recursing once per node: a chain of a million ops (a deep
/// model, a long loop) would otherwise overflow the stack of the thread that drops its
/// last tensor. Each input node this node holds the last reference to is taken apart
/// here, its own inputs moved onto a list, so that every node is dropped with its
/// inputs already taken out.
impl Drop for Node {
    fn drop(&mut self) {
        let mut orphans: Vec<Arc<Node>> = Vec::new();
        take_last_references(&mut self.inputs, &mut orphans);
        while let Some(node) = orphans.pop() {
            // `None`: someone else holds it now; the last holder drops it.
            if let Some(mut node) = Arc::into_inner(node) {
                take_last_references(&mut node.inputs, &mut orphans);
            }
        }
    }
}

/// Moves the edges to nodes held by nothing but `inputs` into `orphans`; the others
/// only lose a reference when `inputs` goes.
fn take_last_references(inputs: &mut [Option<Edge>], orphans: &mut Vec<Arc<Node>>) {
    for input in inputs {
        if matches!(input, Some(Edge::Node(n)) if Arc::strong_count(n) == 1) {
            if let Some(Edge::Node(n)) = input.take() {
                orphans.push(n);
            }
        }
    }
}

/// A tensor's place in the graph.
#[derive(Clone)]
pub(crate) enum Grad {
    /// A leaf whose gradient is accumulated (`requires_grad_(true)`).
    Leaf(GradSlot),
    /// The output of a recorded op.
    Output(Arc<Node>),
}

/// The next node's [`Node::sequence_nr`]. One counter for the process (PyTorch keeps
/// one per thread): only the order of one graph's nodes matters.
static NEXT_SEQUENCE_NR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether ops record a graph on this thread (`torch.is_grad_enabled()`).
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Turns recording on until dropped, then restores what it was (`torch.enable_grad()`):
/// how a recomputation inside a backward pass (which runs with recording off) records.
pub fn enable_grad() -> NoGradGuard {
    NoGradGuard {
        previous: GRAD_ENABLED.with(|g| g.replace(true)),
    }
}

/// Turns recording off until dropped, then restores what it was (`torch.no_grad()`);
/// scopes nest.
pub struct NoGradGuard {
    previous: bool,
}

/// Ops record no graph while the returned guard lives.
pub fn no_grad() -> NoGradGuard {
    NoGradGuard {
        previous: GRAD_ENABLED.with(|g| g.replace(false)),
    }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

impl Tensor {
    /// Marks this tensor as a leaf whose gradient is accumulated in [`Tensor::grad`]
    /// (`requires_grad_()`); `false` makes it a plain tensor again. Returns the tensor,
    /// sharing storage.
    pub fn requires_grad_(mut self, requires: bool) -> Tensor {
        self.grad = requires.then(|| Grad::Leaf(Arc::new(GradCell::default())));
        self
    }

    /// Whether a gradient flows to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.grad.is_some()
    }

    /// A leaf: made by the program, not by a recorded op.
    pub fn is_leaf(&self) -> bool {
        !matches!(self.grad, Some(Grad::Output(_)))
    }

    /// The gradient accumulated into this leaf by backward passes, if any.
    pub fn grad(&self) -> Option<Tensor> {
        match &self.grad {
            Some(Grad::Leaf(slot)) => slot.lock().unwrap().clone(),
            _ => None,
        }
    }

    /// Drops the accumulated gradient (`zero_grad(set_to_none=True)`, PyTorch's default),
    /// so that its memory goes back to the cache.
    pub fn clear_grad(&self) {
        if let Some(Grad::Leaf(slot)) = &self.grad {
            slot.lock().unwrap().take();
        }
    }

    /// The node that produced this tensor (`grad_fn`), if a recorded op did.
    pub fn grad_fn(&self) -> Option<Arc<Node>> {
        match &self.grad {
            Some(Grad::Output(node)) => Some(node.clone()),
            _ => None,
        }
    }

    /// The same data with no graph (`detach()`): sharing storage, requiring no gradient.
    pub fn detach(&self) -> Tensor {
        let mut t = self.clone();
        t.grad = None;
        t
    }

    /// The leaf's gradient slot (for the engine).
    pub fn grad_slot(&self) -> Option<GradSlot> {
        match &self.grad {
            Some(Grad::Leaf(slot)) => Some(slot.clone()),
            _ => None,
        }
    }

    /// Where a gradient for this tensor goes, if it needs one.
    fn edge(&self) -> Option<Edge> {
        match &self.grad {
            Some(Grad::Leaf(slot)) => Some(Edge::Leaf(slot.clone())),
            Some(Grad::Output(node)) => Some(Edge::Node(node.clone())),
            None => None,
        }
    }

    /// The output an op about to run on `inputs` would be given anyway by the
    /// installed saved-tensor hooks (see `SavedTensorsHooks::replayed_output`), when it
    /// records: the op may return it through [`Tensor::recorded`] without running its
    /// kernels.
    pub(crate) fn replayed_output(op: &GradOp, inputs: &[&Tensor]) -> Option<Tensor> {
        if !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
            return None;
        }
        super::saved_hooks::current_saved_tensors_hooks()?.replayed_output(op)
    }

    /// `out` as the result of `op` on `inputs`, recording a node when recording is on
    /// and some input needs a gradient; `saved` are the tensors the derivative reads.
    pub(crate) fn recorded(
        mut out: Tensor,
        op: GradOp,
        inputs: &[&Tensor],
        saved: Vec<Tensor>,
    ) -> Tensor {
        if !is_grad_enabled() || !inputs.iter().any(|t| t.requires_grad()) {
            return out;
        }
        let hooks = super::saved_hooks::current_saved_tensors_hooks();
        if let Some(hooks) = &hooks {
            out = hooks.output(&op, out);
        }
        let hooks = hooks.filter(|_| !saved.is_empty());
        let (saved, packed) = match hooks {
            // The hooks decide where each saved tensor lives (and its category).
            Some(hooks) => (
                Vec::new(),
                Some(super::saved_hooks::pack_all(hooks, &saved, &op, inputs)),
            ),
            None => {
                // What autograd keeps for backward is an activation from now on, unless
                // it was already something more specific (a parameter, an input).
                for t in &saved {
                    t.mark_saved(&op);
                }
                (saved.iter().map(Tensor::detach).collect(), None)
            }
        };
        let node = Node {
            op,
            sequence_nr: NEXT_SEQUENCE_NR.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            inputs: inputs.iter().map(|t| t.edge()).collect(),
            saved: Mutex::new(Some(saved)),
            packed,
            hooks: Mutex::new(Vec::new()),
        };
        out.grad = Some(Grad::Output(Arc::new(node)));
        out
    }
}
