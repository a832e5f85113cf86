//! PyTorch's figures for the same configurations: `ci/pytorch-train.py` run as a child
//! process on the same GPU (after our run, our cache emptied, so the two never share the
//! memory), or the JSON lines `ci/train-compare.py --out FILE` wrote, matched by
//! configuration name. A run that failed is a [`PyTorchRun::Failed`], never an error of
//! ours: the tables show it in its cells.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use labs_train::TrainConfig;

/// What PyTorch measured for one configuration (its JSON's fields that the tables use).
#[derive(Debug, Clone, PartialEq)]
pub struct PyTorchFigures {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub step_ms: Option<f64>,
    /// What cuBLAS's workspaces held in PyTorch's allocator (`gemm_workspace_bytes`;
    /// 0 where the twin did not say).
    pub gemm_workspace: u64,
}

/// PyTorch's side of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum PyTorchRun {
    Measured(PyTorchFigures),
    /// It did not finish: `cell` is what the table shows (OOM, error, timeout, ...),
    /// `message` the reason, printed under the table.
    Failed {
        cell: String,
        message: String,
    },
}

impl PyTorchRun {
    pub fn figures(&self) -> Option<&PyTorchFigures> {
        match self {
            PyTorchRun::Measured(f) => Some(f),
            PyTorchRun::Failed { .. } => None,
        }
    }

    fn failed(cell: &str, message: impl Into<String>) -> PyTorchRun {
        PyTorchRun::Failed {
            cell: cell.to_string(),
            message: message.into(),
        }
    }

    /// The run that `report` (the twin's JSON object) describes, checked against the
    /// configuration it is meant to be.
    fn from_report(report: &Value, config: &TrainConfig) -> PyTorchRun {
        if let Some(oom) = report.get("oom").and_then(Value::as_str) {
            return PyTorchRun::failed("OOM", first_line(oom));
        }
        if let Some(difference) = config_difference(report, config) {
            return PyTorchRun::failed("other config", difference);
        }
        let number = |key: &str| report.get(key).and_then(Value::as_u64);
        match (number("peak_allocated"), number("peak_reserved")) {
            (Some(peak_allocated), Some(peak_reserved)) => PyTorchRun::Measured(PyTorchFigures {
                peak_allocated,
                peak_reserved,
                step_ms: report.get("step_ms").and_then(Value::as_f64),
                gemm_workspace: number("gemm_workspace_bytes").unwrap_or(0),
            }),
            _ => PyTorchRun::failed("error", "the JSON has no peak_allocated or peak_reserved"),
        }
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").trim().to_string()
}

/// Which of the flags that shape memory differ between PyTorch's JSON `config` and
/// ours, as a message; `None` when they agree.
fn config_difference(report: &Value, c: &TrainConfig) -> Option<String> {
    let theirs = report.get("config")?;
    let ours = serde_json::to_value(c).ok()?;
    let mut keys = vec![
        "model",
        "d_model",
        "nhead",
        "layers",
        "ffn",
        "batch",
        "seq",
        "accum",
        "checkpoint",
        "offload",
        "attention",
        "amp",
        "optimizer",
    ];
    if c.model == labs_train::ModelKind::Gpt2 {
        keys.push("vocab");
    }
    let mut differ = Vec::new();
    for key in keys {
        if theirs.get(key) != ours.get(key) {
            differ.push(format!(
                "{key} {} (ours {})",
                theirs.get(key).unwrap_or(&Value::Null),
                ours.get(key).unwrap_or(&Value::Null)
            ));
        }
    }
    (!differ.is_empty()).then(|| format!("PyTorch's run had {}", differ.join(", ")))
}

/// Where PyTorch's figures come from (`--pytorch PATH`).
pub enum PyTorchSource {
    /// `ci/pytorch-train.py`, run once per configuration by `python`.
    Script { script: PathBuf, python: String },
    /// train-compare's JSON lines: PyTorch's side of each configuration, by name.
    Lines {
        path: PathBuf,
        runs: HashMap<String, Value>,
    },
}

/// How long one PyTorch run may take.
pub const TIMEOUT: Duration = Duration::from_secs(900);

impl PyTorchSource {
    /// `--pytorch PATH`: a `.py` script to run, or `.jsonl`/`.json` lines to read (read
    /// now, so that a bad file stops the run before it measures anything).
    pub fn open(path: &Path, python: &str) -> Result<PyTorchSource> {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext {
            "py" => {
                if !path.is_file() {
                    bail!("--pytorch {}: no such file", path.display());
                }
                Ok(PyTorchSource::Script {
                    script: path.to_path_buf(),
                    python: python.to_string(),
                })
            }
            "jsonl" | "json" => Ok(PyTorchSource::Lines {
                path: path.to_path_buf(),
                runs: read_lines(path)?,
            }),
            _ => bail!(
                "--pytorch {}: expected ci/pytorch-train.py (a .py file to run) or the \
                 JSON lines of ci/train-compare.py --out (.jsonl or .json)",
                path.display()
            ),
        }
    }

