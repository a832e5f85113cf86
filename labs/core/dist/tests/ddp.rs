//! Data-parallel training (`dist::DistributedDataParallel`, `dist::ZeroRedundancyOptimizer`)
//! on two and three simulated GPUs, one thread per rank, whatever the device under
//! test: the averaged gradients and the parameters after a step equal one device's
//! training on the concatenated batch; the buckets and the order of their all-reduces;
//! `no_sync`; ZeRO-1 and ZeRO-2 against DDP with Adam, with micro-batches, and the
//! optimizer state and gradients each keeps per rank. Under
//! `LABS_DEVICE=cuda`, DDP with a world of one GPU through NCCL as well.

use std::sync::Arc;

use labs_alloc::alloc::Category;
use labs_base::testing::assert_close;
use labs_device::device::set_sim_device_count;
use labs_device::testing::test_device;
use labs_device::{Device, DeviceId};
use labs_dist::dist::{
    self, Communicator, DdpEvent, DdpOptions, DistributedDataParallel, ShardedGradientOptimizer,
    ZeroRedundancyOptimizer,
};
use labs_nn::nn::{Activation, Mlp, Module, Rng, TransformerConfig, TransformerEncoderLayer};
use labs_nn::optim::{Adam, Optimizer, Sgd};
use labs_tensor::Tensor;

/// Simulated GPUs `first..first + n`: each test its own, so that their memory is
/// measured apart while tests run in parallel.
fn sims(first: usize, n: usize) -> Vec<Device> {
    set_sim_device_count(96).unwrap();
    (first..first + n)
        .map(|i| Device::get(DeviceId::Sim(i)).unwrap())
        .collect()
}

/// Runs `f(rank, communicator)` on every rank of a group over `devices`, each on its
/// own thread; their results in rank order.
fn on_ranks<T: Send>(devices: &[Device], f: impl Fn(Arc<Communicator>) -> T + Sync) -> Vec<T> {
    let comms = dist::group(devices).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(Arc::new(c)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `rows × cols` values drawn from `seed`.
fn data(seed: u64, rows: usize, cols: usize) -> Vec<f32> {
    Rng::seeded(seed).normal(rows * cols)
}

/// Each tensor's elements.
type Values = Vec<Vec<f32>>;

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn grads(params: &[Tensor]) -> Vec<Vec<f32>> {
    params.iter().map(|p| values(&p.grad().unwrap())).collect()
}

fn params_of(params: &[Tensor]) -> Vec<Vec<f32>> {
    params.iter().map(values).collect()
}

fn assert_each_close(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: tensor count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what} #{i}"), g, w, tol, tol);
    }
}

/// A model, built from `seed` on `device`, and a loss over a batch of `rows` rows of
/// `input` (its rows × features) against `target`.
trait Case: Sync {
    fn build(&self, seed: u64, device: &Device) -> Box<dyn Module>;
    fn features(&self) -> (usize, usize);
    /// The shape of a batch of `rows` inputs.
    fn input_shape(&self, rows: usize) -> Vec<usize>;
    fn target_shape(&self, rows: usize) -> Vec<usize>;
}

struct MlpCase;

impl Case for MlpCase {
    fn build(&self, seed: u64, device: &Device) -> Box<dyn Module> {
        Box::new(Mlp::new(&[6, 16, 12, 3], &mut Rng::seeded(seed), device).unwrap())
    }
    fn features(&self) -> (usize, usize) {
        (6, 3)
    }
    fn input_shape(&self, rows: usize) -> Vec<usize> {
        vec![rows, 6]
    }
    fn target_shape(&self, rows: usize) -> Vec<usize> {
        vec![rows, 3]
    }
}

/// One encoder layer without dropout, on sequences of 3 tokens of width 8.
struct TransformerCase;

