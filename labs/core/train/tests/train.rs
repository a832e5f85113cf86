//! The training driver's promises: accumulation, checkpointing and offload change the
//! memory, not the gradients; fused attention and bf16 change the loss only within
//! rounding; the dry-run device predicts the simulated GPU's peaks exactly. On the
//! simulated GPU by default, on the GPU with `LABS_DEVICE=cuda`.

use labs_core::testing::{assert_close, serial, test_device};
use labs_core::{DType, Device};
use labs_train::model::Batch;
use labs_train::{
    run, AmpMode, AttentionMode, CheckpointMode, ModelKind, OptimizerKind, TrainConfig,
    TrainReport, Trainer,
};

/// A small Transformer whose activations outweigh its parameters, trained with SGD
/// (no optimizer state), so that the peak falls where the activations live.
fn small() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 2,
        ffn: 64,
        batch: 4,
        seq: 64,
        steps: 1,
        warmup: 0,
        optimizer: OptimizerKind::Sgd,
        ..TrainConfig::transformer()
    }
}

fn small_gpt2() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 2,
        ffn: 128,
        vocab: 64,
        batch: 2,
        seq: 32,
        steps: 1,
        warmup: 0,
        optimizer: OptimizerKind::Sgd,
        ..TrainConfig::gpt2()
    }
}

/// Every parameter's gradient, flattened, in parameter order.
fn grads(t: &Trainer) -> Vec<f32> {
    let mut out = Vec::new();
    for p in t.model.module().parameters() {
        let g = p.grad().expect("every parameter has a gradient");
        out.extend(g.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
    }
    out
}

/// The gradients of one forward and backward of micro-batch 0 under `c`.
fn one_backward(c: &TrainConfig, device: &Device) -> Vec<f32> {
    let mut t = Trainer::new(c, device).unwrap();
    let batch = Batch::random(c, 0, 0, device).unwrap();
    t.micro_batch(&batch, 1).unwrap();
    grads(&t)
}

fn assert_bits_equal(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: gradient lengths");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!("{what}: gradient element {i}: {} vs {}", a[i], b[i]);
    }
}

fn report(c: &TrainConfig, device: &Device) -> TrainReport {
    let r = run(c, device).unwrap();
    assert!(r.oom.is_none(), "{:?}", r.oom);
    r
}

#[test]
fn accumulating_micro_batches_gives_the_gradients_of_one_big_batch() {
    let _s = serial();
    let device = test_device();
    for base in [small(), small_gpt2()] {
        let (k, b) = (3, 2);
        let accumulated = TrainConfig {
            dropout: 0.0,
            batch: b,
            accum: k,
            ..base.clone()
        };
        let mut t = Trainer::new(&accumulated, &device).unwrap();
        let batches: Vec<Batch> = (0..k)
            .map(|m| Batch::random(&accumulated, 0, m, &device).unwrap())
            .collect();
        let mut loss = 0.0;
        for batch in &batches {
            loss += t.micro_batch(batch, k).unwrap().unwrap();
        }
        let whole = TrainConfig {
            batch: k * b,
            accum: 1,
            ..accumulated.clone()
        };
        let mut big = Trainer::new(&whole, &device).unwrap();
        let big_loss = big
            .micro_batch(&Batch::cat(&batches).unwrap(), 1)
            .unwrap()
            .unwrap();
        assert!(
            (loss - big_loss).abs() <= 1e-5 * big_loss.abs(),
            "{:?}: loss {loss} vs {big_loss}",
            base.model
        );
        assert_close(
            &format!("{:?} accumulation", base.model),
            &grads(&t),
            &grads(&big),
            1e-4,
            1e-6,
        );
    }
}

#[test]
fn checkpointing_keeps_the_gradients_and_lowers_the_peak() {
    let _s = serial();
    let device = test_device();
    // Dropout on: the recomputation must replay the generator to draw the same masks.
    let plain = TrainConfig {
        dropout: 0.1,
        ..small()
    };
    let want = one_backward(&plain, &device);
    let plain_peak = report(&plain, &device).peak_allocated;
    for mode in [CheckpointMode::Layers, CheckpointMode::Selective] {
        let c = TrainConfig {
            checkpoint: mode,
            ..plain.clone()
        };
        assert_bits_equal(&one_backward(&c, &device), &want, &format!("{mode:?}"));
        let peak = report(&c, &device).peak_allocated;
        assert!(
            peak < plain_peak,
            "{mode:?}: peak {peak} not below the plain run's {plain_peak}"
        );
    }
}

