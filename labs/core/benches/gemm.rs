//! Matrix-product throughput: TFLOP/s of one square `n x n x n` `Tensor::matmul` in
//! bfloat16 and in float32 with TF32 off, the median of several runs after warm-up,
//! each run timed by a pair of events around the one product (CUDA events on the GPU).
//!
//! ```text
//! LABS_DEVICE=cuda cargo bench -p labs-core --bench gemm   # n = 8192, then criterion
//! cargo bench -p labs-core --bench gemm                    # the simulator, n = 1024
//! bench-gemm --json                                        # the GPU bundle: one JSON object
//! ```
//!
//! `LABS_GEMM_N` picks another size. The summary comes first; under `cargo bench`,
//! criterion then times the same products with its own statistics (as throughput in
//! elements per second, one element being one floating-point operation).
//! `ci/pytorch-reference.py` times `torch.matmul` the same way, in the same GPU run.

use std::time::Duration;

use criterion::{Criterion, SamplingMode, Throughput};
use half::bf16;
use labs_core::testing::test_device;
use labs_core::{DType, Device, Result, Tensor};

const WARMUP: usize = 3;
const RUNS: usize = 10;
/// The dtypes measured, by PyTorch's names (float32 with TF32 off).
const DTYPES: [(DType, &str); 2] = [(DType::BF16, "bfloat16"), (DType::F32, "float32")];

fn size(device: &Device) -> usize {
    match std::env::var("LABS_GEMM_N") {
        Ok(v) => v.parse().expect("LABS_GEMM_N is a matrix size, e.g. 4096"),
        // The simulator computes on the host's cores: a size it finishes in seconds.
        Err(_) if device.is_cuda() => 8192,
        Err(_) => 1024,
    }
}

/// Two `n x n` operands of standard-normal values (as `torch.randn`), in `dtype`.
fn operands(n: usize, dtype: DType, device: &Device) -> Result<[Tensor; 2]> {
    let make = |seed| -> Result<Tensor> {
        let x = Tensor::randn(&[n, n], seed, device)?;
        match dtype {
            DType::F32 => Ok(x),
            DType::BF16 => {
                let host: Vec<bf16> = x.to_vec::<f32>()?.into_iter().map(bf16::from_f32).collect();
                Tensor::from_slice(&host, &[n, n], device)
            }
            other => panic!("no matmul bench for {other}"),
        }
    };
    Ok([make(1)?, make(2)?])
}

/// Milliseconds of `iterations` products `a @ b` back to back, between two events on
/// the default stream (the output's allocation included, as in PyTorch's `a @ b`).
fn time_ms(a: &Tensor, b: &Tensor, iterations: u64) -> Result<f64> {
    let device = a.device();
    let stream = device.default_stream()?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    stream.record(&start)?;
    for _ in 0..iterations {
        a.matmul(b)?;
    }
    stream.record(&end)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64)
}

/// The median of [`RUNS`] single products after [`WARMUP`] (the first product also
/// creates the cuBLAS handle and loads its kernels).
fn median_ms(a: &Tensor, b: &Tensor) -> Result<f64> {
    for _ in 0..WARMUP {
        time_ms(a, b, 1)?;
    }
    let mut samples = (0..RUNS)
        .map(|_| time_ms(a, b, 1))
        .collect::<Result<Vec<f64>>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn tflops(n: usize, ms: f64) -> f64 {
    2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12
}

fn main() -> Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    let device = test_device();
    let n = size(&device);
    let name = device.properties()?.name;
    let timing = if device.is_cuda() {
        "CUDA events"
    } else {
        "simulator events"
    };
    let mut results = serde_json::Map::new();
    let mut lines = Vec::new();
    for (dtype, label) in DTYPES {
        let [a, b] = operands(n, dtype, &device)?;
        let ms = median_ms(&a, &b)?;
        let t = tflops(n, ms);
        results.insert(
            label.into(),
            serde_json::json!({ "median_ms": ms, "tflops": t }),
        );
        let label = if dtype == DType::F32 {
            "float32 (TF32 off)"
        } else {
            label
        };
        lines.push(format!("  {label:<20} {ms:>10.3} ms {t:>9.2} TFLOP/s"));
    }
    if json {
        let mut out = serde_json::Map::new();
        out.insert("device_name".into(), name.into());
        out.insert("n".into(), n.into());
        out.insert("warmup".into(), WARMUP.into());
        out.insert("runs".into(), RUNS.into());
        out.insert("timing".into(), timing.into());
        out.extend(results);
        println!("{}", serde_json::Value::Object(out));
        return Ok(());
    }
    println!(
        "matmul {n} x {n} x {n} on {name} ({}): median of {RUNS} runs after {WARMUP} warm-up, {timing}",
        device.id()
    );
    for line in lines {
        println!("{line}");
    }

    // Criterion's view of the same products (skipped with `--json`, which it would
    // not accept). A product is long: ten samples, each as many back-to-back products
    // as criterion asks for, timed by the events.
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    let mut group = c.benchmark_group(format!("matmul_{n}"));
    group
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(2 * (n as u64).pow(3)));
    for (dtype, label) in DTYPES {
        let [a, b] = operands(n, dtype, &device)?;
        group.bench_function(label, |bencher| {
            bencher.iter_custom(|iterations| {
                let ms = time_ms(&a, &b, iterations).expect("a timed product");
                Duration::from_secs_f64(ms * 1e-3)
            })
        });
    }
    group.finish();
    c.final_summary();
    Ok(())
}
