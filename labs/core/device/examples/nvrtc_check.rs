//! Compiles every CUDA module of the op layer with NVRTC, for each GPU architecture
//! named (default: compute_80 and compute_90), and checks that each defines the
//! functions the op layer launches. Needs NVRTC (libnvrtc.so on the library path), not
//! a GPU: CI runs it with the library from PyPI's `nvidia-cuda-nvrtc`.
//!
//!   cargo run --release -p labs-device --example nvrtc_check [-- compute_90 ...]

use std::process::ExitCode;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use labs_device::kernels::source;

fn main() -> ExitCode {
    let mut archs: Vec<String> = std::env::args().skip(1).collect();
    if archs.is_empty() {
        archs = vec!["compute_80".into(), "compute_90".into()];
    }
    // SAFETY: only probes for the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("nvrtc_check: NVRTC (libnvrtc.so) was not found on the library path");
        return ExitCode::FAILURE;
    }
    let mut failed = 0;
    let modules = source::modules();
    for arch in &archs {
        for m in modules {
            let opts = CompileOptions {
                options: vec![format!("--gpu-architecture={arch}")],
                ..Default::default()
            };
            match compile_ptx_with_opts(&m.source, opts) {
                Ok(ptx) => {
                    let ptx = ptx.to_src();
                    let missing: Vec<&String> = (m.functions.iter())
                        .filter(|f| !ptx.contains(f.as_str()))
                        .collect();
                    if !missing.is_empty() {
                        failed += 1;
                        eprintln!("{} ({arch}): no {missing:?} in the PTX", m.name);
                    }
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("{} ({arch}) does not compile: {e}", m.name);
                }
            }
        }
    }
    println!(
        "nvrtc_check: {} modules x {} architectures ({}): {} failed",
        modules.len(),
        archs.len(),
        archs.join(", "),
        failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