#[test]
fn offload_keeps_the_gradients_and_lowers_the_peak() {
    let _s = serial();
    let device = test_device();
    let plain = small();
    // Copies out held one at a time: 32 MiB in flight (the lab's default) is more
    // than this model saves, so its forward would free nothing before backward.
    let c = TrainConfig {
        offload: true,
        offload_min_bytes: 0,
        offload_in_flight: 0,
        ..plain.clone()
    };
    assert_bits_equal(
        &one_backward(&c, &device),
        &one_backward(&plain, &device),
        "offload",
    );
    let (r, base) = (report(&c, &device), report(&plain, &device));
    assert!(
        r.peak_allocated < base.peak_allocated,
        "offload: peak {} not below {}",
        r.peak_allocated,
        base.peak_allocated
    );
    let o = r.offload.expect("offload statistics");
    assert!(o.offloaded > 0 && o.offloaded_bytes > 0, "{o:?}");
    assert_eq!(o.offloaded, o.prefetched + o.fetched_on_demand, "{o:?}");
    assert!(base.offload.is_none());
    // Half the bytes: the same gradients, a peak between the two, every tensor sent
    // on its way back before backward needed it.
    let half = TrainConfig {
        offload_share: 0.5,
        ..c.clone()
    };
    assert_bits_equal(
        &one_backward(&half, &device),
        &one_backward(&plain, &device),
        "offload of half",
    );
    let h = report(&half, &device);
    assert!(
        r.peak_allocated < h.peak_allocated && h.peak_allocated < base.peak_allocated,
        "offload of half: peak {} not between {} and {}",
        h.peak_allocated,
        r.peak_allocated,
        base.peak_allocated
    );
    let ho = h.offload.expect("offload statistics");
    assert_eq!(
        ho.offloaded_bytes + ho.kept_for_share_bytes,
        o.offloaded_bytes
    );
    assert!(
        2 * ho.offloaded_bytes <= o.offloaded_bytes,
        "{ho:?} of {o:?}"
    );
    assert_eq!(
        (ho.prefetched, ho.fetched_on_demand),
        (ho.offloaded, 0),
        "{ho:?}"
    );
}

#[test]
fn fused_attention_gives_the_naive_loss_with_a_lower_peak() {
    let _s = serial();
    let device = test_device();
    let naive = TrainConfig {
        dropout: 0.0,
        attention: AttentionMode::Naive,
        ..small()
    };
    let fused = TrainConfig {
        attention: AttentionMode::Fused,
        ..naive.clone()
    };
    let (n, f) = (report(&naive, &device), report(&fused, &device));
    // Encoder self-attention, decoder self- and cross-attention, per layer.
    let calls = 3 * naive.layers as u64;
    assert_eq!(
        (n.attention_fused_calls, n.attention_math_calls),
        (0, calls)
    );
    assert_eq!(
        (f.attention_fused_calls, f.attention_math_calls),
        (calls, 0)
    );
    let (ln, lf) = (n.losses.unwrap()[0], f.losses.unwrap()[0]);
    assert!((ln - lf).abs() <= 1e-5 * ln.abs(), "loss {lf} vs {ln}");
    assert!(
        f.peak_allocated < n.peak_allocated,
        "fused peak {} not below naive {}",
        f.peak_allocated,
        n.peak_allocated
    );
    // Dropout in effect: the fused kernel applies it itself, so it still serves every
    // call (as PyTorch's flash and memory-efficient kernels do).
    let dropped = TrainConfig {
        dropout: 0.1,
        ..fused
    };
    let d = report(&dropped, &device);
    assert_eq!(
        (d.attention_fused_calls, d.attention_math_calls),
        (calls, 0)
    );
}