impl Case for TransformerCase {
    fn build(&self, seed: u64, device: &Device) -> Box<dyn Module> {
        let mut c = TransformerConfig::new(8, 2);
        c.dim_feedforward = 16;
        c.dropout = 0.0;
        c.activation = Activation::Gelu;
        Box::new(TransformerEncoderLayer::new(c, &mut Rng::seeded(seed), device).unwrap())
    }
    fn features(&self) -> (usize, usize) {
        (3 * 8, 3 * 8)
    }
    fn input_shape(&self, rows: usize) -> Vec<usize> {
        vec![rows, 3, 8]
    }
    fn target_shape(&self, rows: usize) -> Vec<usize> {
        vec![rows, 3, 8]
    }
}

const ROWS: usize = 4;

/// Rank `rank`'s batch of micro-step `step`: its inputs and targets.
fn batch(case: &dyn Case, rank: usize, step: usize) -> (Vec<f32>, Vec<f32>) {
    let (fin, fout) = case.features();
    let seed = 1000 + 10 * step as u64 + rank as u64;
    (data(seed, ROWS, fin), data(seed + 500, ROWS, fout))
}

fn loss(case: &dyn Case, model: &dyn Module, x: &[f32], y: &[f32], d: &Device) -> Tensor {
    let rows = x.len() / case.features().0;
    let x = Tensor::from_slice(x, &case.input_shape(rows), d).unwrap();
    let y = Tensor::from_slice(y, &case.target_shape(rows), d).unwrap();
    model.forward(&x).unwrap().mse_loss(&y).unwrap()
}

/// One device training on the concatenation of the ranks' batches, from rank 0's
/// initial parameters: its gradients, then its parameters after one SGD step.
fn reference(case: &dyn Case, world: usize, device: &Device) -> (Values, Values) {
    let model = case.build(0, device);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for r in 0..world {
        let (bx, by) = batch(case, r, 0);
        x.extend(bx);
        y.extend(by);
    }
    loss(case, model.as_ref(), &x, &y, device)
        .backward()
        .unwrap();
    let params = model.parameters();
    let g = grads(&params);
    Sgd::new(params.clone(), 0.1).step().unwrap();
    (g, params_of(&params))
}

/// DDP on `devices` (every rank's model built from its own seed: the constructor's
/// broadcast makes them rank 0's), one step: each rank's gradients and parameters.
fn ddp_step(case: &dyn Case, devices: &[Device]) -> Vec<(Values, Values)> {
    on_ranks(devices, |comm| {
        let rank = comm.rank();
        let device = comm.device().clone();
        let model = case.build(rank as u64, &device);
        let ddp = DistributedDataParallel::new(model.named_parameters(), comm).unwrap();
        let (x, y) = batch(case, rank, 0);
        loss(case, model.as_ref(), &x, &y, &device)
            .backward()
            .unwrap();
        ddp.finish().unwrap();
        let params = model.parameters();
        let g = grads(&params);
        Sgd::new(params.clone(), 0.1).step().unwrap();
        (g, params_of(&params))
    })
}

fn check_against_single_device(case: &dyn Case, devices: &[Device], reference_on: &Device) {
    let (want_grads, want_params) = reference(case, devices.len(), reference_on);
    for (rank, (g, p)) in ddp_step(case, devices).iter().enumerate() {
        assert_each_close(&format!("rank {rank} gradients"), g, &want_grads, 1e-5);
        assert_each_close(&format!("rank {rank} parameters"), p, &want_params, 1e-5);
    }
}

#[test]
fn mlp_equals_single_device_training_on_the_whole_batch() {
    let d = sims(0, 6);
    check_against_single_device(&MlpCase, &d[..2], &d[5]);
    check_against_single_device(&MlpCase, &d[2..5], &d[5]);
}

#[test]
fn transformer_equals_single_device_training_on_the_whole_batch() {
    let d = sims(6, 6);
    check_against_single_device(&TransformerCase, &d[..2], &d[5]);
    check_against_single_device(&TransformerCase, &d[2..5], &d[5]);
}

