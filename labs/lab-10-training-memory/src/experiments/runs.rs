//! One configuration measured three ways: predicted by the dry run on a dry device of
//! the device's capacity, trained on the device, and (when asked) run by PyTorch on the
//! same GPU after ours, our cache emptied first so that the two never share the memory.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use labs_core::Device;
use serde_json::json;

use super::configs::{Configuration, Family};
use super::pytorch::{PyTorchRun, PyTorchSource};
use labs_train::{TrainConfig, TrainReport};

/// The dry run's prediction.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Whether the run fits the device: the dry run at its capacity ran to the end.
    pub fits: bool,
}

/// Everything measured for one configuration.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub configuration: Configuration,
    pub config: TrainConfig,
    pub predicted: Prediction,
    /// Our run; `None` when the prediction said it does not fit (not run) or the run
    /// failed (`ours_error`).
    pub ours: Option<TrainReport>,
    /// Why our run failed, for an error other than out-of-memory.
    pub ours_error: Option<String>,
    /// PyTorch's; `None` when not measured in this run.
    pub pytorch: Option<PyTorchRun>,
}

impl Measurement {
    /// Our figures, when our run finished.
    pub fn ours_done(&self) -> Option<&TrainReport> {
        self.ours.as_ref().filter(|r| r.oom.is_none())
    }
}

/// Runs configurations on one device, writing every run's JSON to `out` (train-compare's
/// `--out` lines) when asked.
pub struct Runner<'a> {
    pub device: &'a Device,
    /// The dry device's size: the device's memory.
    pub capacity: u64,
    pub pytorch: Option<&'a PyTorchSource>,
    /// Record the last step's memory by category in the tutorial's runs (section 4's
    /// pictures).
    pub pictures: bool,
    pub out: Option<(PathBuf, std::fs::File)>,
    pub bar: ProgressBar,
}

impl Runner<'_> {
    /// `configuration` predicted, then run by us (unless it does not fit), then by
    /// PyTorch when `with_pytorch`.
    pub fn measure(&mut self, c: &Configuration, with_pytorch: bool) -> Result<Measurement> {
        let mut config = c.train_config()?;
        config.timeline = self.pictures && c.family == Family::Tutorial;
        self.bar.set_message(c.name.clone());
        let predicted = self.predict(c, &config)?;
        let mut ours_error = None;
        let ours = if predicted.fits {
            // An error other than out-of-memory is a row that says so, not the end of
            // every other configuration's figures.
            let report = match labs_train::run(&config, self.device) {
                Ok(report) => {
                    self.write(c, "ours", &report)?;
                    Some(report)
                }
                Err(e) => {
                    ours_error = Some(format!("{e:#}"));
                    None
                }
            };
            // PyTorch's run, or the next configuration, starts from an empty cache.
            self.device.allocator()?.empty_cache()?;
            report
        } else {
            None
        };
        let pytorch = match self.pytorch.filter(|_| with_pytorch) {
            Some(source) => {
                let (run, line) = source.run(&c.name, &c.flags, &config, &self.device.to_string());
                if let Some(line) = line {
                    self.write_line(&line)?;
                }
                Some(run)
            }
            None => None,
        };
        self.bar.inc(1);
        Ok(Measurement {
            configuration: c.clone(),
            config,
            predicted,
            ours,
            ours_error,
            pytorch,
        })
    }

    // ANCHOR: dry_run_prediction
    /// The dry run at the device's capacity; when it runs out of memory, again on a
    /// device eight times as large, for the peak it would need.
    fn predict(&mut self, c: &Configuration, config: &TrainConfig) -> Result<Prediction> {
        let dry = TrainConfig {
            timeline: false,
            ..config.clone()
        };
        let report = labs_train::run(&dry, &self.device.dry_twin(self.capacity)?)?;
        self.write(c, "ours-dry", &report)?;
        if report.oom.is_none() {
            return Ok(Prediction {
                peak_allocated: report.peak_allocated,
                peak_reserved: report.peak_reserved,
                fits: true,
            });
        }
        let larger = labs_train::run(
            &dry,
            &self.device.dry_twin(self.capacity.saturating_mul(8))?,
        )?;
        Ok(Prediction {
            peak_allocated: larger.peak_allocated,
            peak_reserved: larger.peak_reserved,
            fits: false,
        })
    }
    // ANCHOR_END: dry_run_prediction

    /// One line of train-compare's `--out` format for a run of ours.
    fn write(&mut self, c: &Configuration, side: &str, report: &TrainReport) -> Result<()> {
        let Some((path, file)) = &mut self.out else {
            return Ok(());
        };
        let device = match side {
            "ours-dry" => "dry".to_string(),
            _ => report.device.clone(),
        };
        let mut argv = vec!["lab-10".to_string(), "train".to_string()];
        argv.extend(c.flags.split_whitespace().map(String::from));
        argv.extend(["--json".to_string(), "--device".to_string(), device]);
        let line = json!({
            "config": c.name,
            "side": side,
            "argv": argv,
            "json": report,
            "error": report.oom.as_ref().map(|m| format!("OOM: {}", m.lines().next().unwrap_or(""))),
        });
        writeln!(file, "{line}").with_context(|| format!("writing {}", path.display()))
    }

    /// A line made elsewhere (PyTorch's run), as is.
    fn write_line(&mut self, line: &serde_json::Value) -> Result<()> {
        let Some((path, file)) = &mut self.out else {
            return Ok(());
        };
        writeln!(file, "{line}").with_context(|| format!("writing {}", path.display()))
    }
}
