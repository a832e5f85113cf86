//! A kernel profiler for finding where a step's time goes, without Nsight: while on,
//! every launch through [`Device::launch`](super::Device::launch) waits for the stream
//! before and after the kernel and adds the time between to its label's total (the
//! kernel family, its op and dtype). The waits serialise the GPU and add a round trip
//! per kernel, so the step runs slower than it would; what it shows is each family's
//! share, not a step time.
//!
//! On with `LABS_PROFILE=1` or [`start`]; [`take`] returns the totals and clears them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::kernels::Kernel;

/// The environment variable that turns the profiler on for the whole process.
pub const ENV_PROFILE: &str = "LABS_PROFILE";

static ON: AtomicBool = AtomicBool::new(false);

fn totals() -> &'static Mutex<HashMap<String, (u64, Duration)>> {
    static TOTALS: OnceLock<Mutex<HashMap<String, (u64, Duration)>>> = OnceLock::new();
    TOTALS.get_or_init(|| {
        if std::env::var(ENV_PROFILE).is_ok_and(|v| v == "1") {
            ON.store(true, Ordering::Relaxed);
        }
        Mutex::new(HashMap::new())
    })
}

/// Whether launches are being timed.
pub fn enabled() -> bool {
    totals();
    ON.load(Ordering::Relaxed)
}

/// Starts timing launches.
pub fn start() {
    totals();
    ON.store(true, Ordering::Relaxed);
}

/// Stops timing launches (the totals stay until [`take`]).
pub fn stop() {
    ON.store(false, Ordering::Relaxed);
}

/// One label's launches.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    pub label: String,
    pub launches: u64,
    pub total: Duration,
}

/// The totals so far, the longest first; clears them.
pub fn take() -> Vec<KernelTime> {
    let mut rows: Vec<KernelTime> = totals()
        .lock()
        .unwrap()
        .drain()
        .map(|(label, (launches, total))| KernelTime {
            label,
            launches,
            total,
        })
        .collect();
    rows.sort_by(|a, b| b.total.cmp(&a.total).then(a.label.cmp(&b.label)));
    rows
}

pub(super) fn record(kernel: &Kernel, took: Duration) {
    let mut t = totals().lock().unwrap();
    let e = t.entry(label(kernel)).or_insert((0, Duration::ZERO));
    e.0 += 1;
    e.1 += took;
}

/// The kernel's family (its variant), and its op, dtype and shape class where it has
/// them, read from its debug form: one rule for every kernel, so that a new one needs
/// no entry here.
pub fn label(kernel: &Kernel) -> String {
    let text = format!("{kernel:?}");
    let family: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let mut label = family.clone();
    // A family that wraps a kernel enum of its own (`Attention(Forward { .. })`): the
    // inner variant too.
    if let Some(rest) = text[family.len()..].strip_prefix('(') {
        let inner: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if inner.chars().next().is_some_and(char::is_uppercase) && inner != family {
            label.push(' ');
            label.push_str(&inner);
        }
    }
    for key in [
        "op: ",
        "kind: ",
        "dtype: ",
        "a_dtype: ",
        "transa: ",
        "transb: ",
    ] {
        if let Some(at) = text.find(key) {
            let value: String = text[at + key.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            label.push(' ');
            label.push_str(&value);
        }
    }
    label
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::kernels::UnaryOp;

    #[test]
    fn a_label_names_the_family_op_and_dtype() {
        let k = Kernel::Unary {
            op: UnaryOp::Exp,
            dtype: DType::BF16,
            x: 0,
            out: 0,
            n: 4,
            alpha: 0.0,
        };
        assert_eq!(label(&k), "Unary Exp BF16");
    }
}