#[test]
fn world_of_one_on_the_device_under_test() {
    // On the GPU: NCCL with one rank; on the simulator, the in-process exchange.
    let d = test_device();
    let (want_grads, want_params) = reference(&MlpCase, 1, &d);
    let got = ddp_step(&MlpCase, std::slice::from_ref(&d));
    assert_each_close("gradients", &got[0].0, &want_grads, 1e-5);
    assert_each_close("parameters", &got[0].1, &want_params, 1e-5);
}

#[test]
fn buckets_follow_reverse_registration_order_and_launch_during_backward() {
    let d = sims(12, 2);
    let tiny = DdpOptions {
        bucket_cap_mb: 1e-9,
        first_bucket_bytes_cap: 1,
    };
    let results = on_ranks(&d, |comm| {
        let device = comm.device().clone();
        let model = MlpCase.build(0, &device);
        let n = model.parameters().len();
        let ddp =
            DistributedDataParallel::with_options(model.named_parameters(), comm.clone(), tiny)
                .unwrap();
        // Caps below every parameter: one bucket each, the last parameter's first.
        let expected: Vec<Vec<usize>> = (0..n).rev().map(|i| vec![i]).collect();
        assert_eq!(ddp.bucket_assignment(), expected);
        let (x, y) = batch(&MlpCase, comm.rank(), 0);
        loss(&MlpCase, model.as_ref(), &x, &y, &device)
            .backward()
            .unwrap();
        let events = ddp.take_events();
        ddp.finish().unwrap();
        (n, events)
    });
    for (n, events) in results {
        assert_eq!(events.len(), 2 * n, "{events:?}");
        let launches: Vec<usize> = events
            .iter()
            .filter_map(|e| match e {
                DdpEvent::BucketLaunched { bucket } => Some(*bucket),
                _ => None,
            })
            .collect();
        assert_eq!(
            launches,
            (0..n).collect::<Vec<_>>(),
            "launched in bucket order"
        );
        // Each launch follows the hook of its one parameter, before the next hook:
        // the first all-reduce is in flight while backward still has the other layers.
        for (k, pair) in events.chunks(2).enumerate() {
            assert_eq!(
                pair[0],
                DdpEvent::GradReady { param: n - 1 - k },
                "{events:?}"
            );
            assert_eq!(
                pair[1],
                DdpEvent::BucketLaunched { bucket: k },
                "{events:?}"
            );
        }
    }

    // Default caps: this small model fits in the first bucket, launched after the last
    // gradient.
    let results = on_ranks(&d, |comm| {
        let device = comm.device().clone();
        let model = MlpCase.build(0, &device);
        let n = model.parameters().len();
        let ddp = DistributedDataParallel::new(model.named_parameters(), comm.clone()).unwrap();
        assert_eq!(
            ddp.bucket_assignment(),
            vec![(0..n).rev().collect::<Vec<_>>()]
        );
        let bytes: usize = model.parameters().iter().map(|p| p.nbytes()).sum();
        assert_eq!(ddp.bucket_bytes(), bytes);
        let (x, y) = batch(&MlpCase, comm.rank(), 0);
        loss(&MlpCase, model.as_ref(), &x, &y, &device)
            .backward()
            .unwrap();
        // `.grad` is a view of the bucket: the gradients' memory is the bucket's.
        let grads_bytes = device.allocator().unwrap().memory_by_category()
            [Category::Gradient.index()]
        .1
        .current;
        ddp.finish().unwrap();
        (n, ddp.take_events(), grads_bytes, bytes)
    });
    for (n, events, grads_bytes, bytes) in results {
        assert_eq!(events.last(), Some(&DdpEvent::BucketLaunched { bucket: 0 }));
        assert_eq!(events.len(), n + 1);
        assert!(
            grads_bytes < bytes as u64 + 512,
            "gradient memory {grads_bytes} beyond the bucket's {bytes}"
        );
    }
}

