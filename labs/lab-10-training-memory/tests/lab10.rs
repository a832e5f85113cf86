//! Lab 10's exercises, graded on the device under test (the simulated GPU here, the GPU
//! with `LABS_DEVICE=cuda`): `cargo test -p lab-10 --features exercises` grades the
//! starter code, the default build the reference solutions.

use lab_10::exercises::{
    accumulate, checkpointed, fused_attention_saving, largest_batch, optimizer_state_bytes, Region,
};
use labs_core::testing::{serial, test_device};
use labs_core::{DType, Device};
use labs_train::model::Batch;
use labs_train::{run, CheckpointMode, OptimizerKind, TrainConfig, Trainer};

fn small() -> TrainConfig {
    TrainConfig {
        d_model: 32,
        nhead: 2,
        layers: 1,
        ffn: 64,
        dropout: 0.0,
        batch: 2,
        seq: 16,
        steps: 2,
        warmup: 0,
        ..TrainConfig::transformer()
    }
}

fn grads(t: &Trainer) -> Vec<f32> {
    let mut out = Vec::new();
    for p in t.model.module().parameters() {
        let g = p.grad().expect("every parameter has a gradient");
        out.extend(g.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap());
    }
    out
}

#[test]
fn exercise_1_accumulated_gradients_are_the_big_batchs() {
    let _s = serial();
    let device = test_device();
    let c = small();
    let batches: Vec<Batch> = (0..4)
        .map(|m| Batch::random(&c, 0, m, &device).unwrap())
        .collect();
    let mut t = Trainer::new(&c, &device).unwrap();
    let loss = accumulate(&mut t, &batches).unwrap().expect("a loss");
    let whole = TrainConfig {
        batch: 4 * c.batch,
        ..c.clone()
    };
    let mut big = Trainer::new(&whole, &device).unwrap();
    let want = big
        .micro_batch(&Batch::cat(&batches).unwrap(), 1)
        .unwrap()
        .unwrap();
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs(),
        "loss {loss} vs {want}"
    );
    for (i, (a, b)) in grads(&t).iter().zip(grads(&big)).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 + 1e-4 * b.abs(),
            "gradient {i}: {a} vs {b}"
        );
    }
}

#[test]
fn exercise_2_optimizer_state_is_what_the_allocator_counts() {
    let _s = serial();
    let device = test_device();
    for optimizer in [
        OptimizerKind::Adam,
        OptimizerKind::Adamw,
        OptimizerKind::Sgd,
    ] {
        let c = TrainConfig {
            optimizer,
            ..small()
        };
        let numels: Vec<usize> = Trainer::new(&c, &device)
            .unwrap()
            .model
            .module()
            .parameters()
            .iter()
            .map(|p| p.numel())
            .collect();
        let r = run(&c, &device).unwrap();
        assert_eq!(numels.iter().sum::<usize>(), r.params);
        assert_eq!(
            r.by_category["optimizer_state"],
            optimizer_state_bytes(optimizer, &numels, c.steps),
            "{optimizer:?}"
        );
        assert_eq!(optimizer_state_bytes(optimizer, &numels, 0), 0);
    }
}

/// A run whose activations outweigh its parameters: checkpointing pays.
fn activation_heavy() -> TrainConfig {
    TrainConfig {
        d_model: 64,
        nhead: 2,
        layers: 2,
        ffn: 128,
        seq: 128,
        steps: 2,
        warmup: 0,
        optimizer: OptimizerKind::Sgd,
        ..TrainConfig::transformer()
    }
}

fn fits(c: &TrainConfig, batch: usize, capacity: u64) -> bool {
    let c = TrainConfig { batch, ..c.clone() };
    run(&c, &Device::new_dry(capacity)).unwrap().oom.is_none()
}

