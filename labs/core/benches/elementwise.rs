//! Elementwise bandwidth: GB/s of an out-of-place float32 `add` of two 1 GiB tensors
//! (3 GiB moved: two read, one written) beside a device-to-device copy of 1 GiB (2 GiB
//! moved), counting bytes read plus written, the median of several runs after warm-up,
//! each run timed by a pair of events (CUDA events on the GPU). The ratio add/copy says
//! how close the dense (vectorised) binary kernel comes to the memory system's limit;
//! the target is 90 % or more.
//!
//! ```text
//! LABS_DEVICE=cuda cargo bench -p labs-core --bench elementwise   # 1 GiB tensors
//! cargo bench -p labs-core --bench elementwise                    # the simulator, 16 MiB
//! bench-elementwise --json                                        # the GPU bundle: one JSON object
//! ```
//!
//! Beside them, a bias add: the same tensor as `[rows, 768]` plus a `[768]` row (2 GiB
//! moved), by the dense row-broadcast kernel the tensor layer picks (`BinaryRows`) and
//! by the strided kernel it replaced (`BinaryStrided`, launched directly), with the
//! same result.
//!
//! `LABS_ELEMENTWISE_MIB` picks another tensor size. `ci/pytorch-reference.py` times
//! `torch.add(a, b, out=c)` and `c.copy_(a)` the same way, in the same GPU run (its
//! "elementwise" key). Our `add` takes its output from the caching allocator on each
//! call, as `a + b` does in PyTorch: after the first run that is a cache hit.

use labs_core::kernels::{BinaryOp, Kernel, Strided};
use labs_core::testing::test_device;
use labs_core::{DType, Device, Result, Tensor};

/// The bias add's row: GPT-2 small's width.
const COLS: usize = 768;

const WARMUP: usize = 3;
const RUNS: usize = 10;

fn mib(device: &Device) -> usize {
    match std::env::var("LABS_ELEMENTWISE_MIB") {
        Ok(v) => v
            .parse()
            .expect("LABS_ELEMENTWISE_MIB is a size in MiB, e.g. 1024"),
        Err(_) if device.is_cuda() => 1024,
        // The simulator copies on the host's cores: a size it finishes in a blink.
        Err(_) => 16,
    }
}

/// Milliseconds of `work` between two events on the default stream.
fn time_ms(device: &Device, work: &dyn Fn() -> Result<()>) -> Result<f64> {
    let stream = device.default_stream()?;
    let (start, end) = (device.new_event()?, device.new_event()?);
    stream.record(&start)?;
    work()?;
    stream.record(&end)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64)
}

/// The median of [`RUNS`] timed runs after [`WARMUP`] untimed ones (the first add also
/// compiles the module and fills the allocator's cache).
fn median_ms(device: &Device, work: &dyn Fn() -> Result<()>) -> Result<f64> {
    for _ in 0..WARMUP {
        time_ms(device, work)?;
    }
    let mut samples = (0..RUNS)
        .map(|_| time_ms(device, work))
        .collect::<Result<Vec<f64>>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn gbps(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

fn main() -> Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    let device = test_device();
    let bytes = mib(&device) << 20;
    let n = bytes / 4;
    let name = device.properties()?.name;
    let timing = if device.is_cuda() {
        "CUDA events"
    } else {
        "simulator events"
    };
    let a = Tensor::full(&[n], 1.0f32, &device)?;
    let b = Tensor::full(&[n], 2.0f32, &device)?;
    let c = Tensor::empty(&[n], DType::F32, &device)?;

    let add_ms = median_ms(&device, &|| a.add(&b).map(drop))?;
    let stream = device.default_stream()?;
    let copy_ms = median_ms(&device, &|| {
        device.backend().copy_dtod(c.ptr(), a.ptr(), bytes, &stream)
    })?;
    // The bias add: `[rows, 768] + [768]`, by the row kernel and by the strided one.
    let rows = n / COLS;
    let matrix = a.narrow(0, 0, rows * COLS)?.reshape(&[rows, COLS])?;
    let row = Tensor::full(&[COLS], 0.5f32, &device)?;
    let rows_ms = median_ms(&device, &|| matrix.add(&row).map(drop))?;
    let strided_out = Tensor::empty(&[rows, COLS], DType::F32, &device)?;
    let strided = Kernel::BinaryStrided {
        op: BinaryOp::Add,
        dtype: DType::F32,
        a: matrix.ptr(),
        a_layout: Strided::new(&[rows, COLS], &[COLS as isize, 1])?,
        b: row.ptr(),
        b_layout: Strided::new(&[rows, COLS], &[0, 1])?,
        out: strided_out.ptr(),
        n: rows * COLS,
        alpha: 0.0,
    };
    let strided_ms = median_ms(&device, &|| device.launch(&strided))?;
    let by_rows = matrix.add(&row)?;
    for i in [0, rows / 2, rows - 1] {
        let one = by_rows.narrow(0, i, 1)?.to_vec::<f32>()?;
        assert_eq!(one, strided_out.narrow(0, i, 1)?.to_vec::<f32>()?);
        assert_eq!(one, vec![1.5; COLS], "the bias add gave a wrong row at {i}");
    }
    let bias_bytes = 2 * rows * COLS * 4;
    let (rows_gbps, strided_gbps) = (gbps(bias_bytes, rows_ms), gbps(bias_bytes, strided_ms));
    // The add was right: 1 + 2 everywhere (checked at both ends and the middle).
    let sum = a.add(&b)?;
    for i in [0, n / 2, n - 1] {
        let one = sum.narrow(0, i, 1)?.to_vec::<f32>()?;
        assert_eq!(one, [3.0], "add gave a wrong element at {i}");
    }
    let (add_gbps, copy_gbps) = (gbps(3 * bytes, add_ms), gbps(2 * bytes, copy_ms));
    let ratio = add_gbps / copy_gbps;
    if json {
        let out = serde_json::json!({
            "device_name": name,
            "bytes_per_tensor": bytes,
            "dtype": "float32",
            "warmup": WARMUP,
            "runs": RUNS,
            "timing": timing,
            "add": { "median_ms": add_ms, "gbps": add_gbps, "bytes_moved": 3 * bytes },
            "copy": { "median_ms": copy_ms, "gbps": copy_gbps, "bytes_moved": 2 * bytes },
            "add_over_copy": ratio,
            "bias_add_rows": { "median_ms": rows_ms, "gbps": rows_gbps, "bytes_moved": bias_bytes },
            "bias_add_strided": { "median_ms": strided_ms, "gbps": strided_gbps, "bytes_moved": bias_bytes },
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "float32, {} MiB per tensor on {name} ({}): median of {RUNS} runs after {WARMUP} \
         warm-up, {timing}, GB/s counting bytes read + written",
        bytes >> 20,
        device.id()
    );
    println!("  add (out of place)  {add_ms:>10.3} ms {add_gbps:>9.1} GB/s");
    println!("  copy (dtod)         {copy_ms:>10.3} ms {copy_gbps:>9.1} GB/s");
    println!("  add / copy          {:>10.1} %", 100.0 * ratio);
    println!(
        "  bias add, rows      {rows_ms:>10.3} ms {rows_gbps:>9.1} GB/s  [rows, {COLS}] + [{COLS}]"
    );
    println!("  bias add, strided   {strided_ms:>10.3} ms {strided_gbps:>9.1} GB/s  the same by BinaryStrided");
    Ok(())
}