#[test]
fn no_sync_accumulates_locally_until_the_last_micro_batch() {
    let d = sims(14, 3);
    let world = 2;
    // Reference: the sum over the two micro-steps of the whole-batch gradients.
    let model = MlpCase.build(0, &d[2]);
    for step in 0..2 {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for r in 0..world {
            let (bx, by) = batch(&MlpCase, r, step);
            x.extend(bx);
            y.extend(by);
        }
        loss(&MlpCase, model.as_ref(), &x, &y, &d[2])
            .backward()
            .unwrap();
    }
    let want = grads(&model.parameters());
    let results = on_ranks(&d[..world], |comm| {
        let (rank, device) = (comm.rank(), comm.device().clone());
        let model = MlpCase.build(0, &device);
        let ddp = DistributedDataParallel::new(model.named_parameters(), comm).unwrap();
        {
            let _local = ddp.no_sync();
            let (x, y) = batch(&MlpCase, rank, 0);
            loss(&MlpCase, model.as_ref(), &x, &y, &device)
                .backward()
                .unwrap();
            ddp.finish().unwrap();
        }
        let local = grads(&model.parameters());
        let quiet = ddp.take_events();
        let (x, y) = batch(&MlpCase, rank, 1);
        loss(&MlpCase, model.as_ref(), &x, &y, &device)
            .backward()
            .unwrap();
        ddp.finish().unwrap();
        (local, quiet, grads(&model.parameters()))
    });
    // Inside no_sync nothing was reduced: the ranks' gradients differ.
    assert!(results[0].1.is_empty() && results[1].1.is_empty());
    assert_ne!(results[0].0, results[1].0);
    for (_, _, g) in &results {
        assert_each_close("accumulated gradients", g, &want, 1e-5);
    }
}

#[test]
fn a_parameter_without_gradient_is_named() {
    let d = sims(17, 2);
    let errors = on_ranks(&d, |comm| {
        let device = comm.device().clone();
        let used = Tensor::from_slice(&[1.0f32, 2.0], &[2], &device)
            .unwrap()
            .requires_grad_(true);
        let unused = Tensor::from_slice(&[3.0f32], &[1], &device)
            .unwrap()
            .requires_grad_(true);
        let named = vec![
            ("used.weight".to_string(), used.clone()),
            ("head.unused".to_string(), unused),
        ];
        let tiny = DdpOptions {
            bucket_cap_mb: 1e-9,
            first_bucket_bytes_cap: 1,
        };
        let ddp = DistributedDataParallel::with_options(named, comm, tiny).unwrap();
        used.mul(&used)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        ddp.finish().unwrap_err().to_string()
    });
    for e in errors {
        assert!(
            e.contains("head.unused") && !e.contains("used.weight"),
            "{e}"
        );
    }
}

#[test]
fn parameters_ddp_cannot_reduce_are_refused() {
    let d = sims(19, 1);
    let comm = Arc::new(dist::group(&d).unwrap().pop().unwrap());
    let plain = Tensor::zeros(&[2], labs_tensor::DType::F32, &d[0]).unwrap();
    let e = DistributedDataParallel::new(vec![("w".into(), plain)], comm.clone());
    assert!(e.is_err_and(|e| e.to_string().contains("w is not a leaf")));
    let ints = Tensor::zeros(&[2], labs_tensor::DType::I32, &d[0])
        .unwrap()
        .requires_grad_(true);
    assert!(DistributedDataParallel::new(vec![("i".into(), ints)], comm).is_err());
}

/// How the ranks of [`adam_steps`] share the work.
#[derive(Clone, Copy, PartialEq)]
enum Stage {
    Ddp,
    Zero1,
    Zero2,
}