#[test]
fn exercise_3_the_largest_batch_that_fits_and_what_checkpointing_buys() {
    let plain = activation_heavy();
    // The capacity: what a batch of 16 reserves without checkpointing.
    let sized = TrainConfig {
        batch: 16,
        ..plain.clone()
    };
    let capacity = run(&sized, &Device::new_dry(64 << 30))
        .unwrap()
        .peak_reserved;
    let without = largest_batch(&plain, capacity, 256)
        .unwrap()
        .expect("batch 1 fits");
    assert!(
        without >= 16,
        "batch 16 fitted in {capacity} bytes, the answer is {without}"
    );
    assert!(fits(&plain, without, capacity));
    assert!(
        !fits(&plain, without + 1, capacity),
        "{} fits too",
        without + 1
    );
    let checkpointed = TrainConfig {
        checkpoint: CheckpointMode::Layers,
        ..plain.clone()
    };
    let with = largest_batch(&checkpointed, capacity, 256)
        .unwrap()
        .unwrap();
    assert!(fits(&checkpointed, with, capacity));
    assert!(!fits(&checkpointed, with + 1, capacity));
    assert!(with > without, "checkpointing: {with}, without: {without}");
    // Nothing fits a device smaller than the parameters; the cap is honoured.
    assert_eq!(largest_batch(&plain, 1 << 10, 256).unwrap(), None);
    assert_eq!(largest_batch(&plain, 64 << 30, 3).unwrap(), Some(3));
}

/// The activation bytes one encoder layer's forward leaves saved (dropout off, so that
/// only the attention path differs), on the dry-run device, which allocates as the GPU.
fn encoder_layer_activations(
    batch: usize,
    seq: usize,
    d_model: usize,
    heads: usize,
    backend: labs_core::nn::SdpaBackend,
) -> u64 {
    use labs_core::nn::{sdpa_kernel, Module, Rng, TransformerConfig, TransformerEncoderLayer};
    let _backend = sdpa_kernel(backend);
    let device = Device::new_dry(1 << 34);
    let config = TransformerConfig {
        dim_feedforward: 4 * d_model,
        dropout: 0.0,
        ..TransformerConfig::new(d_model, heads)
    };
    let layer = TransformerEncoderLayer::new(config, &mut Rng::seeded(0), &device).unwrap();
    let x = labs_core::Tensor::randn(&[batch, seq, d_model], 0, &device).unwrap();
    let _y = layer.forward(&x).unwrap();
    let by_category = device.allocator().unwrap().memory_by_category();
    let activation = by_category
        .iter()
        .find(|(c, _)| *c == labs_core::alloc::Category::Activation)
        .unwrap();
    activation.1.current
}

#[test]
fn exercise_4_what_the_fused_kernel_does_not_keep() {
    use labs_core::nn::SdpaBackend;
    // Powers of two, then sizes the allocator's 512-byte rounding shows in.
    for (batch, seq, d_model, heads) in [
        (2, 64, 64, 2),
        (2, 128, 64, 4),
        (3, 50, 32, 2),
        (1, 7, 16, 2),
    ] {
        let math = encoder_layer_activations(batch, seq, d_model, heads, SdpaBackend::Math);
        let fused = encoder_layer_activations(batch, seq, d_model, heads, SdpaBackend::Fused);
        assert_eq!(
            math - fused,
            fused_attention_saving(batch, heads, seq, d_model),
            "batch {batch} seq {seq} d_model {d_model} heads {heads}: math {math}, fused {fused}"
        );
    }
    // Quadratic in the sequence: twice the length, four times the saving, nearly (the
    // scaled query grows linearly).
    let short = fused_attention_saving(8, 8, 512, 64) as f64;
    let long = fused_attention_saving(8, 8, 1024, 64) as f64;
    assert!((long / short - 4.0).abs() < 0.05, "{short} {long}");
}

/// One residual MLP block with dropout: `x + gelu(ln(x) W1) dropped W2`.
#[derive(Clone)]
struct Block {
    w1: labs_core::Tensor,
    w2: labs_core::Tensor,
}

impl Block {
    fn new(d: usize, seed: u64, device: &Device) -> Block {
        let w = |shape: &[usize], seed| {
            labs_core::Tensor::randn(shape, seed, device)
                .unwrap()
                .scale(0.1)
                .unwrap()
                .requires_grad_(true)
        };
        Block {
            w1: w(&[d, 4 * d], seed),
            w2: w(&[4 * d, d], seed + 1),
        }
    }

