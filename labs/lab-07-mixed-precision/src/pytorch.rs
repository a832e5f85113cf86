//! PyTorch's figures for a training run, beside ours: from `ci/pytorch-train.py` (the
//! driver's twin, with the same flags and JSON fields), run as a child process per
//! configuration, or read from a JSON Lines file of its reports (one object a line,
//! each matched to a run by its configuration).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use labs_train::TrainConfig;
use serde_json::Value;

/// The figures the tables show of one PyTorch run.
#[derive(Debug, Clone, PartialEq)]
pub struct PyTorchRun {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub step_ms: Option<f64>,
    pub skipped_steps: Option<u64>,
    /// The out-of-memory message, when the run did not fit.
    pub oom: Option<String>,
}

/// Where PyTorch's figures come from (`--pytorch PATH`).
#[derive(Debug, Clone)]
pub enum Source {
    /// `ci/pytorch-train.py`: run once per configuration.
    Script(PathBuf),
    /// Reports already written, one JSON object a line.
    Reports(Vec<Value>),
}

/// The configuration keys a report must agree on to be the run's.
const MATCHED: [&str; 15] = [
    "model",
    "d_model",
    "nhead",
    "layers",
    "ffn",
    "dropout",
    "batch",
    "seq",
    "steps",
    "accum",
    "checkpoint",
    "offload",
    "attention",
    "amp",
    "optimizer",
];

impl Source {
    /// A `.py` path is the script; a `.jsonl` (or `.json`) path is read now.
    pub fn open(path: &Path) -> Result<Source> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("py") => {
                if !path.is_file() {
                    bail!("--pytorch {}: no such script", path.display());
                }
                Ok(Source::Script(path.to_path_buf()))
            }
            Some("jsonl" | "json") => {
                let text = labs_core::input::read_report(path)
                    .with_context(|| format!("--pytorch: reading {}", path.display()))?;
                let reports = text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| l.trim_start().starts_with('{'))
                    .map(|(i, l)| {
                        serde_json::from_str(l).with_context(|| {
                            format!("--pytorch {}: line {} is not JSON", path.display(), i + 1)
                        })
                    })
                    .collect::<Result<Vec<Value>>>()?;
                Ok(Source::Reports(reports))
            }
            _ => bail!(
                "--pytorch {}: give ci/pytorch-train.py (a .py path, run per configuration) \
                 or a .jsonl file of its reports",
                path.display()
            ),
        }
    }

    /// PyTorch's run of `config`: the script run with the same flags, or the report
    /// whose configuration matches (`None` if the file has none).
    pub fn run(&self, config: &TrainConfig) -> Result<Option<PyTorchRun>> {
        let report = match self {
            Source::Script(path) => run_script(path, config)?,
            Source::Reports(reports) => {
                let want = serde_json::to_value(config)?;
                match reports.iter().find(|r| matches(&r["config"], &want)) {
                    Some(r) => r.clone(),
                    None => return Ok(None),
                }
            }
        };
        parse(&report).map(Some)
    }
}

/// `ci/pytorch-train.py`'s flags for `config` (every one given, so that its defaults do
/// not matter).
pub fn flags(config: &TrainConfig) -> Vec<String> {
    let c = serde_json::to_value(config).expect("a config serialises");
    let mut out = Vec::new();
    for key in [
        "model",
        "d_model",
        "nhead",
        "layers",
        "dropout",
        "batch",
        "seq",
        "steps",
        "accum",
        "checkpoint",
        "attention",
        "amp",
        "optimizer",
        "lr",
        "seed",
        "warmup",
    ] {
        out.push(format!("--{}", key.replace('_', "-")));
        out.push(match &c[key] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        });
    }
    match config.model {
        labs_train::ModelKind::Transformer => {
            out.extend(["--ffn".to_string(), config.ffn.to_string()])
        }
        labs_train::ModelKind::Gpt2 => {
            out.extend(["--vocab".to_string(), config.vocab.to_string()])
        }
    }
    if config.offload {
        out.push("--offload".into());
    }
    out.push("--json".into());
    out
}

fn run_script(path: &Path, config: &TrainConfig) -> Result<Value> {
    let out = Command::new("python3")
        .arg(path)
        .args(flags(config))
        .output()
        .with_context(|| format!("running python3 {}", path.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // An out-of-memory run still prints its report (and exits 1).
    match stdout.lines().rev().find(|l| l.starts_with('{')) {
        Some(line) => Ok(serde_json::from_str(line)?),
        None => bail!(
            "python3 {} {}: no report (exit {}):\n{}",
            path.display(),
            flags(config).join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Whether a report's configuration is `want`'s on every matched key. Numbers compare
/// as numbers, to float32's precision: PyTorch writes a dropout of 0 as `0.0`, and ours
/// is a float32 (0.1 serialises as 0.10000000149011612).
fn matches(got: &Value, want: &Value) -> bool {
    MATCHED.iter().all(|k| match (&got[k], &want[k]) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0)
        }
        (a, b) => a == b,
    })
}

fn parse(report: &Value) -> Result<PyTorchRun> {
    let bytes = |k: &str| {
        report[k]
            .as_u64()
            .with_context(|| format!("PyTorch's report has no {k}: {report}"))
    };
    Ok(PyTorchRun {
        peak_allocated: bytes("peak_allocated")?,
        peak_reserved: bytes("peak_reserved")?,
        step_ms: report["step_ms"].as_f64(),
        skipped_steps: report["skipped_steps"].as_u64(),
        oom: report["oom"].as_str().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_name_every_setting_and_a_report_matches_its_config() {
        let mut c = TrainConfig::transformer();
        c.batch = 32;
        c.amp = labs_train::AmpMode::F16;
        let f = flags(&c).join(" ");
        assert!(
            f.contains("--model transformer --d-model 512 --nhead 8 --layers 6"),
            "{f}"
        );
        assert!(f.contains("--batch 32 --seq 100"), "{f}");
        assert!(f.contains("--amp f16") && f.contains("--ffn 2048") && f.ends_with("--json"));
        let mut report = serde_json::json!({
            "config": serde_json::to_value(&c).unwrap(),
            "peak_allocated": 1024, "peak_reserved": 2048, "step_ms": 1.5,
            "skipped_steps": 0,
        });
        report["config"]["dropout"] = serde_json::json!(0.1);
        let source = Source::Reports(vec![report]);
        let run = source.run(&c).unwrap().unwrap();
        assert_eq!((run.peak_allocated, run.skipped_steps), (1024, Some(0)));
        c.amp = labs_train::AmpMode::Bf16;
        assert_eq!(source.run(&c).unwrap(), None, "another amp: no report");
    }
}
