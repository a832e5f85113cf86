//! Experiment 6: two processes sharing one GPU, each capped with a memory fraction of
//! 0.4 (`torch.cuda.set_per_process_memory_fraction(0.4)`). Each child fills its share
//! with tensors until its own allocator refuses, holds them while the other does the
//! same, and reports: the refusal is its own cap's (the error names the fraction), and
//! neither process takes memory the other needed.

use std::process::Command;
use std::time::Duration;

use labs_core::format::bytes;
use labs_core::{DType, Device, Result, Tensor};

pub const FRACTION: f64 = 0.4;

/// What one child printed, and how it ended.
pub struct Child {
    pub index: usize,
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

// ANCHOR: share_parent
/// Starts two children of this program (`lab-05 share-child`), at once, and waits for
/// both.
pub fn run_children(device_flag: Option<&str>, hold: Duration) -> std::io::Result<Vec<Child>> {
    let exe = std::env::current_exe()?;
    let mut running = Vec::new();
    for index in 0..2 {
        let mut cmd = Command::new(&exe);
        cmd.args(["share-child", "--index", &index.to_string()])
            .args(["--fraction", &FRACTION.to_string()])
            .args(["--hold-ms", &hold.as_millis().to_string()]);
        if let Some(d) = device_flag {
            cmd.args(["--device", d]);
        }
        let spawned = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        running.push((index, spawned));
    }
    let mut children = Vec::new();
    for (index, child) in running {
        let out = child.wait_with_output()?;
        children.push(Child {
            index,
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(children)
}
// ANCHOR_END: share_parent

// ANCHOR: share_child
/// One child: cap this process at `fraction`, fill the share with tensors of a
/// fortieth of the device each until the cap refuses, hold them, report.
pub fn child(device: &Device, index: usize, fraction: f64, hold: Duration) -> Result<()> {
    let alloc = device.allocator()?;
    alloc.set_memory_fraction(fraction)?;
    let total = device.mem_info()?.total;
    let elements = (total / 40 / 4) as usize;
    let mut held = Vec::new();
    let refusal = loop {
        match Tensor::empty(&[elements], DType::F32, device) {
            Ok(t) => held.push(t),
            Err(e) if e.is_out_of_memory() => break e,
            Err(e) => return Err(e),
        }
    };
    device.synchronize()?;
    let reserved = alloc.memory_reserved();
    std::thread::sleep(hold); // the other child fills its share meanwhile
    let free_while_holding = device.mem_info()?.free;
    // ANCHOR_END: share_child
    println!(
        "child {index}: held {} tensors, {} reserved of its limit {} ({} of {})",
        held.len(),
        bytes(reserved),
        bytes((total as f64 * fraction) as u64),
        fraction,
        bytes(total)
    );
    println!(
        "child {index}: the device's free memory while holding: {}",
        bytes(free_while_holding)
    );
    let text = refusal.to_string();
    let named = text.contains("The memory fraction");
    println!("child {index}: its refusal names the fraction: {named}");
    println!(
        "child {index}: {}",
        text.split(". Of the allocated").next().unwrap_or(&text)
    );
    drop(held);
    Ok(())
}

pub fn print(device_name: &str, children: &[Child]) {
    println!(
        "6. Two processes sharing one device, each with a memory fraction of {FRACTION}, on {device_name}\n"
    );
    for c in children {
        print!("{}", c.stdout);
        if !c.stderr.trim().is_empty() {
            for line in c.stderr.lines() {
                println!("child {} (stderr): {line}", c.index);
            }
        }
    }
    let ok = children.iter().filter(|c| c.success).count();
    println!(
        "\n{ok} of {} children finished without error.",
        children.len()
    );
}