    fn forward(&self, x: &labs_core::Tensor) -> anyhow::Result<labs_core::Tensor> {
        let d = x.shape()[1];
        let h = x.layer_norm(&[d], None, None, 1e-5)?;
        let h = h.matmul(&self.w1)?.gelu("none")?.dropout(0.2, true)?;
        Ok(h.matmul(&self.w2)?.add(x)?)
    }
}

/// How each block runs: plainly, in the library's checkpoint, or in the exercise's.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Run {
    Plain,
    Library,
    Exercise,
}

/// Four blocks over `x` run as `how`, then backward of a weighted sum: the gradients
/// (the blocks' weights, then the input), the peak allocated above what was allocated
/// before, and the generator's state after.
fn four_blocks(blocks: &[Block], x: &labs_core::Tensor, how: Run) -> (Vec<f32>, u64, (u64, u64)) {
    let device = x.device().clone();
    for b in blocks {
        b.w1.clear_grad();
        b.w2.clear_grad();
    }
    device.manual_seed(7);
    let allocator = device.allocator().unwrap();
    let before = allocator.memory_allocated();
    allocator.reset_peak_stats();
    let x = x.detach().requires_grad_(true);
    let mut h = x.clone();
    for b in blocks {
        let b = b.clone();
        h = match how {
            Run::Plain => b.forward(&h).unwrap(),
            Run::Library => labs_core::autograd::checkpoint(
                move |xs| {
                    b.forward(&xs[0])
                        .map_err(|e| labs_core::Error::InvalidArgument(e.to_string()))
                },
                std::slice::from_ref(&h),
            )
            .unwrap(),
            Run::Exercise => {
                let region: Region = std::sync::Arc::new(move |xs| b.forward(&xs[0]));
                checkpointed(region, std::slice::from_ref(&h)).unwrap()
            }
        };
    }
    let r = labs_core::Tensor::randn(h.shape(), 99, &device).unwrap();
    h.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    let peak = allocator.max_memory_allocated() - before;
    let mut grads = Vec::new();
    if !device.is_dry() {
        for b in blocks {
            grads.extend(b.w1.grad().unwrap().to_vec::<f32>().unwrap());
            grads.extend(b.w2.grad().unwrap().to_vec::<f32>().unwrap());
        }
        grads.extend(x.grad().unwrap().to_vec::<f32>().unwrap());
    }
    (grads, peak, device.rng_state())
}

#[test]
fn exercise_5_a_checkpointed_region_of_your_own() {
    let _s = serial();
    // The gradients, on the device under test: those of the plain run, bit for bit
    // (the recomputation draws the same dropout masks), the generator left where the
    // plain run leaves it.
    let device = test_device();
    let blocks: Vec<Block> = (0..4)
        .map(|i| Block::new(16, 10 + 2 * i, &device))
        .collect();
    let x = labs_core::Tensor::randn(&[8, 16], 3, &device).unwrap();
    let (plain, _, rng_plain) = four_blocks(&blocks, &x, Run::Plain);
    let (mine, _, rng_mine) = four_blocks(&blocks, &x, Run::Exercise);
    assert_eq!(plain.len(), mine.len());
    for (i, (a, b)) in plain.iter().zip(&mine).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "gradient {i}: plain {a}, yours {b}"
        );
    }
    assert_eq!(
        rng_mine, rng_plain,
        "the generator must end where the plain run leaves it"
    );

    // The peak, on the dry-run device at a size where it shows: below the plain run's by
    // more than one block's hidden activations, and no higher than the library's.
    let dry = Device::new_dry(1 << 34);
    let (n, d) = (512, 64);
    let blocks: Vec<Block> = (0..4).map(|i| Block::new(d, 10 + 2 * i, &dry)).collect();
    let x = labs_core::Tensor::randn(&[n, d], 3, &dry).unwrap();
    let (_, plain, _) = four_blocks(&blocks, &x, Run::Plain);
    let (_, library, _) = four_blocks(&blocks, &x, Run::Library);
    let (_, mine, _) = four_blocks(&blocks, &x, Run::Exercise);
    let hidden = (n * 4 * d * 4) as u64;
    assert!(library + hidden < plain, "library {library}, plain {plain}");
    assert!(
        mine <= library,
        "your checkpoint's peak {mine} is above the library's {library} (plain: {plain})"
    );
}