#[test]
fn bf16_autocast_trains_within_a_tolerance_of_float32() {
    let _s = serial();
    let device = test_device();
    let f32_run = TrainConfig {
        dropout: 0.0,
        steps: 2,
        ..small_gpt2()
    };
    let bf16 = TrainConfig {
        amp: AmpMode::Bf16,
        timeline: true,
        ..f32_run.clone()
    };
    let (a, b) = (report(&f32_run, &device), report(&bf16, &device));
    // bfloat16 keeps 8 bits of mantissa: products relative error about 2^-8 each; the
    // loss (about ln 64 here) is within 1% of float32's.
    for (x, y) in a.losses.unwrap().iter().zip(b.losses.unwrap()) {
        assert!((x - y).abs() <= 0.01 * x.abs(), "bf16 loss {y} vs f32 {x}");
    }
    // The cast weights live in the autocast cache during the step (whether they are
    // still there at the peak depends on where the peak falls).
    let cache = labs_core::alloc::Category::AutocastCache;
    assert!(b.timeline.iter().any(|s| s.of(cache) > 0));
    assert!(b.skipped_steps.is_none());
    let f16 = TrainConfig {
        amp: AmpMode::F16,
        ..f32_run
    };
    let r = report(&f16, &device);
    assert_eq!(r.skipped_steps, Some(0));
}

#[test]
fn the_dry_run_predicts_the_simulated_peaks_exactly() {
    let capacity = 1 << 30;
    for c in [
        small(),
        TrainConfig {
            checkpoint: CheckpointMode::Layers,
            accum: 2,
            optimizer: OptimizerKind::Adam,
            steps: 2,
            ..small()
        },
        TrainConfig {
            amp: AmpMode::Bf16,
            checkpoint: CheckpointMode::Selective,
            ..small_gpt2()
        },
        TrainConfig {
            amp: AmpMode::F16,
            offload: true,
            offload_min_bytes: 0,
            steps: 2,
            ..small()
        },
        TrainConfig {
            offload: true,
            offload_share: 0.3,
            offload_min_bytes: 0,
            steps: 2,
            ..small_gpt2()
        },
    ] {
        let sim = run(&c, &Device::new_sim(capacity)).unwrap();
        let dry = run(&c, &Device::new_dry(capacity)).unwrap();
        assert_eq!(sim.peak_allocated, dry.peak_allocated, "{c:?}");
        // Offload included: its hooks hold the tensors being copied and free them in
        // stream order, whatever the copies' speed (instant on the dry run).
        assert_eq!(sim.peak_reserved, dry.peak_reserved, "{c:?}");
        assert_eq!(sim.by_category, dry.by_category, "{c:?}");
        assert_eq!(sim.params, dry.params);
        // The same hooks' work; only the simulated GPU's copies take time.
        let counts = |r: &TrainReport| {
            r.offload.map(|o| {
                let times = [o.copy_out_ms, o.copy_back_ms, o.copy_ms];
                (
                    o.offloaded,
                    o.offloaded_bytes,
                    o.kept_on_device,
                    o.prefetched,
                    times,
                )
            })
        };
        let (s, d) = (counts(&sim), counts(&dry));
        assert_eq!(
            s.map(|s| (s.0, s.1, s.2, s.3)),
            d.map(|d| (d.0, d.1, d.2, d.3)),
            "{c:?}"
        );
        if let (Some(s), Some(d)) = (s, d) {
            assert!(s.4.iter().all(|t| t.is_some_and(|t| t > 0.0)), "{:?}", s.4);
            assert_eq!(d.4, [None; 3]);
        }
        assert!(dry.losses.is_none() && dry.step_ms.is_none());
        assert!(sim.losses.is_some());
    }
}

/// The experiments measure one configuration after another on one device, with the
/// cache emptied between them, and predict each with a dry run on a fresh device: a run
/// after a larger one must reserve what it reserves alone. (Expandable segments grow
/// freely up to the most ever reserved; `empty_cache` lowers that mark.)
#[test]
fn a_run_after_a_larger_one_reserves_as_on_a_fresh_device() {
    let _serial = serial();
    let device = test_device();
    let flags = "--model gpt2 --optimizer adamw --d-model 64 --nhead 2 --layers 4 \
                 --vocab 8192 --batch 8 --seq 256 --steps 2";
    let larger = labs_train::parse_flags(flags).unwrap();
    let smaller =
        labs_train::parse_flags(&format!("{flags} --amp bf16 --checkpoint layers")).unwrap();
    let allocator = device.allocator().unwrap();
    allocator.empty_cache().unwrap();
    let first = report(&larger, &device);
    allocator.empty_cache().unwrap();
    let second = report(&smaller, &device);
    allocator.empty_cache().unwrap();
    let capacity = device.mem_info().unwrap().total;
    let alone = report(&smaller, &device.dry_twin(capacity).unwrap());
    assert!(first.peak_reserved > alone.peak_reserved);
    assert_eq!(second.peak_allocated, alone.peak_allocated);
    assert_eq!(second.peak_reserved, alone.peak_reserved);
}