    /// Whether this source runs PyTorch (which needs the GPU).
    pub fn runs_pytorch(&self) -> bool {
        matches!(self, PyTorchSource::Script { .. })
    }

    /// PyTorch's side of configuration `name` with flags `flags` (describing `config`)
    /// on the GPU `device` (`cuda:0`); with a script, also the run as a line of
    /// train-compare's `--out` (for `--out FILE`, so that a later run can read it back).
    pub fn run(
        &self,
        name: &str,
        flags: &str,
        config: &TrainConfig,
        device: &str,
    ) -> (PyTorchRun, Option<Value>) {
        match self {
            PyTorchSource::Script { script, python } => {
                let mut argv: Vec<String> = vec![script.display().to_string()];
                argv.extend(flags.split_whitespace().map(String::from));
                argv.extend(["--json", "--device", device].map(String::from));
                let mut line = match run_child(python, &argv, TIMEOUT) {
                    Ok(child) => child.into_line(),
                    Err(e) => serde_json::json!({"json": null, "error": format!("{e:#}")}),
                };
                let mut full = vec![python.clone()];
                full.extend(argv);
                line["argv"] = full.into();
                line["config"] = name.into();
                line["side"] = "pytorch".into();
                (from_line(&line, config), Some(line))
            }
            PyTorchSource::Lines { path, runs } => match runs.get(name) {
                None => (
                    PyTorchRun::failed(
                        "absent",
                        format!("{} has no PyTorch run named {name}", path.display()),
                    ),
                    None,
                ),
                Some(line) => (from_line(line, config), None),
            },
        }
    }
}

/// One line of train-compare's `--out`: `error` (null when the run finished) and the
/// driver's JSON under `json`.
fn from_line(line: &Value, config: &TrainConfig) -> PyTorchRun {
    if let Some(error) = line.get("error").and_then(Value::as_str) {
        let cell = match error {
            e if e.starts_with("OOM") => "OOM",
            e if e.starts_with("timed out") => "timeout",
            _ => "error",
        };
        let message = error.strip_prefix("OOM: ").unwrap_or(error);
        return PyTorchRun::failed(cell, first_line(message));
    }
    match line.get("json") {
        Some(report) if report.is_object() => PyTorchRun::from_report(report, config),
        _ => PyTorchRun::failed("error", "the line has no JSON report"),
    }
}

/// PyTorch's lines of a train-compare `--out` file (`"side": "pytorch"`), by
/// configuration name; a later line for a name replaces an earlier one.
fn read_lines(path: &Path) -> Result<HashMap<String, Value>> {
    let text = labs_core::input::read_report(path)
        .with_context(|| format!("reading PyTorch's runs from {}", path.display()))?;
    let mut runs = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).with_context(|| {
            format!(
                "{} line {}: not JSON (expected ci/train-compare.py --out's lines)",
                path.display(),
                i + 1
            )
        })?;
        let name = value.get("config").and_then(Value::as_str);
        let side = value.get("side").and_then(Value::as_str);
        match (name, side) {
            (Some(name), Some("pytorch")) => {
                runs.insert(name.to_string(), value);
            }
            (Some(_), Some(_)) => {}
            _ => bail!(
                "{} line {}: no \"config\" and \"side\" keys (expected ci/train-compare.py \
                 --out's lines)",
                path.display(),
                i + 1
            ),
        }
    }
    if runs.is_empty() {
        bail!("{}: no line has \"side\": \"pytorch\"", path.display());
    }
    Ok(runs)
}

/// What a child process left: its exit status (None: killed at the time limit) and
/// output.
struct ChildOutput {
    success: Option<bool>,
    stdout: String,
    stderr: String,
}

