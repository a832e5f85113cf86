//! PyTorch's side of `replay --pytorch SCRIPT`: the same trace through PyTorch's own
//! allocator, in the mode that matches ours, on the same GPU in the same run
//! (`ci/pytorch-replay.py`), so that the lab prints the two side by side.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use labs_core::alloc::replay::ReplayReport;
use labs_core::{Device, DeviceId};
use serde_json::Value;

/// What the twin measured: the figures `replay` prints for ours.
#[derive(Debug, Clone, PartialEq)]
pub struct TwinReplay {
    pub conf: String,
    pub device: String,
    pub ops: u64,
    pub ns_per_op: f64,
    pub peak_requested: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub device_allocs: u64,
    /// "c++" when the loop was compiled, "python" when it ran in the interpreter (its
    /// time per operation then includes Python's).
    pub loop_kind: String,
    /// The report, whole, for `--json`.
    pub report: Value,
}

impl TwinReplay {
    pub fn fragmentation(&self) -> f64 {
        self.peak_reserved as f64 / self.peak_requested.max(1) as f64
    }

    /// Fails unless the twin replayed what `ours` did: the same operations, peaking at
    /// the same bytes requested.
    pub fn check_same_trace(&self, ours: &ReplayReport) -> Result<()> {
        if self.ops != ours.ops || self.peak_requested != ours.peak_requested {
            bail!(
                "PyTorch's replay saw {} operations peaking at {} requested, ours {} at {}: \
                 not the same trace",
                self.ops,
                self.peak_requested,
                ours.ops,
                ours.peak_requested
            );
        }
        Ok(())
    }
}

/// PyTorch's twin runs on the GPU, so ours must too for the two to be compared.
pub fn require_gpu(device: &Device) -> Result<()> {
    if matches!(device.id(), DeviceId::Sim(_)) {
        bail!(
            "--pytorch compares the two allocators on one GPU, and this runs on the \
             simulated {device}: add --device cuda"
        );
    }
    Ok(())
}

/// Runs `python3 script trace --conf conf --warmup warmup` and reads its one-line JSON
/// report: `warmup` untimed replays first, as ours had (see `mappings`).
pub fn replay(script: &Path, trace: &Path, conf: &str, warmup: u32) -> Result<TwinReplay> {
    if !script.is_file() {
        bail!("--pytorch {}: no such script", script.display());
    }
    let out = Command::new("python3")
        .arg(script)
        .arg(trace)
        .args(["--conf", conf])
        .args(["--warmup", &warmup.to_string()])
        .output()
        .context("--pytorch: cannot run python3")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().rev().find(|l| l.starts_with('{')) else {
        bail!(
            "python3 {} {} --conf {conf} --warmup {warmup}: no report ({}):\n{}",
            script.display(),
            trace.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    };
    parse(serde_json::from_str(line).context("PyTorch's replay report is not JSON")?)
}

/// The twin's report as figures; a missing key is an error naming it.
pub fn parse(report: Value) -> Result<TwinReplay> {
    let num = |k: &str| {
        report[k]
            .as_u64()
            .with_context(|| format!("PyTorch's replay report has no {k}: {report}"))
    };
    let text = |k: &str| {
        report[k]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("PyTorch's replay report has no {k}: {report}"))
    };
    Ok(TwinReplay {
        conf: text("conf")?,
        device: text("device")?,
        loop_kind: text("loop")?,
        ops: num("ops")?,
        ns_per_op: report["ns_per_op"]
            .as_f64()
            .with_context(|| format!("PyTorch's replay report has no ns_per_op: {report}"))?,
        peak_requested: num("peak_requested")?,
        peak_allocated: num("peak_allocated")?,
        peak_reserved: num("peak_reserved")?,
        device_allocs: num("device_allocs")?,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Value {
        serde_json::json!({
            "trace": "t", "conf": "expandable_segments:True", "loop": "c++",
            "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "ops": 4,
            "ns_per_op": 1500.5, "peak_requested": 1000, "peak_allocated": 1024,
            "peak_reserved": 2048, "device_allocs": 1, "unknown_frees": 0
        })
    }

    #[test]
    fn a_report_reads_as_figures() {
        let r = parse(report()).unwrap();
        assert_eq!(r.ops, 4);
        assert_eq!(r.peak_reserved, 2048);
        assert_eq!(r.loop_kind, "c++");
        assert!((r.fragmentation() - 2.048).abs() < 1e-12);
    }

    #[test]
    fn a_report_missing_a_figure_names_it() {
        let mut v = report();
        v.as_object_mut().unwrap().remove("peak_reserved");
        let e = parse(v).unwrap_err().to_string();
        assert!(e.contains("no peak_reserved"), "{e}");
    }

    #[test]
    fn a_missing_script_is_named() {
        let e = replay(
            Path::new("/nonexistent/twin.py"),
            Path::new("t.csv"),
            "x",
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--pytorch /nonexistent/twin.py: no such script"),
            "{e}"
        );
    }
}
