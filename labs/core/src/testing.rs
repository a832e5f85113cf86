//! What the test suites share: the device they run on. `LABS_DEVICE=cuda` runs every
//! test on the GPU (a missing GPU is then a failure, never a skip); unset, tests use
//! the simulated GPU.

use crate::device::{Device, DeviceId, ENV_DEVICE};

/// The device under test.
pub fn test_device() -> Device {
    let id: DeviceId = match std::env::var(ENV_DEVICE) {
        Ok(v) if !v.trim().is_empty() => v
            .parse()
            .unwrap_or_else(|e| panic!("{ENV_DEVICE}={v}: {e}")),
        _ => DeviceId::Sim(0),
    };
    Device::get(id).unwrap_or_else(|e| panic!("the device under test, {id}, is unusable: {e}"))
}

/// Where the shared test data (allocation traces, snapshots) lives: `LABS_SHARED_DIR`,
/// else `../shared` beside the workspace.
pub fn shared_dir() -> std::path::PathBuf {
    match std::env::var("LABS_SHARED_DIR") {
        Ok(d) => d.into(),
        Err(_) => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}
