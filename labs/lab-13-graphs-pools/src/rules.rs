//! What a capture forbids. While a stream captures, its work is recorded, not run, so
//! nothing may wait for it: synchronising, reading a value on the host, copying a
//! tensor to pageable host memory all fail, and the failure invalidates the capture.
//! The GPU's driver enforces these rules; the simulated GPU enforces the same.
//! (`empty_cache` is not among them: inside a capture it gives nothing back and
//! returns, as PyTorch's does.)

use labs_core::device::Graph;
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

/// A call made inside the capture, given the region's output.
type Forbidden<'a> = dyn Fn(&Tensor) -> Result<()> + 'a;

/// One forbidden call and what the capture said.
pub struct Rule {
    pub call: &'static str,
    /// The capture's error, first line.
    pub error: String,
    /// Whether the graph could still be captured again and replayed afterwards.
    pub recovered: bool,
}

// ANCHOR: rules
/// Each forbidden call inside a capture of `x * 0.5 + 1`, and whether a fresh capture
/// works after it.
pub fn measure(device: &Device) -> Result<Vec<Rule>> {
    let x = Tensor::full(&[4096], 1.0f32, device)?;
    crate::chain(&x, 1)?;
    let calls: [(&'static str, &Forbidden); 3] = [
        ("synchronize the device", &|_| device.synchronize()),
        ("read a value (.item())", &|y| {
            y.sum_all()?.item::<f32>().map(drop)
        }),
        ("copy to the host (.cpu())", &|y| {
            y.to_vec::<f32>().map(drop)
        }),
    ];
    let mut rules = Vec::new();
    for (call, forbidden) in calls {
        let mut graph = Graph::new(device)?;
        let outcome = graph.capture(None, || -> Result<()> {
            let y = crate::chain(&x, 1)?;
            forbidden(&y)
        });
        let error = match outcome {
            Ok(()) => "(allowed)".to_string(),
            Err(e) => e.to_string().lines().next().unwrap_or_default().to_string(),
        };
        let y = graph.capture(None, || crate::chain(&x, 1))?;
        graph.replay()?;
        let recovered = y.to_vec::<f32>()?.first() == Some(&1.5);
        rules.push(Rule {
            call,
            error,
            recovered,
        });
    }
    // ANCHOR_END: rules
    Ok(rules)
}

pub fn table(device: &Device, rules: &[Rule]) -> Table {
    let mut t = Table::new(
        format!("What a capture on {device} forbids, and the error it gives"),
        &["call in the capture", "error", "captures again after it"],
    );
    for r in rules {
        t.row([
            r.call.to_string(),
            r.error.clone(),
            if r.recovered { "yes" } else { "no" }.to_string(),
        ]);
    }
    t
}
