//! One training step, timed against PyTorch eager: the two steps of
//! `ci/pytorch-reference.py`'s `train_step` key, float32 with TF32 off, Adam(lr=1e-3),
//! `loss = mse_loss(model(x), target)` against a random target:
//!
//! * `mlp`: Linear(1024, 4096), ReLU, Linear(4096, 1024) on a batch of 512;
//! * `encoder_layer`: one TransformerEncoderLayer(d_model 512, nhead 8, ffn 2048,
//!   dropout 0.1, batch_first) in training mode on `[16, 128, 512]`.
//!
//! A step is `zero_grad`, forward, loss, backward, `step`, between two events on the
//! default stream (CUDA events on the GPU): 10 warm-up steps, then the median of 50.
//! The peak is the allocator's `max_memory_allocated` over a step after a peak reset
//! (the parameters, the optimizer state and the inputs included, as PyTorch's is).
//!
//! ```text
//! LABS_DEVICE=cuda cargo bench -p labs-core --bench train_step
//! bench-train-step --json --pytorch pytorch-reference.json   # the GPU bundle
//! cargo bench -p labs-core --bench train_step                # the simulator, small sizes
//! ```
//!
//! On the simulator the sizes are scaled down (it computes on the host's cores) and the
//! steps are fewer; `LABS_TRAIN_STEP_FULL=1` runs the GPU's sizes there too, and
//! `LABS_TRAIN_STEP_RUNS=WARMUP,RUNS` other step counts (a quick look at the peak). With
//! `--pytorch FILE` (the JSON object `ci/pytorch-reference.py` printed in the same run),
//! PyTorch's figures are printed beside ours with the ratio ours / PyTorch's.

use labs_core::nn::{Mlp, Module, Rng, TransformerConfig, TransformerEncoderLayer};
use labs_core::optim::{Adam, Optimizer};
use labs_core::table::Table;
use labs_core::testing::test_device;
use labs_core::{Device, Result, Tensor};
use serde_json::{json, Value};

/// The sizes of one run.
struct Sizes {
    warmup: usize,
    runs: usize,
    /// batch, in, hidden, out.
    mlp: [usize; 4],
    /// batch, seq, d_model, nhead, dim_feedforward.
    encoder: [usize; 5],
}

const FULL: Sizes = Sizes {
    warmup: 10,
    runs: 50,
    mlp: [512, 1024, 4096, 1024],
    encoder: [16, 128, 512, 8, 2048],
};

/// What the simulator finishes in seconds.
const SIM: Sizes = Sizes {
    warmup: 2,
    runs: 5,
    mlp: [64, 128, 512, 128],
    encoder: [2, 16, 64, 8, 256],
};

const DROPOUT: f32 = 0.1;

/// One step's figures.
struct Measured {
    median_ms: f64,
    peak_allocated_bytes: u64,
    parameters: usize,
    config: Value,
}