#[test]
fn the_peak_split_sums_to_the_peak_and_counts_the_optimizer_state() {
    let _s = serial();
    let device = test_device();
    let c = TrainConfig {
        optimizer: OptimizerKind::Adam,
        steps: 2,
        ..small()
    };
    let r = report(&c, &device);
    assert_eq!(r.by_category.values().sum::<u64>(), r.peak_allocated);
    // Adam's two moments exist by the second step, float32 like the parameters.
    assert_eq!(
        r.by_category["optimizer_state"],
        2 * r.by_category["parameter"]
    );
    assert_eq!(r.model, ModelKind::Transformer);
    assert_eq!(r.losses.as_ref().unwrap().len(), 2);
}

#[test]
fn running_out_of_memory_is_reported_with_the_peaks() {
    let capacity = 6 << 20;
    let device = Device::new_sim(capacity);
    // The parameters fit; a forward over 16 x 128 tokens does not.
    let c = TrainConfig {
        batch: 16,
        seq: 128,
        ..small()
    };
    let r = run(&c, &device).unwrap();
    let oom = r.oom.expect("a run that does not fit");
    assert!(oom.contains("out of memory"), "{oom}");
    assert!(r.num_ooms >= 1);
    assert!(r.params > 0);
    assert!(r.peak_allocated > 0 && r.peak_reserved <= capacity);
    assert_eq!(r.losses.as_deref(), Some(&[][..]));
}

#[test]
fn a_lone_dry_rank_reserves_what_rank_0_of_a_whole_group_does() {
    use labs_train::data_parallel::{run_in_process, run_lone_rank};
    use labs_train::DataParallel;
    let bar = indicatif::ProgressBar::hidden();
    for (how, world) in [
        (DataParallel::Ddp, 2),
        (DataParallel::Zero1, 2),
        (DataParallel::Zero1, 3),
        (DataParallel::Zero2, 2),
        (DataParallel::Zero2, 3),
        (DataParallel::Zero3, 2),
        (DataParallel::Zero3, 3),
    ] {
        for c in [
            TrainConfig {
                steps: 2,
                optimizer: OptimizerKind::Adam,
                ..small_gpt2()
            },
            TrainConfig {
                steps: 2,
                optimizer: OptimizerKind::Adam,
                amp: AmpMode::Bf16,
                ..small()
            },
        ] {
            let group: Vec<Device> = (0..world).map(|_| Device::new_dry(1 << 30)).collect();
            let whole = run_in_process(&c, &group, how, &bar).unwrap();
            let lone = run_lone_rank(&c, &Device::new_dry(1 << 30), world, how).unwrap();
            let what = format!("{how:?} on {world} ranks, {:?}", c.model);
            assert_eq!(lone.peak_allocated, whole.peak_allocated, "{what}");
            assert_eq!(lone.peak_reserved, whole.peak_reserved, "{what}");
            assert_eq!(lone.by_category, whole.by_category, "{what}");
            assert_eq!(lone.world_size, world, "{what}");
            assert!(lone.ranks.is_none(), "{what}: the other ranks were not run");
        }
    }
    // A lone rank exists only where no data moves.
    let sim = Device::new_sim(1 << 30);
    let err = run_lone_rank(&small(), &sim, 2, DataParallel::Ddp).unwrap_err();
    assert!(
        format!("{err:#}").contains("not a dry-run device"),
        "{err:#}"
    );
}

