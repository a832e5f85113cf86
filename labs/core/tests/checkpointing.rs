//! A training loop with activation checkpointing, generated rather than recorded, and
//! what it does to the default policy.
//!
//! In forward, a checkpointed layer keeps only its input; the activations inside it
//! are freed as soon as the layer is done. In backward, each layer's activations are
//! recomputed (many medium blocks, 1-100 MiB, allocated again), used by the layer's
//! backward in reverse order, and freed block by block, while the parameter gradients
//! are allocated for the first time and stay.

use labs_core::alloc::replay::{Trace, TraceEvent};
use labs_core::alloc::Config;
use labs_core::snapshot::TraceAction as Action;

const GPU: u64 = 80 << 30;

/// Records allocations and frees as trace events; addresses are just unique ids.
#[derive(Default)]
struct Recorder {
    events: Vec<TraceEvent>,
    next: u64,
}

impl Recorder {
    fn alloc(&mut self, size: u64) -> u64 {
        self.next += 1;
        let addr = self.next * 512;
        self.push(Action::Alloc, addr, size);
        addr
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.push(Action::FreeRequested, addr, size);
    }
    fn push(&mut self, action: Action, addr: u64, size: u64) {
        self.events.push(TraceEvent {
            action,
            addr,
            size,
            stream: 0,
            line: self.events.len() + 2,
        });
    }
}

/// The shape of a GPT-2-like model: fp32, `layers` transformer blocks of width
/// `width`, batch × sequence `tokens`, `heads` attention heads.
struct Model {
    layers: usize,
    width: u64,
    heads: u64,
    batch: u64,
    seq: u64,
    vocab: u64,
}

impl Model {
    /// Bytes of an fp32 tensor of `n` elements.
    fn f32(n: u64) -> u64 {
        4 * n
    }
    /// The tensors one layer's forward creates, in order, as sizes: each is saved for
    /// backward when the layer is not checkpointed.
    fn layer_activations(&self, seq: u64) -> Vec<u64> {
        let (b, c, h) = (self.batch, self.width, self.heads);
        let act = Self::f32(b * seq * c);
        vec![
            act,                          // ln_1
            Self::f32(b * seq * 3 * c),   // qkv
            Self::f32(b * h * seq * seq), // attention scores
            Self::f32(b * h * seq * seq), // softmax
            act,                          // attention output
            act,                          // projection + residual
            act,                          // ln_2
            Self::f32(b * seq * 4 * c),   // fc
            Self::f32(b * seq * 4 * c),   // gelu
            act,                          // mlp projection + residual
        ]
    }
    /// One layer's parameters, as sizes (weights and biases, layer norms).
    fn layer_parameters(&self) -> Vec<u64> {
        let c = self.width;
        vec![
            Self::f32(c),
            Self::f32(c),
            Self::f32(c * 3 * c),
            Self::f32(3 * c),
            Self::f32(c * c),
            Self::f32(c),
            Self::f32(c),
            Self::f32(c),
            Self::f32(c * 4 * c),
            Self::f32(4 * c),
            Self::f32(4 * c * c),
            Self::f32(c),
        ]
    }
}

