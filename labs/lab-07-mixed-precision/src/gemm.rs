//! Experiment 5: what tensor cores give. One square matrix product `n x n x n` in
//! float32, float32 with TF32 allowed, float16 and bfloat16: the median time and the
//! throughput, `2 n^3` floating-point operations over the time. On a GPU `n = 8192`; the
//! simulated GPU multiplies on the CPU (half types widened to float32, no tensor cores),
//! so its figures say nothing about a GPU and it uses a small `n`.

use std::time::Instant;

use labs_core::table::Table;
use labs_core::tensor::MatmulOptions;
use labs_core::{DType, Device, Result, Tensor};

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub name: &'static str,
    pub ms: f64,
    pub tflops: f64,
}

/// The side of the product: 8192 on a GPU, 256 on the simulator.
pub fn side(device: &Device, quick: bool) -> usize {
    if device.is_cuda() && !quick {
        8192
    } else {
        256
    }
}

// ANCHOR: gemm
pub fn measure(device: &Device, n: usize, samples: usize) -> Result<Vec<Row>> {
    let a32 = Tensor::randn(&[n, n], 1, device)?;
    let b32 = Tensor::randn(&[n, n], 2, device)?;
    let cases: [(&str, DType, bool); 4] = [
        ("float32", DType::F32, false),
        ("float32, TF32 allowed", DType::F32, true),
        ("float16", DType::F16, false),
        ("bfloat16", DType::BF16, false),
    ];
    cases
        .iter()
        .map(|&(name, dtype, allow_tf32)| {
            let (a, b) = (a32.to_dtype(dtype)?, b32.to_dtype(dtype)?);
            let options = MatmulOptions { allow_tf32 };
            a.matmul_with(&b, options)?; // warm-up (cuBLAS picks its kernel)
            let mut times = Vec::with_capacity(samples);
            for _ in 0..samples.max(1) {
                device.synchronize()?;
                let start = Instant::now();
                let c = a.matmul_with(&b, options)?;
                device.synchronize()?;
                times.push(start.elapsed());
                drop(c);
            }
            let t = labs_core::timing::median(&mut times).as_secs_f64();
            Ok(Row {
                name,
                ms: t * 1e3,
                tflops: 2.0 * (n as f64).powi(3) / t / 1e12,
            })
        })
        .collect()
}
// ANCHOR_END: gemm

/// Three significant digits, however small (the simulator's throughput is tiny).
fn significant(x: f64) -> String {
    if x <= 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = (2 - x.log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

pub fn table(device: &Device, n: usize, rows: &[Row]) -> Table {
    let what = if device.is_cuda() {
        String::new()
    } else {
        " (the simulated GPU multiplies on the CPU: no tensor cores, half types widened; a \
         small n)"
            .to_string()
    };
    let mut t = Table::new(
        format!("5. Matrix product throughput on {device}, {n} x {n} x {n}{what}"),
        &["dtype", "median (ms)", "TFLOP/s", "vs float32"],
    );
    let base = rows.first().map_or(1.0, |r| r.tflops);
    for r in rows {
        t.row([
            r.name.to_string(),
            format!("{:.3}", r.ms),
            significant(r.tflops),
            format!("{:.1}x", r.tflops / base),
        ]);
    }
    t
}