/// What a rank of [`adam_steps`] ends with: its parameters, and the bytes of its
/// optimizer state and of its gradients after the last step (its `zero_grad`), and of
/// its gradients just before that step.
struct Ended {
    params: Values,
    state: u64,
    gradients: u64,
    gradients_before_step: u64,
}

/// Three steps of Adam on `devices`, from rank 0's parameters, each step `micro`
/// micro-batches: DDP with a replicated Adam, ZeRO-1 or ZeRO-2.
fn adam_steps(devices: &[Device], stage: Stage, micro: usize) -> Vec<Ended> {
    on_ranks(devices, |comm| {
        let (rank, device) = (comm.rank(), comm.device().clone());
        let model = Mlp::new(&[64, 96, 48], &mut Rng::seeded(rank as u64), &device).unwrap();
        let params = model.parameters();
        let mut ddp = None;
        let adam = |shard| -> Box<dyn Optimizer + Send> { Box::new(Adam::new(shard, 1e-2)) };
        let mut opt: Box<dyn Optimizer> = match stage {
            Stage::Ddp => {
                ddp = Some(DistributedDataParallel::new(model.named_parameters(), comm).unwrap());
                Box::new(Adam::new(params.clone(), 1e-2))
            }
            Stage::Zero1 => {
                Box::new(ZeroRedundancyOptimizer::new(params.clone(), comm, adam).unwrap())
            }
            Stage::Zero2 => {
                Box::new(ShardedGradientOptimizer::new(params.clone(), comm, adam).unwrap())
            }
        };
        let gradient_bytes = || {
            let by = device.allocator().unwrap().memory_by_category();
            by[Category::Gradient.index()].1.current
        };
        let mut gradients_before_step = 0;
        for step in 0..3 {
            for m in 0..micro {
                let seed = 77 + 10 * step + 100 * m as u64 + rank as u64;
                let x = Tensor::from_slice(&data(seed, 5, 64), &[5, 64], &device).unwrap();
                let y = Tensor::from_slice(&data(seed + 1, 5, 48), &[5, 48], &device).unwrap();
                model
                    .forward(&x)
                    .unwrap()
                    .mse_loss(&y)
                    .unwrap()
                    .backward()
                    .unwrap();
                if let Some(ddp) = &ddp {
                    ddp.finish().unwrap();
                }
            }
            gradients_before_step = gradient_bytes();
            opt.step().unwrap();
            opt.zero_grad(true).unwrap();
        }
        let by = device.allocator().unwrap().memory_by_category();
        Ended {
            params: params_of(&params),
            state: by[Category::OptimizerState.index()].1.current,
            gradients: by[Category::Gradient.index()].1.current,
            gradients_before_step,
        }
    })
}

#[test]
fn zero1_equals_ddp_with_adam_with_a_share_of_the_state() {
    for (world, first) in [(2, 21), (3, 25)] {
        let ddp = adam_steps(&sims(first, world), Stage::Ddp, 1);
        let zero = adam_steps(&sims(first + 30, world), Stage::Zero1, 1);
        let elements: usize = 64 * 96 + 96 + 96 * 48 + 48;
        for rank in 0..world {
            // The same averaged gradients (both collectives combine in float64 and
            // round once) and the same element-wise update: equal bit for bit.
            assert_eq!(
                zero[rank].params, ddp[rank].params,
                "world {world}, rank {rank}"
            );
            assert_eq!(zero[rank].params, zero[0].params, "replicas agree");
            // Adam's two float32 moments: of every element under DDP, of a shard of
            // ceil(elements / world) under ZeRO-1 (each tensor rounded to 512 bytes).
            let (ddp_state, zero_state) = (ddp[rank].state, zero[rank].state);
            assert!(ddp_state >= (2 * 4 * elements) as u64);
            let shard = elements.div_ceil(world);
            assert_eq!(zero_state, 2 * (4 * shard as u64).div_ceil(512) * 512);
            assert!(zero_state * world as u64 <= ddp_state + 2 * 512 * world as u64);
        }
    }
}