/// `steps` training steps of `model` with every layer checkpointed, the sequence length
/// of step `s` given by `seq(s)`, Adam state created at the first optimizer step, and
/// gradients set to none after each step.
fn checkpointed_training(model: &Model, steps: usize, seq: impl Fn(usize) -> u64) -> Trace {
    let mut r = Recorder::default();
    let embedding = Model::f32(model.vocab * model.width);
    let params: Vec<u64> = std::iter::once(embedding)
        .chain((0..model.layers).flat_map(|_| model.layer_parameters()))
        .collect();
    let weights: Vec<u64> = params.iter().map(|&s| r.alloc(s)).collect();
    let mut adam: Vec<(u64, u64)> = Vec::new();
    for step in 0..steps {
        let t = seq(step);
        let act = Model::f32(model.batch * t * model.width);
        let tokens = r.alloc(8 * model.batch * t);
        // Forward: each layer keeps only its input (the checkpoint).
        let mut checkpoints = vec![r.alloc(act)];
        for _ in 0..model.layers {
            let inner: Vec<(u64, u64)> = (model.layer_activations(t).into_iter())
                .map(|s| (r.alloc(s), s))
                .collect();
            checkpoints.push(r.alloc(act));
            for (a, s) in inner {
                r.free(a, s);
            }
        }
        let logits_size = Model::f32(model.batch * t * model.vocab);
        let logits = r.alloc(logits_size);
        let loss = r.alloc(4);
        // Backward: the loss, the logits, then each layer from the last.
        let grad_logits = r.alloc(logits_size);
        r.free(logits, logits_size);
        let mut grads: Vec<Option<u64>> = vec![None; params.len()];
        grads[0] = Some(r.alloc(embedding));
        let mut grad_out = r.alloc(act);
        r.free(grad_logits, logits_size);
        r.free(checkpoints.pop().unwrap(), act);
        for layer in (0..model.layers).rev() {
            // Recompute the layer's activations from its checkpoint.
            let inner: Vec<(u64, u64)> = (model.layer_activations(t).into_iter())
                .map(|s| (r.alloc(s), s))
                .collect();
            let output = r.alloc(act);
            r.free(output, act);
            // Backward through them in reverse: each gradient made, used, freed.
            let first_param = 1 + layer * model.layer_parameters().len();
            let mut p = first_param + model.layer_parameters().len();
            let mut grad = grad_out;
            let mut grad_size = act;
            for (a, s) in inner.into_iter().rev() {
                let g = r.alloc(s);
                r.free(grad, grad_size);
                r.free(a, s);
                (grad, grad_size) = (g, s);
                // The parameters this op owns get their gradients now.
                for _ in 0..(model.layer_parameters().len() / 10).max(1) {
                    if p > first_param {
                        p -= 1;
                        if grads[p].is_none() {
                            grads[p] = Some(r.alloc(params[p]));
                        }
                    }
                }
            }
            while p > first_param {
                p -= 1;
                grads[p].get_or_insert_with(|| r.alloc(params[p]));
            }
            grad_out = r.alloc(act);
            r.free(grad, grad_size);
            r.free(checkpoints.pop().unwrap(), act);
        }
        r.free(grad_out, act);
        r.free(loss, 4);
        r.free(tokens, 8 * model.batch * t);
        // Optimizer: Adam's two moments on the first step, then the gradients go.
        if adam.is_empty() {
            for &s in &params {
                adam.push((r.alloc(s), s));
                adam.push((r.alloc(s), s));
            }
        }
        for (g, &s) in grads.iter().zip(&params) {
            r.free(g.unwrap(), s);
        }
    }
    for (w, &s) in weights.iter().zip(&params) {
        r.free(*w, s);
    }
    for (a, s) in adam {
        r.free(a, s);
    }
    Trace {
        name: "checkpointed_training".into(),
        events: r.events,
    }
}

