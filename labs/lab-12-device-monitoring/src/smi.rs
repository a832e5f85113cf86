//! `smi`: the device-wide view, like `nvidia-smi`. On a GPU the figures come from NVML
//! (the library nvidia-smi itself uses), which sees every process on the device, not
//! just this one; on the simulated GPU they are the simulator's own. The other
//! experiments read their NVML figures through the same [`Source`].

use labs_core::format::bytes;
use labs_core::table::Table;
use labs_core::{Device, DeviceId};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

/// One GPU's state at one moment. Figures a device cannot report are `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReport {
    pub index: u32,
    pub name: String,
    pub used: u64,
    pub total: u64,
    pub utilization_percent: Option<u32>,
    pub memory_utilization_percent: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    pub power_limit_w: Option<f64>,
    pub processes: Vec<ProcessReport>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessReport {
    pub pid: u32,
    pub name: String,
    pub used: Option<u64>,
}

/// Where the figures come from; opened once and sampled every `--loop` period.
pub enum Source {
    // Boxed: NVML's function table is large and a `Source` lives on the stack.
    Nvml { nvml: Box<Nvml>, only: Option<u32> },
    Sim(Device),
}

/// Why `smi` could not report.
#[derive(Debug, thiserror::Error)]
pub enum SmiError {
    #[error(
        "cannot load NVML (libnvidia-ml.so.1), which reads the GPU's state: {0}. \
         Is the NVIDIA driver installed? On a machine without one, try `--device sim`."
    )]
    NoNvml(String),
    #[error("NVML: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
    #[error("{0}")]
    Device(#[from] labs_core::Error),
    #[error("NVML's figures are a GPU's; {0} is the host (use --device cuda or --device sim)")]
    NotAGpu(DeviceId),
    #[error("NVML reported {0} GPUs where one was asked for")]
    NotOne(usize),
}

impl Source {
    /// The source for a device chosen by `select_device`. `only_named` restricts an
    /// NVML report to that GPU. NVML numbers GPUs in PCI order, as CUDA does unless
    /// `CUDA_VISIBLE_DEVICES` or `CUDA_DEVICE_ORDER` reorders them.
    pub fn for_device(device: &Device, only_named: bool) -> Result<Source, SmiError> {
        match device.id() {
            DeviceId::Cuda(ordinal) => Ok(Source::Nvml {
                nvml: Box::new(open_nvml()?),
                only: only_named.then_some(ordinal as u32),
            }),
            DeviceId::Sim(_) | DeviceId::Dry(_) => Ok(Source::Sim(device.clone())),
            DeviceId::Cpu => Err(SmiError::NotAGpu(device.id())),
        }
    }

    pub fn sample(&self) -> Result<Vec<GpuReport>, SmiError> {
        match self {
            Source::Nvml { nvml, only } => nvml_reports(nvml, *only),
            Source::Sim(d) => Ok(vec![sim_report(d)?]),
        }
    }

    /// One sample of the one GPU the source is restricted to (`for_device(d, true)`).
    pub fn sample_one(&self) -> Result<GpuReport, SmiError> {
        let mut reports = self.sample()?;
        match reports.len() {
            1 => Ok(reports.remove(0)),
            n => Err(SmiError::NotOne(n)),
        }
    }

    /// Whether the figures are the simulated GPU's model rather than NVML's.
    pub fn is_sim(&self) -> bool {
        matches!(self, Source::Sim(_))
    }
}

/// This process's line in a GPU's process table, found by its process id. `None` where
/// NVML does not list it: no context on that GPU yet, or (in a container) NVML lists
/// processes by ids from outside the container.
pub fn this_process(report: &GpuReport) -> Option<&ProcessReport> {
    let pid = std::process::id();
    report.processes.iter().find(|p| p.pid == pid)
}

/// NVML is loaded at run time, so a machine without the driver still runs the lab.
pub fn open_nvml() -> Result<Nvml, SmiError> {
    Nvml::init().map_err(|e| SmiError::NoNvml(e.to_string()))
}