impl ChildOutput {
    /// The run as train-compare records it: the last JSON line of its output under
    /// `json`, and `error`: null when it ran to the end, `OOM: ...` when it ran out of
    /// memory, else what went wrong.
    fn into_line(self) -> Value {
        let report = self
            .stdout
            .lines()
            .rev()
            .filter(|l| l.trim_start().starts_with('{'))
            .find_map(|l| serde_json::from_str::<Value>(l).ok());
        let oom = (report.as_ref())
            .and_then(|r| r.get("oom"))
            .and_then(Value::as_str)
            .map(first_line);
        let error = match (self.success, &report, oom) {
            (None, _, _) => Some(format!("timed out after {} s", TIMEOUT.as_secs())),
            (Some(_), _, Some(oom)) => Some(format!("OOM: {oom}")),
            (Some(true), Some(_), None) => None,
            (Some(_), _, None) => {
                let why = (self.stderr.lines().rev())
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no output");
                Some(why.trim().to_string())
            }
        };
        serde_json::json!({
            "success": self.success,
            "json": report,
            "error": error,
            "stderr_tail": tail(&self.stderr, 2000),
        })
    }
}

/// The last `n` bytes of `text` or fewer, cut at a character boundary.
fn tail(text: &str, n: usize) -> &str {
    let mut start = text.len().saturating_sub(n);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Runs `program argv`, killing it after `timeout`.
fn run_child(program: &str, argv: &[String], timeout: Duration) -> Result<ChildOutput> {
    let mut child = Command::new(program)
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = r.read_to_string(&mut text);
            text
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let success = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status.success());
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok(ChildOutput {
        success,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny configuration the scripts below describe.
    fn tiny() -> TrainConfig {
        super::super::configs::configurations(super::super::configs::Scale::Tiny)[0]
            .train_config()
            .unwrap()
    }

    /// A stand-in for ci/pytorch-train.py: a Python script with `body`, removed when
    /// the test is done with it.
    struct Script {
        source: PyTorchSource,
        path: std::path::PathBuf,
    }

    impl std::ops::Deref for Script {
        type Target = PyTorchSource;
        fn deref(&self) -> &PyTorchSource {
            &self.source
        }
    }

    impl Drop for Script {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn script(name: &str, body: &str) -> Script {
        let path = std::env::temp_dir().join(format!("lab10-{name}-{}.py", std::process::id()));
        std::fs::write(&path, body).unwrap();
        Script {
            source: PyTorchSource::open(&path, "python3").unwrap(),
            path,
        }
    }

    fn config_json(c: &TrainConfig) -> String {
        serde_json::to_string(c).unwrap()
    }

    #[test]
    fn the_script_is_run_with_the_flags_and_its_last_json_line_read() {
        let c = tiny();
        let source = script(
            "ok",
            &format!(
                "import json, sys\n\
                 assert sys.argv[-3:] == ['--json', '--device', 'cuda:0'], sys.argv\n\
                 assert '--d-model' in sys.argv, sys.argv\n\
                 print('a warning')\n\
                 print(json.dumps({{'config': {}, 'peak_allocated': 3, 'peak_reserved': 4, \
                 'step_ms': 1.5}}))\n",
                config_json(&c)
                    .replace("true", "True")
                    .replace("false", "False")
                    .replace("null", "None")
            ),
        );
        let flags = "--model transformer --d-model 32";
        let (run, line) = source.run("tutorial-none", flags, &c, "cuda:0");
        let line = line.expect("a script's run is a line");
        assert_eq!(line["side"], "pytorch");
        assert_eq!(line["config"], "tutorial-none");
        assert!(line["error"].is_null(), "{line}");
        assert_eq!(
            run,
            PyTorchRun::Measured(PyTorchFigures {
                peak_allocated: 3,
                peak_reserved: 4,
                step_ms: Some(1.5),
                gemm_workspace: 0,
            })
        );
    }

    #[test]
    fn a_failed_script_is_a_cell_not_an_error() {
        let c = tiny();
        let oom = script(
            "oom",
            "import json, sys\nprint(json.dumps({'oom': 'CUDA out of memory. Tried'}))\nsys.exit(1)\n",
        );
        match oom.run("x", "", &c, "cuda:0").0 {
            PyTorchRun::Failed { cell, message } => {
                assert_eq!(cell, "OOM");
                assert!(message.contains("CUDA out of memory"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let crash = script("crash", "raise RuntimeError('boom')\n");
        match crash.run("x", "", &c, "cuda:0").0 {
            PyTorchRun::Failed { cell, message } => {
                assert_eq!(cell, "error");
                assert_eq!(message, "RuntimeError: boom");
            }
            other => panic!("{other:?}"),
        }
        let other = script(
            "other",
            "import json\nprint(json.dumps({'config': {'model': 'gpt2'}, 'peak_allocated': 1, \
             'peak_reserved': 1}))\n",
        );
        match other.run("x", "", &c, "cuda:0").0 {
            PyTorchRun::Failed { cell, message } => {
                assert_eq!(cell, "other config");
                assert!(
                    message.contains("model \"gpt2\" (ours \"transformer\")"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
