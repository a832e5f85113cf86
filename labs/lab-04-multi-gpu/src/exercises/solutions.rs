//! Reference solutions of the exercises in `starter.rs`.

use labs_core::{Device, Error, Result, Tensor};

pub fn scatter(batch: &Tensor, devices: &[Device]) -> Result<Vec<Tensor>> {
    if devices.is_empty() || batch.shape().is_empty() {
        return Err(Error::InvalidArgument(
            "scatter: a batch with a first dimension and at least one device".into(),
        ));
    }
    let n = batch.shape()[0];
    let chunk = n.div_ceil(devices.len()).max(1);
    (0..n)
        .step_by(chunk)
        .zip(devices)
        .map(|(start, device)| batch.narrow(0, start, chunk.min(n - start))?.to(device))
        .collect()
}

pub fn gather(outputs: &[Tensor], device: &Device) -> Result<Tensor> {
    let moved = outputs
        .iter()
        .map(|o| o.to(device))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&moved.iter().collect::<Vec<_>>(), 0)
}

pub fn buckets(bytes: &[usize], first_cap: usize, cap: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0;
    for i in (0..bytes.len()).rev() {
        let limit = if out.len() == 1 { first_cap } else { cap };
        match out.last_mut() {
            Some(open) if filled + bytes[i] <= limit => {
                open.push(i);
                filled += bytes[i];
            }
            _ => {
                out.push(vec![i]);
                filled = bytes[i];
            }
        }
    }
    out
}
