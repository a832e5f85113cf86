//! The device the test suites run on. `LABS_DEVICE=cuda` runs every test on the GPU (a
//! missing GPU is then a failure, never a skip); unset, tests use the simulated GPU.
//! Also the counting of a test's kernel launches.

use crate::device::profile::{self, KernelTime};
use crate::device::{Device, DeviceId, ENV_DEVICE};

/// The device under test, with its matrix products' workspace already lent (on a GPU,
/// 32 MiB of its allocator from the first product on, as in PyTorch): a test that
/// measures what an op allocates measures the op, whichever test ran the process's
/// first product.
pub fn test_device() -> Device {
    let id: DeviceId = match std::env::var(ENV_DEVICE) {
        Ok(v) if !v.trim().is_empty() => v
            .parse()
            .unwrap_or_else(|e| panic!("{ENV_DEVICE}={v}: {e}")),
        _ => DeviceId::Sim(0),
    };
    let device =
        Device::get(id).unwrap_or_else(|e| panic!("the device under test, {id}, is unusable: {e}"));
    if device.allocator().is_ok() {
        device
            .ensure_gemm_workspace()
            .unwrap_or_else(|e| panic!("{id}: the matrix products' workspace: {e}"));
    }
    device
}

/// The kernel launches `f` makes on `device`, a row per label (the device synchronised
/// before and after, so that the rows are `f`'s own), with what `f` returned. The
/// profiler is process-wide: a suite that counts launches runs such tests one at a time.
pub fn launches<T>(device: &Device, f: impl FnOnce() -> T) -> (T, Vec<KernelTime>) {
    device.synchronize().unwrap();
    profile::take().unwrap();
    profile::start();
    let out = f();
    device.synchronize().unwrap();
    profile::stop();
    (out, profile::take().unwrap())
}

/// The launches among `rows` whose label contains `needle`.
pub fn launch_count(rows: &[KernelTime], needle: &str) -> u64 {
    (rows.iter())
        .filter(|l| l.label.contains(needle))
        .map(|l| l.launches)
        .sum()
}