/// The two loops the tests replay, by the names of their files in `data/synthetic`:
/// 4 steps of GPT-2 small at 4 × 512 tokens, and 6 steps of varying length.
fn generated_loops() -> [(&'static str, Trace); 2] {
    let model = gpt2_small();
    let fixed = model.seq;
    let varying = [512, 384, 448, 320, 512, 256];
    [
        (
            "checkpointed_gpt2_fixed",
            checkpointed_training(&model, 4, |_| fixed),
        ),
        (
            "checkpointed_gpt2_varlen",
            checkpointed_training(&model, 6, |s| varying[s % 6]),
        ),
    ]
}

fn gpt2_small() -> Model {
    Model {
        layers: 12,
        width: 768,
        heads: 12,
        batch: 4,
        seq: 512,
        vocab: 50257,
    }
}

/// Peak reserved over peak requested of the default policy on the generated
/// checkpointed loop (4 steps of GPT-2 small, 4 × 512 tokens; then 6 steps of varying
/// length), against fixed segments.
///
/// Measured: 1.0437 and 1.0314 (fixed segments: 1.2325 and 1.7943). PyTorch's own
/// allocator, replaying the same loops on an H100 (`data/synthetic`,
/// `ci/pytorch-replay.py`): native 1.2325 and 1.7943 (as our fixed segments),
/// `expandable_segments` 1.1859 and 1.1859, `cudaMallocAsync` 1.1096 and 1.1236, so its
/// best mode is 1.1096 and 1.1236, above ours; with `max_mapping_mb:64` ours gives
/// 1.1341 and 1.1096, which is why mappings stay at 16 MiB by default. The cause: the
/// peak (the logits' gradient, 392 MiB, in backward) maps new pages while about 100 MiB
/// of free memory sits on mapped pages that recycling cannot take back, because each
/// layer's 6 MiB checkpoint and the parameter gradients landed on part of a mapping
/// made for a large activation (mappings are runs of up to 8 pages, unmapped only
/// whole), and hold all of it: just before the last step's peak, 40 pages of 2 MiB
/// are stranded so, in 15 mappings each used in part by 6 MiB checkpoints and 2.25 to
/// 9 MiB gradients. With one page per mapping the same loop gives 1.0113:
/// that is the figure a fix of the cause should approach. The ceilings below are
/// today's, so that the loop cannot get worse unnoticed.
///
/// Tried and measured, not kept: preferring, among best fit's candidates, the place
/// that maps or strands the fewest pages (fixed 1.0437, varying 1.0262: the small
/// blocks land on mappings that are busy when they arrive and idle soon after; with
/// the largest free block as a candidate too, every shared trace got worse);
/// unmapping the idle mapping a block would use only part of, when that needs no
/// synchronisation (no change: almost every idle mapping is newer than the last
/// synchronisation); the same with a synchronisation when one is needed (fixed
/// 1.0402, varying 1.0332, and 3 to 10 times the synchronisations on the shared
/// traces); giving blocks wider than one mapping segments of their own
/// (1.0288 both, but seed_transformer_accum4x16 went from 1.0210 to 1.0334 and
/// resnet50's synchronisations from 18 to 45).
#[test]
fn checkpointed_training_stays_close_to_its_requests() {
    // Today's ceiling and PyTorch's best mode on an H100, for each loop.
    let [fixed, varying] = generated_loops();
    for ((name, trace), ceiling, pytorch_best) in [(fixed, 1.044, 1.1096), (varying, 1.032, 1.1236)]
    {
        let ours = labs_core::device::replay_on_sim(&trace, Config::labs(), GPU).unwrap();
        let native =
            labs_core::device::replay_on_sim(&trace, Config::pytorch_native(), GPU).unwrap();
        assert_eq!(ours.peak_requested, trace.peak_requested());
        assert_eq!(ours.unknown_frees, 0);
        let (f, n) = (ours.fragmentation(), native.fragmentation());
        println!("{name}: {f:.4} (fixed segments {n:.4})");
        assert!(f <= ceiling, "{name}: {f:.4} above {ceiling}");
        assert!(f < n, "{name}: {f:.4} not below fixed segments' {n:.4}");
        assert!(
            f < pytorch_best,
            "{name}: {f:.4} not below PyTorch's best {pytorch_best}"
        );
        // Longer mappings strand more here: the checkpoints and gradients hold whole
        // mappings made for larger activations.
        let long = Config::parse("preset:labs,max_mapping_mb:64").unwrap();
        let long = labs_core::device::replay_on_sim(&trace, long, GPU).unwrap();
        assert!(
            long.fragmentation() > f + 0.05,
            "{name}: 64 MiB {:.4}",
            long.fragmentation()
        );
    }
}

#[test]
fn the_generated_loop_recomputes_in_backward() {
    // Each layer's activations are allocated twice per step (forward, recompute), so
    // the trace holds twice the allocations of an uncheckpointed forward.
    let model = gpt2_small();
    let trace = checkpointed_training(&model, 1, |_| 512);
    let of_size = |size: u64| {
        (trace.events.iter())
            .filter(|e| e.action == Action::Alloc && e.size == size)
            .count()
    };
    let scores = Model::f32(model.batch * model.heads * 512 * 512);
    // Scores and softmax, forward and recompute, plus their gradients in backward.
    assert_eq!(of_size(scores), model.layers * (2 + 2 + 2));
    let allocs = trace
        .events
        .iter()
        .filter(|e| e.action == Action::Alloc)
        .count();
    let frees = trace.events.len() - allocs;
    assert_eq!(allocs, frees, "everything allocated is freed");
}

/// The two generated loops of `checkpointed_training_stays_close_to_its_requests`, as
/// trace files in `data/synthetic`, so that they replay like the recorded traces
/// (`lab-02 replay`, and PyTorch's allocator through `ci/pytorch-replay.py` on a GPU).
/// The files must be what the generator makes today; `LABS_WRITE_DATA=1` rewrites them.
#[test]
fn the_generated_loops_are_in_the_repository_as_traces() {
    use std::io::{Read, Write};
    for (name, trace) in generated_loops() {
        let mut csv = String::from("action,addr,size,stream\n");
        for e in &trace.events {
            csv.push_str(&format!(
                "{},{},{},{}\n",
                e.action, e.addr, e.size, e.stream
            ));
        }
        let path = labs_core::testing::data_dir()
            .join("synthetic")
            .join(format!("{name}.trace.csv.gz"));
        if std::env::var_os("LABS_WRITE_DATA").is_some() {
            let file = std::fs::File::create(&path).unwrap();
            let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
            gz.write_all(csv.as_bytes()).unwrap();
            gz.finish().unwrap();
        }
        let mut stored = String::new();
        let file = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (LABS_WRITE_DATA=1 writes it)", path.display()));
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut stored)
            .unwrap();
        assert!(
            stored == csv,
            "{} is not what the generator makes (LABS_WRITE_DATA=1 rewrites it)",
            path.display()
        );
        // And it reads back as the same trace.
        let read = labs_core::alloc::replay::read_trace(&path).unwrap();
        assert_eq!(read.peak_requested(), trace.peak_requested());
        assert_eq!(read.events.len(), trace.events.len());
    }
}