// ANCHOR: nvml_sample
fn nvml_reports(nvml: &Nvml, only: Option<u32>) -> Result<Vec<GpuReport>, SmiError> {
    let count = nvml.device_count()?;
    let mut out = Vec::new();
    for index in (0..count).filter(|i| only.is_none_or(|o| o == *i)) {
        let d = nvml.device_by_index(index)?;
        let mem = d.memory_info()?;
        let util = d.utilization_rates().ok();
        let mut processes = Vec::new();
        let procs = d
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .chain(d.running_graphics_processes().unwrap_or_default());
        for p in procs {
            if processes.iter().any(|q: &ProcessReport| q.pid == p.pid) {
                continue;
            }
            processes.push(ProcessReport {
                pid: p.pid,
                name: nvml
                    .sys_process_name(p.pid, 64)
                    .or_else(|_| std::fs::read_to_string(format!("/proc/{}/comm", p.pid)))
                    .map(|n| n.trim().to_string())
                    .unwrap_or_else(|_| "?".into()),
                used: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            });
        }
        out.push(GpuReport {
            index,
            name: d.name()?,
            used: mem.used,
            total: mem.total,
            utilization_percent: util.as_ref().map(|u| u.gpu),
            memory_utilization_percent: util.as_ref().map(|u| u.memory),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_w: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
            power_limit_w: d.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
            processes,
        });
    }
    Ok(out)
}
// ANCHOR_END: nvml_sample

/// The simulated GPU's own figures: it has memory, but no clock, sensors or other
/// processes, so those stay empty rather than invented.
pub fn sim_report(device: &Device) -> Result<GpuReport, SmiError> {
    let props = device.properties()?;
    let mem = device.mem_info()?;
    let used = mem.total.saturating_sub(mem.free);
    Ok(GpuReport {
        index: match device.id() {
            DeviceId::Sim(i) | DeviceId::Dry(i) => i as u32,
            _ => 0,
        },
        name: props.name,
        used,
        total: mem.total,
        utilization_percent: None,
        memory_utilization_percent: None,
        temperature_c: None,
        power_w: None,
        power_limit_w: None,
        processes: if used > 0 {
            vec![ProcessReport {
                pid: std::process::id(),
                name: this_program(),
                used: Some(used),
            }]
        } else {
            Vec::new()
        },
    })
}

/// This program's name, as NVML names a process by its executable.
fn this_program() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "this process".into())
}

fn or_dash<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// The report as two tables, GPUs and processes, headed by `heading`.
pub fn tables(heading: &str, reports: &[GpuReport]) -> Vec<Table> {
    let mut gpus = Table::new(
        heading,
        &[
            "gpu",
            "name",
            "memory used",
            "total",
            "used %",
            "util",
            "mem util",
            "temp",
            "power",
        ],
    );
    let mut procs = Table::new("Processes", &["gpu", "pid", "name", "memory"]);
    for r in reports {
        let pct = if r.total > 0 {
            format!("{:.1}%", r.used as f64 * 100.0 / r.total as f64)
        } else {
            "-".into()
        };
        gpus.row([
            r.index.to_string(),
            r.name.clone(),
            bytes(r.used),
            bytes(r.total),
            pct,
            or_dash(r.utilization_percent, |u| format!("{u}%")),
            or_dash(r.memory_utilization_percent, |u| format!("{u}%")),
            or_dash(r.temperature_c, |t| format!("{t} °C")),
            match (r.power_w, r.power_limit_w) {
                (Some(p), Some(l)) => format!("{p:.0} W / {l:.0} W"),
                (Some(p), None) => format!("{p:.0} W"),
                _ => "-".into(),
            },
        ]);
        for p in &r.processes {
            procs.row([
                r.index.to_string(),
                p.pid.to_string(),
                p.name.clone(),
                or_dash(p.used, bytes),
            ]);
        }
    }
    vec![gpus, procs]
}

/// The reports as one JSON array (sizes in bytes, absent figures as null).
pub fn json(reports: &[GpuReport]) -> serde_json::Value {
    serde_json::Value::Array(
        reports
            .iter()
            .map(|r| {
                serde_json::json!({
                    "gpu": r.index,
                    "name": r.name,
                    "used": r.used,
                    "total": r.total,
                    "utilization_percent": r.utilization_percent,
                    "memory_utilization_percent": r.memory_utilization_percent,
                    "temperature_c": r.temperature_c,
                    "power_w": r.power_w,
                    "power_limit_w": r.power_limit_w,
                    "processes": r.processes.iter().map(|p| serde_json::json!({
                        "pid": p.pid,
                        "name": p.name,
                        "used": p.used,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}