/// Times `model` trained on `x` against `target` as the reference does.
fn measure(
    model: &dyn Module,
    x: &Tensor,
    target: &Tensor,
    sizes: &Sizes,
    config: Value,
) -> Result<Measured> {
    let device = x.device();
    let alloc = device.allocator()?;
    let stream = device.default_stream()?;
    let mut opt = Adam::new(model.parameters(), 1e-3);
    let (mut times, mut peak) = (Vec::new(), 0);
    for i in 0..sizes.warmup + sizes.runs {
        device.synchronize()?;
        alloc.reset_peak_stats();
        let (start, end) = (device.new_event()?, device.new_event()?);
        stream.record(&start)?;
        opt.zero_grad(true)?;
        let loss = model.forward(x)?.mse_loss(target)?;
        loss.backward()?;
        opt.step()?;
        stream.record(&end)?;
        end.synchronize()?;
        if i >= sizes.warmup {
            times.push(start.elapsed_ms(&end)? as f64);
            peak = peak.max(alloc.max_memory_allocated());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Measured {
        median_ms: times[times.len() / 2],
        peak_allocated_bytes: peak,
        parameters: model.num_parameters(),
        config,
    })
}

fn mlp(device: &Device, sizes: &Sizes) -> Result<Measured> {
    let [batch, inp, hidden, out] = sizes.mlp;
    let model = Mlp::new(&[inp, hidden, out], &mut Rng::seeded(0), device)?;
    let x = Tensor::randn(&[batch, inp], 1, device)?;
    let target = Tensor::randn(&[batch, out], 2, device)?;
    let config = json!({ "batch": batch, "in": inp, "hidden": hidden, "out": out });
    measure(&model, &x, &target, sizes, config)
}

fn encoder_layer(device: &Device, sizes: &Sizes) -> Result<Measured> {
    let [batch, seq, d_model, nhead, ffn] = sizes.encoder;
    let c = TransformerConfig {
        dim_feedforward: ffn,
        dropout: DROPOUT,
        ..TransformerConfig::new(d_model, nhead)
    };
    let mut model = TransformerEncoderLayer::new(c, &mut Rng::seeded(0), device)?;
    model.train(true);
    let x = Tensor::randn(&[batch, seq, d_model], 1, device)?;
    let target = Tensor::randn(&[batch, seq, d_model], 2, device)?;
    let config = json!({
        "batch": batch, "seq": seq, "d_model": d_model, "nhead": nhead,
        "dim_feedforward": ffn, "dropout": (DROPOUT as f64 * 1e6).round() / 1e6,
    });
    measure(&model, &x, &target, sizes, config)
}

/// PyTorch's `train_step` object from the reference's JSON file, and its GPU's name.
fn read_pytorch(path: &str) -> std::result::Result<(Value, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
        format!("{path} is not the JSON object ci/pytorch-reference.py prints: {e}")
    })?;
    let steps = v
        .get("train_step")
        .filter(|s| s.is_object())
        .ok_or_else(|| format!("{path} has no train_step object (an older reference script?)"))?;
    let name = v["device_name"].as_str().unwrap_or("unknown").to_string();
    Ok((steps.clone(), name))
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1u64 << 20) as f64)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().any(|a| a == "--json");
    let pytorch_path = args
        .iter()
        .position(|a| a == "--pytorch")
        .map(|i| args.get(i + 1).expect("--pytorch takes a file").clone());
    let device = test_device();
    let full = device.is_cuda() || std::env::var_os("LABS_TRAIN_STEP_FULL").is_some();
    let mut sizes = if full { FULL } else { SIM };
    if let Ok(v) = std::env::var("LABS_TRAIN_STEP_RUNS") {
        let parsed: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        match parsed[..] {
            [warmup, runs] if runs > 0 => (sizes.warmup, sizes.runs) = (warmup, runs),
            _ => panic!("LABS_TRAIN_STEP_RUNS={v}: expected WARMUP,RUNS, e.g. 1,3"),
        }
    }
    let sizes = &sizes;
    let name = device.properties()?.name;
    let timing = if device.is_cuda() {
        "CUDA events"
    } else {
        "simulator events"
    };
    let pytorch = pytorch_path.as_deref().map(read_pytorch).transpose();
    let pytorch = match pytorch {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-train-step: {e}");
            std::process::exit(2);
        }
    };
    let measured = [
        ("mlp", mlp(&device, sizes)?),
        ("encoder_layer", encoder_layer(&device, sizes)?),
    ];

    let mut out = serde_json::Map::new();
    out.insert("device_name".into(), name.clone().into());
    out.insert("timing".into(), timing.into());
    out.insert("warmup".into(), sizes.warmup.into());
    out.insert("runs".into(), sizes.runs.into());
    out.insert("full_sizes".into(), full.into());
    let mut table = Table::new(
        "training step",
        &[
            "step",
            "ours ms",
            "PyTorch ms",
            "ratio",
            "ours peak MiB",
            "PyTorch peak MiB",
            "parameters",
        ],
    );
    for (key, m) in &measured {
        let theirs = pytorch.as_ref().and_then(|(p, _)| p.get(*key));
        let their_ms = theirs.and_then(|t| t["median_ms"].as_f64());
        let their_peak = theirs.and_then(|t| t["peak_allocated_bytes"].as_f64());
        // Only the same sizes compare (the simulator's are smaller).
        let ratio = their_ms.filter(|_| full).map(|t| m.median_ms / t);
        let mut entry = json!({
            "median_ms": m.median_ms,
            "peak_allocated_bytes": m.peak_allocated_bytes,
            "parameters": m.parameters,
            "pytorch_median_ms": their_ms,
            "pytorch_peak_allocated_bytes": their_peak,
            "ratio": ratio,
        });
        if let (Some(e), Some(c)) = (entry.as_object_mut(), m.config.as_object()) {
            e.extend(c.clone());
        }
        out.insert((*key).into(), entry);
        let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        table.row([
            key.to_string(),
            format!("{:.3}", m.median_ms),
            or_dash(their_ms.map(|t| format!("{t:.3}"))),
            or_dash(ratio.map(|r| format!("{r:.2}x"))),
            mib(m.peak_allocated_bytes as f64),
            or_dash(their_peak.map(mib)),
            m.parameters.to_string(),
        ]);
    }
    out.insert(
        "pytorch_device_name".into(),
        pytorch.as_ref().map(|(_, n)| n.clone()).into(),
    );
    if json_out {
        println!("{}", Value::Object(out));
        return Ok(());
    }
    println!(
        "training step (zero_grad, forward, mse_loss, backward, Adam step), float32, TF32 off, \
         on {name} ({}): median of {} after {} warm-up, {timing}{}",
        device.id(),
        sizes.runs,
        sizes.warmup,
        if full { "" } else { " (simulator sizes)" }
    );
    print!("{table}");
    match &pytorch {
        Some((_, n)) => {
            println!("PyTorch measured on {n}; ratio = ours / PyTorch (target: at most 1)")
        }
        None => println!("PyTorch: not measured in this run (pass --pytorch FILE)"),
    }
    Ok(())
}