#[test]
fn zero2_equals_ddp_with_a_share_of_the_gradients_and_of_the_state() {
    let elements: usize = 64 * 96 + 96 + 96 * 48 + 48;
    for (world, micro, first) in [(2, 1, 60), (3, 1, 64), (2, 3, 70)] {
        let ddp = adam_steps(&sims(first, world), Stage::Ddp, micro);
        let zero = adam_steps(&sims(first + 10, world), Stage::Zero2, micro);
        for rank in 0..world {
            let what = format!("world {world}, {micro} micro-batches, rank {rank}");
            // The same averaged gradients, summed over the micro-batches in the same
            // order, and the same element-wise update.
            assert_each_close(&what, &zero[rank].params, &ddp[rank].params, 1e-6);
            assert_eq!(zero[rank].params, zero[0].params, "{what}: replicas agree");
            // DDP keeps a bucket per gradient between steps; ZeRO-2 holds the rank's
            // chunk of every bucket (each padded to a multiple of the world) from
            // backward to the step, no more, and nothing after zero_grad.
            let (ddp_grads, zero_grads) = (ddp[rank].gradients, zero[rank].gradients_before_step);
            assert!(ddp_grads >= (4 * elements) as u64, "{what}: {ddp_grads}");
            assert_eq!(zero[rank].gradients, 0, "{what}: after zero_grad");
            let shard = 4 * elements.div_ceil(world) as u64;
            assert!(zero_grads >= shard, "{what}: {zero_grads} < {shard}");
            assert!(
                zero_grads <= shard + 4 * 512,
                "{what}: {zero_grads} > {shard} + buckets' padding"
            );
            assert!(
                zero[rank].state * world as u64
                    <= ddp[rank].state + 2 * 512 * world as u64 + 64 * world as u64,
                "{what}"
            );
        }
    }
}

/// Two parameters of 3 and 1 elements, `a = [1, 2, 3]` and `b = [4]`: 4 elements,
/// shards of 2 over 2 ranks.
fn two_leaves(device: &Device) -> (Tensor, Tensor) {
    let leaf = |v: &[f32]| {
        Tensor::from_slice(v, &[v.len()], device)
            .unwrap()
            .requires_grad_(true)
    };
    (leaf(&[1.0, 2.0, 3.0]), leaf(&[4.0]))
}

#[test]
fn zero1_consumes_the_gradients_and_names_a_missing_one() {
    let d = sims(40, 2);
    let results = on_ranks(&d, |comm| {
        let (a, b) = two_leaves(comm.device());
        let mut zero = ZeroRedundancyOptimizer::new(vec![a.clone(), b.clone()], comm, |p| {
            Box::new(Sgd::new(p, 0.5))
        })
        .unwrap();
        // 4 elements over 2 ranks: shards of 2.
        let shard = zero.shard_range();
        // Only `a` in the loss: the step refuses, naming it.
        a.mul(&a).unwrap().sum_all().unwrap().backward().unwrap();
        let missing = zero.step().unwrap_err().to_string();
        // Both in the loss: d/da = 2a + b, d/db = sum(a); the same on both ranks.
        a.mul(&a)
            .unwrap()
            .add(&a.mul(&b).unwrap())
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        zero.step().unwrap();
        (shard, missing, values(&a), values(&b), a.grad().is_none())
    });
    for (rank, (shard, missing, a, b, consumed)) in results.into_iter().enumerate() {
        assert_eq!(shard, 2 * rank..2 * rank + 2);
        assert!(missing.contains("parameter #1 of shape [1]"), "{missing}");
        assert!(consumed, "the step consumes .grad");
        // SGD lr 0.5 on the averaged gradient. The refused step left a's gradient (2a)
        // in place and the second pass added 2a + b to it: 4a + b; b's is sum(a) = 6.
        let want_a: Vec<f32> = [1.0f32, 2.0, 3.0]
            .iter()
            .map(|&x| x - 0.5 * (4.0 * x + 4.0))
            .collect();
        assert_eq!(a, want_a);
        assert_eq!(b, vec![4.0 - 0.5 * 6.0]);
    }
}

