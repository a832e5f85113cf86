//! A kernel profiler for finding where a step's time goes, without Nsight: while on,
//! every launch through [`Device::launch`](super::Device::launch) is bracketed by two
//! events on its stream, and [`take`] adds the GPU time between each pair to the
//! launch's label (the kernel family, its op and dtype). Nothing waits, so the GPU runs
//! as it would (two event records more per launch); the sum is the time the GPU spent
//! in kernels, and a step's time beyond it is the GPU waiting for the host.
//!
//! On with `LABS_PROFILE=1` or [`start`]; [`take`] returns the totals and clears them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::backend::Event;
use crate::error::Result;
use crate::kernels::{Kernel, MixedForm};

/// The environment variable that turns the profiler on for the whole process.
pub const ENV_PROFILE: &str = "LABS_PROFILE";

static ON: AtomicBool = AtomicBool::new(false);

/// Each timed launch: its label and the events around it.
type Pending = Vec<(String, Event, Event)>;

fn totals() -> &'static Mutex<Pending> {
    static TOTALS: OnceLock<Mutex<Pending>> = OnceLock::new();
    TOTALS.get_or_init(|| {
        if std::env::var(ENV_PROFILE).is_ok_and(|v| v == "1") {
            ON.store(true, Ordering::Relaxed);
        }
        Mutex::new(Vec::new())
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

/// The totals so far, the longest first (waits for the launches timed); clears them.
pub fn take() -> Result<Vec<KernelTime>> {
    let pending: Pending = std::mem::take(&mut *totals().lock().unwrap());
    let mut sums: HashMap<String, (u64, Duration)> = HashMap::new();
    for (label, start, end) in pending {
        end.synchronize()?;
        let ms = start.elapsed_ms(&end)?.max(0.0);
        let e = sums.entry(label).or_insert((0, Duration::ZERO));
        e.0 += 1;
        e.1 += Duration::from_secs_f64(f64::from(ms) / 1e3);
    }
    let mut rows: Vec<KernelTime> = sums
        .into_iter()
        .map(|(label, (launches, total))| KernelTime {
            label,
            launches,
            total,
        })
        .collect();
    rows.sort_by(|a, b| b.total.cmp(&a.total).then(a.label.cmp(&b.label)));
    Ok(rows)
}

pub(super) fn record(kernel: &Kernel, start: Event, end: Event) {
    totals().lock().unwrap().push((label(kernel), start, end));
}

/// The kernel's family (its variant), and its op, dtype and shape class where it has
/// them, read from its debug form: one rule for every kernel, so that a new one needs
/// no entry here.
pub fn label(kernel: &Kernel) -> String {
    // Matrix products by shape: which of them is slow is the question.
    if let Kernel::Gemm(g) = kernel {
        return format!(
            "Gemm {:?}{} {}x{}x{} batch {} {}{}{}",
            g.dtype,
            if g.c_dtype == g.dtype {
                String::new()
            } else {
                format!("->{:?}", g.c_dtype)
            },
            g.m,
            g.n,
            g.k,
            g.batch,
            if g.a.transposed { "T" } else { "N" },
            if g.b.transposed { "T" } else { "N" },
            if g.bias.is_some() { " bias" } else { "" }
        );
    }
    // Which conversion, and which pair of dtypes: the casts a mixed-precision step
    // launches are the question.
    if let Kernel::Cast { from, to, .. } = kernel {
        return format!("Cast {from:?}->{to:?}");
    }
    if let Kernel::MixedBinary(m) = kernel {
        let form = match m.form {
            MixedForm::Dense => "",
            MixedForm::Rows { .. } => " rows",
            MixedForm::Strided { .. } => " strided",
        };
        return format!(
            "MixedBinary {:?} {:?} {:?}{form}",
            m.op, m.a_dtype, m.b_dtype
        );
    }
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
        let cast = Kernel::Cast {
            from: DType::BF16,
            to: DType::F32,
            x: 0,
            out: 0,
            n: 4,
        };
        assert_eq!(label(&cast), "Cast BF16->F32");
        let mixed = Kernel::MixedBinary(crate::kernels::MixedBinary {
            op: crate::kernels::BinaryOp::Add,
            a_dtype: DType::F32,
            b_dtype: DType::BF16,
            a: 0,
            b: 0,
            out: 0,
            n: 4,
            alpha: 0.0,
            form: MixedForm::Rows {
                cols: 2,
                row_first: false,
            },
        });
        assert_eq!(label(&mixed), "MixedBinary Add F32 BF16 rows");
    }
}
