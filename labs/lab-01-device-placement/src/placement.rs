//! Creating tensors on a device, moving them with `to()`, and the error for mixing
//! devices in one operation.

use std::time::Instant;

use labs_core::format::duration;
use labs_core::table::Table;
use labs_core::{DType, Device, Result, Tensor};

/// Tensors created directly on each device.
pub fn creation(device: &Device) -> Result<Table> {
    let cpu = Device::cpu();
    let mut t = Table::new(
        "Creating tensors (1024 x 1024 float32)",
        &["how", "device", "shape", "dtype", "first values"],
    );
    for dev in [&cpu, device] {
        // ANCHOR: create
        let zeros = Tensor::zeros(&[1024, 1024], DType::F32, dev)?;
        let normal = Tensor::randn(&[1024, 1024], 42, dev)?;
        let values: Vec<f32> = (0..1024 * 1024).map(|i| i as f32).collect();
        let copied = Tensor::from_slice(&values, &[1024, 1024], dev)?;
        // ANCHOR_END: create
        for (how, x) in [
            ("zeros", zeros),
            ("randn(seed 42)", normal),
            ("from_slice", copied),
        ] {
            let head: Vec<String> = x.to_vec::<f32>()?[..3]
                .iter()
                .map(|v| format!("{v:.4}"))
                .collect();
            t.row([
                how.to_string(),
                x.device().to_string(),
                format!("{:?}", x.shape()),
                x.dtype().to_string(),
                head.join(", "),
            ]);
        }
    }
    Ok(t)
}

/// What `to()` does when the tensor is already on the target device, and when not.
pub fn to_semantics(device: &Device) -> Result<Table> {
    let mut t = Table::new(
        "tensor.to(device): a no-op when already there, a copy otherwise",
        &["call", "same storage?", "time"],
    );
    let x = Tensor::randn(&[4096, 1024], 7, device)?;
    device.synchronize()?;

    // ANCHOR: to
    let start = Instant::now();
    let same = x.to(device)?; // already there: the same tensor comes back
    let no_copy = start.elapsed();

    let start = Instant::now();
    let on_host = x.cpu()?; // another device: a real copy, 16 MiB over the bus
    let copy = start.elapsed();
    // ANCHOR_END: to

    t.row([
        format!("x.to({device})"),
        same.shares_storage(&x).to_string(),
        duration(no_copy),
    ]);
    t.row([
        "x.to(cpu)".to_string(),
        on_host.shares_storage(&x).to_string(),
        duration(copy),
    ]);
    let start = Instant::now();
    let back = on_host.to(device)?;
    let back_time = start.elapsed();
    t.row([
        format!("x.cpu().to({device})"),
        back.shares_storage(&x).to_string(),
        duration(back_time),
    ]);
    Ok(t)
}

/// The message an operation on tensors of two devices produces.
pub fn mismatch_error(device: &Device) -> Result<String> {
    // ANCHOR: mismatch
    let on_device = Tensor::full(&[3], 1.0f32, device)?;
    let on_host = Tensor::full(&[3], 2.0f32, &Device::cpu())?;
    let err = on_device
        .add(&on_host)
        .expect_err("mixing devices must fail");
    // ANCHOR_END: mismatch
    Ok(err.to_string())
}