/// GPT-2's head is tied to its token embedding: one parameter, two gradients per pass,
/// whose hook must run once, after both.
#[test]
fn gpt2_with_a_tied_head_equals_single_device_training() {
    use labs_nn::nn::{Gpt2, Gpt2Config};
    let d = sims(44, 3);
    let config = Gpt2Config {
        vocab: 11,
        n_positions: 8,
        d_model: 8,
        n_layer: 1,
        n_head: 2,
        dropout: 0.0,
    };
    let (rows, t) = (2, 5);
    // Rank r's tokens, and the next ones as targets.
    let tokens = |rank: usize| -> (Vec<i64>, Vec<i64>) {
        let ids: Vec<i64> = (0..rows * (t + 1))
            .map(|i| ((i * 7 + rank * 3) % 11) as i64)
            .collect();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let row = &ids[r * (t + 1)..(r + 1) * (t + 1)];
            x.extend_from_slice(&row[..t]);
            y.extend_from_slice(&row[1..]);
        }
        (x, y)
    };
    let loss = |m: &Gpt2, x: &[i64], y: &[i64], device: &Device| {
        let n = x.len() / t;
        let x = Tensor::from_slice(x, &[n, t], device).unwrap();
        let y = Tensor::from_slice(y, &[n, t], device).unwrap();
        m.loss(&x, &y).unwrap()
    };
    let reference = Gpt2::new(config, &mut Rng::seeded(0), &d[2]).unwrap();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for r in 0..2 {
        let (a, b) = tokens(r);
        x.extend(a);
        y.extend(b);
    }
    loss(&reference, &x, &y, &d[2]).backward().unwrap();
    let want = grads(&reference.parameters());
    let got = on_ranks(&d[..2], |comm| {
        let (rank, device) = (comm.rank(), comm.device().clone());
        let m = Gpt2::new(config, &mut Rng::seeded(rank as u64), &device).unwrap();
        let ddp = DistributedDataParallel::new(m.named_parameters(), comm).unwrap();
        let (x, y) = tokens(rank);
        loss(&m, &x, &y, &device).backward().unwrap();
        ddp.finish().unwrap();
        let events = ddp.take_events();
        (grads(&m.parameters()), events)
    });
    for (g, events) in got {
        assert_each_close("gpt2 gradients", &g, &want, 1e-5);
        let ready = events
            .iter()
            .filter(|e| matches!(e, DdpEvent::GradReady { .. }))
            .count();
        assert_eq!(ready, want.len(), "each parameter ready once: {events:?}");
    }
}

#[test]
fn zero2_keeps_no_full_gradient_and_names_a_missing_one() {
    let d = sims(80, 2);
    let results = on_ranks(&d, |comm| {
        let (a, b) = two_leaves(comm.device());
        let mut zero = ShardedGradientOptimizer::new(vec![a.clone(), b.clone()], comm, |p| {
            Box::new(Sgd::new(p, 0.5))
        })
        .unwrap();
        // Only `a` in the loss: its gradient went to its bucket at once, and the step
        // refuses, naming b.
        a.mul(&a).unwrap().sum_all().unwrap().backward().unwrap();
        let dropped = a.grad().is_none();
        let missing = zero.step().unwrap_err().to_string();
        (zero.shard_len(), dropped, missing)
    });
    for (shard, dropped, missing) in results {
        // One bucket of 4 elements over 2 ranks: chunks of 2.
        assert_eq!(shard, 2);
        assert!(dropped, "the full gradient is not kept");
        assert!(missing.contains("parameter #1 of shape [1]"), "{missing}");
    }
}
