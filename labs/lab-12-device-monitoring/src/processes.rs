//! `processes`: which process holds what. This process holds a tensor; on a GPU a child
//! (this program's hidden `hold` command) holds another; NVML's process table is then
//! read, each process found by its id, and each line set beside that process's own
//! `memory_reserved()`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use labs_core::format::bytes;
use labs_core::table::Table;
use labs_core::{DType, Device, Tensor};

use crate::smi::Source;

/// A second process to start: this program's `hold` command, on the same device.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// This program's executable.
    pub exe: PathBuf,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The tensor this process holds.
    pub bytes: u64,
    pub child: Option<ChildSpec>,
}

impl Options {
    /// 1 GiB on a GPU, as the chapter's PyTorch program, and a child holding half of
    /// that; 64 MiB on the simulated GPU, which is this process's alone (no child).
    pub fn for_device(device: &Device, exe: Option<PathBuf>) -> Options {
        if device.is_cuda() {
            Options {
                bytes: 1 << 30,
                child: exe.map(|exe| ChildSpec {
                    exe,
                    bytes: 512 << 20,
                }),
            }
        } else {
            Options {
                bytes: 64 << 20,
                child: None,
            }
        }
    }
}

/// One line of NVML's process table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub pid: u32,
    pub name: String,
    /// NVML's figure (`None` where NVML cannot report it).
    pub used: Option<u64>,
    /// "this process", "the child", or empty for a process this program did not start.
    pub who: &'static str,
    /// That process's own `memory_reserved()`, where it is this program's.
    pub reserved: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Processes {
    pub device: String,
    pub pid: u32,
    pub bytes: u64,
    /// The child's id and the bytes it held, where one ran.
    pub child: Option<(u32, u64)>,
    pub entries: Vec<Entry>,
    pub device_used: u64,
    pub device_total: u64,
    pub real_gpu: bool,
}

impl Processes {
    /// This process's line, found by its id.
    pub fn this(&self) -> Option<&Entry> {
        self.entries.iter().find(|e| e.pid == self.pid)
    }
}

/// A running `hold` child; ended (its standard input closed, then waited for) on drop.
struct Held {
    child: Child,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        if self.child.wait().is_err() {
            let _ = self.child.kill();
        }
    }
}

/// Starts the child and waits for it to hold its memory: it prints `ready RESERVED`.
fn start_child(device: &Device, spec: &ChildSpec) -> anyhow::Result<(Held, u64)> {
    let mut child = Command::new(&spec.exe)
        .args(["hold", "--device", &device.to_string(), "--bytes"])
        .arg(spec.bytes.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", spec.exe.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let held = Held { child };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .context("the child holding memory did not say it was ready within 120 s")?;
    match line.trim().strip_prefix("ready ").map(str::parse::<u64>) {
        Some(Ok(reserved)) => Ok((held, reserved)),
        _ => {
            drop(held);
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            bail!(
                "the child holding memory failed: {}",
                err.lines().last().unwrap_or(line.trim())
            )
        }
    }
}

// ANCHOR: hold
/// The child's side (`lab-12 hold`): holds `bytes` in a tensor, says so with its
/// `memory_reserved()`, and keeps it until its standard input closes.
pub fn hold(device: &Device, bytes: u64) -> anyhow::Result<()> {
    let t = Tensor::zeros(&[(bytes / 4) as usize], DType::F32, device)?;
    device.synchronize()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", device.allocator()?.memory_reserved())?;
    out.flush()?;
    drop(out);
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(t);
    Ok(())
}
// ANCHOR_END: hold

// ANCHOR: processes
/// Holds the memory, reads NVML's process table once, and lets go.
pub fn run(device: &Device, source: &Source, options: &Options) -> anyhow::Result<Processes> {
    let allocator = device.allocator()?;
    allocator.empty_cache()?;
    let held = Tensor::zeros(&[(options.bytes / 4) as usize], DType::F32, device)?;
    device.synchronize()?;
    let reserved = allocator.memory_reserved();
    let child = match &options.child {
        Some(spec) => Some(start_child(device, spec)?),
        None => None,
    };
    let report = source.sample_one()?;
    let pid = std::process::id();
    let child_pid = child.as_ref().map(|(c, _)| c.child.id());
    let entries = report
        .processes
        .iter()
        .map(|p| {
            let (who, reserved) = if p.pid == pid {
                ("this process", Some(reserved))
            } else if Some(p.pid) == child_pid {
                ("the child", child.as_ref().map(|(_, r)| *r))
            } else {
                ("", None)
            };
            Entry {
                pid: p.pid,
                name: p.name.clone(),
                used: p.used,
                who,
                reserved,
            }
        })
        .collect();
    drop(child);
    drop(held);
    allocator.empty_cache()?;
    Ok(Processes {
        device: device.to_string(),
        pid,
        bytes: options.bytes,
        child: child_pid.zip(options.child.as_ref().map(|c| c.bytes)),
        entries,
        device_used: report.used,
        device_total: report.total,
        real_gpu: device.is_cuda(),
    })
}
// ANCHOR_END: processes

fn or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), bytes)
}

pub fn print(p: &Processes) {
    let child = match p.child {
        Some((pid, b)) => format!(", its child (pid {pid}) a tensor of {}", bytes(b)),
        None => String::new(),
    };
    println!(
        "4. Which process holds what on {}: this process (pid {}) holds a tensor of {}{child}",
        p.device,
        p.pid,
        bytes(p.bytes)
    );
    let mut t = Table::new(
        "NVML's process table, each line beside the process's own allocator",
        &[
            "pid",
            "name",
            "NVML: memory",
            "who",
            "memory_reserved",
            "NVML - reserved",
        ],
    );
    for e in &p.entries {
        t.row([
            e.pid.to_string(),
            e.name.clone(),
            or_dash(e.used),
            e.who.to_string(),
            or_dash(e.reserved),
            or_dash(e.used.zip(e.reserved).and_then(|(u, r)| u.checked_sub(r))),
        ]);
    }
    println!("{t}");
    let listed: u64 = p.entries.iter().filter_map(|e| e.used).sum();
    let mut d = Table::new("The device", &["figure", "value"]);
    d.row(["NVML: device used".to_string(), bytes(p.device_used)]);
    d.row(["the processes' lines, summed".to_string(), bytes(listed)]);
    d.row([
        "used beyond the processes' lines".to_string(),
        or_dash(p.device_used.checked_sub(listed)),
    ]);
    d.row(["NVML: total".to_string(), bytes(p.device_total)]);
    println!("{d}");
    if !p.real_gpu {
        println!(
            "(the simulated GPU is this process's alone and has no context: its one line \
             is its memory_reserved, to the byte; other processes, and the context in each \
             line, show on a GPU)"
        );
    } else if p.this().is_none() {
        println!(
            "(this process, pid {}, is not in NVML's process table: inside a container NVML \
             may list processes by their ids outside it)",
            p.pid
        );
    }
    println!();
}

pub fn json(p: &Processes) -> serde_json::Value {
    serde_json::json!({
        "device": p.device,
        "pid": p.pid,
        "bytes": p.bytes,
        "child_pid": p.child.map(|c| c.0),
        "child_bytes": p.child.map(|c| c.1),
        "device_used": p.device_used,
        "device_total": p.device_total,
        "real_gpu": p.real_gpu,
        "processes": p.entries.iter().map(|e| serde_json::json!({
            "pid": e.pid,
            "name": e.name,
            "used": e.used,
            "who": e.who,
            "reserved": e.reserved,
        })).collect::<Vec<_>>(),
    })
}