/// A rank's parameters after training, whole, and its bytes by category then.
type Ended = (Vec<f32>, Vec<(&'static str, u64)>);

/// Every rank of `how` on `world` simulated GPUs trains `steps` steps of `c`: what each
/// ends with.
fn train_ranks(
    c: &TrainConfig,
    world: usize,
    how: labs_train::DataParallel,
    steps: usize,
) -> Vec<Ended> {
    use std::sync::Arc;
    let devices: Vec<Device> = (0..world).map(|_| Device::new_sim(1 << 30)).collect();
    let comms = labs_core::dist::group(&devices).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let device = comm.device().clone();
                    let mut t = Trainer::data_parallel(c, &device, Arc::new(comm), how).unwrap();
                    for step in 0..steps {
                        t.step(step).unwrap();
                    }
                    let at_rest = device
                        .allocator()
                        .unwrap()
                        .memory_by_category()
                        .iter()
                        .map(|(c, s)| (c.name(), s.current))
                        .collect();
                    let mut values = Vec::new();
                    for p in t.full_parameters().unwrap() {
                        values.extend(p.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
                    }
                    (values, at_rest)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn bytes(of: &[(&'static str, u64)], name: &str) -> u64 {
    of.iter().find(|(n, _)| *n == name).unwrap().1
}

#[test]
fn zero3_trains_as_ddp_with_a_share_of_every_parameter() {
    use labs_train::DataParallel;
    let _s = serial();
    // The Transformer with SGD: its attention's key biases have gradients of rounding
    // noise only (softmax ignores a shift of every score), which Adam would scale up to
    // a step of their own in each run.
    for (base, world, accum, checkpoint, optimizer) in [
        (
            small_gpt2(),
            2,
            1,
            CheckpointMode::None,
            OptimizerKind::Adam,
        ),
        (
            small_gpt2(),
            3,
            2,
            CheckpointMode::Layers,
            OptimizerKind::Adam,
        ),
        (small(), 2, 2, CheckpointMode::None, OptimizerKind::Sgd),
    ] {
        let c = TrainConfig {
            optimizer,
            dropout: 0.0,
            accum,
            checkpoint,
            ..base
        };
        let what = format!(
            "{:?} on {world} ranks, accum {accum}, {checkpoint:?}",
            c.model
        );
        let ddp = train_ranks(&c, world, DataParallel::Ddp, 2);
        let zero = train_ranks(&c, world, DataParallel::Zero3, 2);
        for rank in 0..world {
            // The same averaged gradients (summed over the micro-batches in the same
            // order) and the same element-wise update.
            assert_close(&what, &zero[rank].0, &ddp[rank].0, 1e-5, 1e-6);
            assert_eq!(zero[rank].0, zero[0].0, "{what}: the ranks agree");
            // Between steps a rank keeps its chunk of every unit's parameters (each unit
            // padded to a multiple of the world), no more, and no gradient: zero_grad
            // dropped its shard of them.
            let elements = ddp[rank].0.len() as u64;
            let params = bytes(&zero[rank].1, "parameter");
            let shard = 4 * elements.div_ceil(world as u64);
            assert!(
                params >= shard && params <= shard + 4096,
                "{what}: parameters {params} against a shard of {shard}"
            );
            assert_eq!(bytes(&zero[rank].1, "gradient"), 0, "{what}");
            assert!(bytes(&ddp[rank].1, "parameter") >= 4 * elements, "{what}");
        }
    }
}

#[test]
fn a_padded_vocabulary_rounds_the_table_up_and_never_draws_its_extra_rows() {
    let _s = serial();
    let device = test_device();
    let c = TrainConfig {
        vocab: 50,
        vocab_multiple: 64,
        steps: 2,
        dropout: 0.0,
        ..small_gpt2()
    };
    assert_eq!(c.padded_vocab(), 64);
    let unpadded = TrainConfig {
        vocab_multiple: 1,
        ..c.clone()
    };
    let (padded, plain) = (report(&c, &device), report(&unpadded, &device));
    // The table (and the tied head) has 64 rows of d_model: 14 more than 50.
    assert_eq!(padded.params, plain.params + 14 * c.d_model);
    let losses = padded.losses.unwrap();
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // The data draws tokens and targets from the real vocabulary alone.
    for step in 0..3 {
        let Batch::Tokens { idx, targets } = Batch::random(&c, step, 0, &device).unwrap() else {
            panic!("GPT-2 trains on tokens");
        };
        for t in [idx, targets] {
            let ids = t.to_vec::<i64>().unwrap();
            assert!(ids.iter().all(|&i| (0..50).contains(&i)), "{ids:?}");
        }
    }
    // A multiple the vocabulary already is changes nothing.
    let even = TrainConfig {
        vocab: 64,
        ..c.clone()
    };
    assert_eq!(even.padded_vocab(), 64);
    let refused = TrainConfig {
        vocab_multiple: 0,
        ..c
    };
    assert!(refused
        .validate()
        .unwrap_err()
        .to_string()
        .contains("--vocab-multiple"));
}

#[test]
fn zero3_on_one_rank_of_the_device_under_test_updates_each_parameter_as_plain_training() {
    // One rank of the device under test (the GPU with LABS_DEVICE=cuda): gathering,
    // freeing and gathering again, the gradients copied into a unit and reduce-scattered
    // into the shard, must leave every parameter as a step without ZeRO-3 does. SGD's
    // update is the gradient times the rate, so a parameter whose gradient went wrong
    // shows by name (Adam would turn rounding noise into steps of its own).
    use labs_train::DataParallel;
    use std::sync::Arc;
    let _s = serial();
    let device = test_device();
    // lab-10's test model too: twelve blocks of width 64 over a vocabulary of 256.
    let wider = TrainConfig {
        d_model: 64,
        ffn: 256,
        layers: 12,
        vocab: 256,
        ..small_gpt2()
    };
    for (base, accum) in [(small_gpt2(), 1), (small_gpt2(), 2), (wider, 2)] {
        let c = TrainConfig {
            layers: base.layers.max(3),
            dropout: 0.0,
            accum,
            steps: 2,
            ..base
        };
        let mut plain = Trainer::new(&c, &device).unwrap();
        let comm = labs_core::dist::group(std::slice::from_ref(&device))
            .unwrap()
            .pop()
            .unwrap();
        let mut zero =
            Trainer::data_parallel(&c, &device, Arc::new(comm), DataParallel::Zero3).unwrap();
        for step in 0..c.steps {
            plain.step(step).unwrap();
            zero.step(step).unwrap();
        }
        let names: Vec<String> = plain
            .model
            .module()
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let (a, b) = (
            plain.full_parameters().unwrap(),
            zero.full_parameters().unwrap(),
        );
        let mut wrong = Vec::new();
        for ((name, a), b) in names.iter().zip(&a).zip(&b) {
            let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / x.abs().max(1e-3))
                .fold(0f32, f32::max);
            if worst > 1e-5 {
                wrong.push(format!("{name} (relative {worst:.2e})"));
            }
        }
        assert!(
            wrong.is_empty(),
            "{} layers, accum {accum}: ZeRO-3 on one rank of {device} differs from plain \
             training in {}",
            c.layers,
            wrong.join(", ")
        );
    }
}

#[test]
fn a_step_captured_as_a_graph_trains_as_the_eager_step_does() {
    let _serial = serial();
    let device = test_device();
    let naive = TrainConfig {
        attention: AttentionMode::Naive,
        ..small_gpt2()
    };
    // The math path's causal mask is made on the device under a capture (a copy of host
    // values cannot be captured).
    for (model, optimizer) in [
        (small_gpt2(), OptimizerKind::Adamw),
        (naive, OptimizerKind::Adam),
        (small(), OptimizerKind::Adam),
        (small(), OptimizerKind::Sgd),
    ] {
        let eager = TrainConfig {
            steps: 5,
            warmup: 1,
            optimizer,
            accum: 2,
            dropout: 0.0,
            ..model
        };
        let graphed = TrainConfig {
            graph: true,
            ..eager.clone()
        };
        let (a, b) = (
            run(&eager, &device).unwrap(),
            run(&graphed, &device).unwrap(),
        );
        assert!(a.oom.is_none() && b.oom.is_none());
        let (la, lb) = (a.losses.unwrap(), b.losses.unwrap());
        assert_eq!(lb.len(), 5);
        // The steps change the loss by far more than the tolerance: a replay that
        // repeated the captured data, or an optimizer stuck at its captured count,
        // would show. (Capturable Adam's bias corrections are float32.)
        assert!((la[0] - la[4]).abs() > 1e-3 * la[0].abs(), "{la:?}");
        assert_close(
            &format!("{:?} {optimizer:?} losses", eager.model),
            &lb,
            &la,
            1e-4,
            1e-6,
        );
        assert!(b.config.graph && !a.config.graph);
    }
}

#[test]
fn what_a_graph_cannot_capture_is_refused_with_its_reason() {
    let _serial = serial();
    let base = TrainConfig {
        graph: true,
        dropout: 0.0,
        warmup: 1,
        ..small()
    };
    let cases: [(TrainConfig, &str); 4] = [
        (
            TrainConfig {
                dropout: 0.1,
                ..base.clone()
            },
            "same dropout mask",
        ),
        (
            TrainConfig {
                offload: true,
                ..base.clone()
            },
            "--offload",
        ),
        (
            TrainConfig {
                amp: AmpMode::F16,
                ..base.clone()
            },
            "--amp f16",
        ),
        (
            TrainConfig {
                warmup: 0,
                ..base.clone()
            },
            "--warmup 1",
        ),
    ];
    for (config, words) in cases {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(words), "{err}");
    }
    base.validate().unwrap();
}
