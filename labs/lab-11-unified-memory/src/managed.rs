//! Managed (unified) memory: one address for host and device, pages that move to where
//! they are touched or where a prefetch sends them, and advice that keeps them in place.
//! Then requests beyond the device: managed memory past what is free, device memory past
//! what the card has.

use std::time::Duration;

use labs_core::backend::{ManagedAdvice, MemLocation};
use labs_core::format::{bytes, duration};
use labs_core::kernels::Kernel;
use labs_core::table::Table;
use labs_core::timing::median;
use labs_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::mapped::{check_output, timed, value};
use crate::{as_ms, gbps};

/// The managed buffer's size by default: as [`crate::mapped::default_size`].
pub fn default_size(device: &Device, quick: bool) -> usize {
    crate::mapped::default_size(device, quick)
}

/// The device memory the experiment takes at the input's size: the managed buffer
/// (while on the device) and the kernel's output.
pub const DEVICE_BUFFERS: usize = 2;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ManagedRead {
    pub bytes: usize,
    /// Timed runs of each way (the times are medians).
    pub samples: usize,
    #[serde(rename = "pages_on_host_ms", serialize_with = "as_ms")]
    pub pages_on_host: Duration,
    #[serde(rename = "prefetched_ms", serialize_with = "as_ms")]
    pub prefetched: Duration,
    #[serde(rename = "preferred_host_ms", serialize_with = "as_ms")]
    pub preferred_host: Duration,
}

// ANCHOR: managed_read
/// `out = 2 * x` over `size` bytes of managed memory: with every page on the host when
/// the kernel starts (it faults them over), after a prefetch to the device, and with the
/// host as the pages' preferred location (the device then maps them instead of moving
/// them). The data is checked after each, and read back through the managed pointer.
pub fn measure(device: &Device, size: usize, samples: usize) -> anyhow::Result<ManagedRead> {
    let n = size / 4;
    let backend = device.backend();
    let stream = device.new_stream()?;
    let out = Tensor::zeros(&[n], DType::F32, device)?;
    device.synchronize()?;
    let input: Vec<u8> = (0..n).flat_map(|i| value(i).to_ne_bytes()).collect();
    // Never more managed memory than is free: the backend refuses it.
    let managed = backend.managed_alloc(size)?;
    let result = (|| -> anyhow::Result<ManagedRead> {
        backend.copy_htod(managed, &input, &stream)?;
        let scale = Kernel::scale(managed, 2.0, out.ptr(), n);
        let to = |place| backend.managed_prefetch(managed, size, place, &stream);
        let run = || backend.launch(&scale, &stream);
        let (mut on_host, mut prefetched, mut preferred) = (vec![], vec![], vec![]);
        // One untimed round first: the first launch compiles the kernel.
        for round in 0..=samples.max(1) {
            to(MemLocation::Host)?;
            let t = timed(device, &stream, run)?;
            if round == 0 {
                check_output(&out, 2.0, "the kernel reading managed memory")?;
                out.zero_()?;
                device.synchronize()?;
            } else {
                on_host.push(t);
            }
            to(MemLocation::Host)?;
            to(MemLocation::Device)?;
            let t = timed(device, &stream, run)?;
            if round > 0 {
                prefetched.push(t);
            }
        }
        check_output(&out, 2.0, "the kernel reading prefetched managed memory")?;
        backend.managed_advise(
            managed,
            size,
            ManagedAdvice::PreferredLocation(MemLocation::Host),
        )?;
        for _ in 0..samples.max(1) {
            to(MemLocation::Host)?;
            preferred.push(timed(device, &stream, run)?);
        }
        check_output(
            &out,
            2.0,
            "the kernel reading managed memory kept on the host",
        )?;
        // The pages went back and forth: the host reads through the same pointer.
        let mut back = vec![0u8; size];
        backend.copy_dtoh(&mut back, managed, &stream)?;
        anyhow::ensure!(back == input, "managed memory lost its data on the way");
        Ok(ManagedRead {
            bytes: size,
            samples: samples.max(1),
            pages_on_host: median(&mut on_host),
            prefetched: median(&mut prefetched),
            preferred_host: median(&mut preferred),
        })
    })();
    let freed = stream
        .synchronize()
        .and_then(|()| backend.managed_free(managed));
    let read = result?;
    freed?;
    Ok(read)
}
// ANCHOR_END: managed_read

pub fn table(device: &Device, m: &ManagedRead) -> Table {
    let mut t = Table::new(
        format!(
            "Managed memory: a kernel reading {} on {device} (median of {})",
            bytes(m.bytes as u64),
            m.samples
        ),
        &["pages", "time", "GB/s"],
    );
    for (name, d) in [
        ("on the host, faulted over", m.pages_on_host),
        ("prefetched to the device", m.prefetched),
        ("preferred location: the host", m.preferred_host),
    ] {
        t.row([
            name.to_string(),
            duration(d),
            format!("{:.1}", gbps(m.bytes, d)),
        ]);
    }
    t
}

/// What the simulated GPU models of managed memory.
pub const SIM: &str = "host and device share one memory: a first touch faults no page, a \
prefetch moves none and advice changes nothing, so the three rows time the same kernel on the \
same memory; page migration is not modelled";

/// A request beyond the device, and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub what: &'static str,
    /// Managed memory (`cuMemAllocManaged`), or device memory (`cuMemAlloc`).
    pub managed: bool,
    pub bytes: u64,
    /// The error, or `None` when the memory was served (and given back at once).
    pub refused: Option<String>,
}

// ANCHOR: beyond_device
/// Managed memory of one and a half times what is free, and device memory of one and a
/// half times the card. On Linux the driver would oversubscribe the first (and evict
/// pages for as long as a kernel sweeps it); the labs' backend refuses it. The second
/// has no fallback into host memory: it fails.
pub fn beyond_device(device: &Device) -> anyhow::Result<Vec<Request>> {
    let backend = device.backend();
    let info = device.mem_info()?;
    let mut out = Vec::new();
    for (what, bytes, managed) in [
        ("managed, 1.5 x free", info.free + info.free / 2, true),
        ("device, 1.5 x total", info.total + info.total / 2, false),
    ] {
        let got = if managed {
            backend.managed_alloc(bytes as usize)
        } else {
            backend.raw_alloc(bytes as usize)
        };
        let refused = match got {
            Ok(p) if managed => backend.managed_free(p).map(|()| None)?,
            Ok(p) => backend.raw_free(p).map(|()| None)?,
            Err(e) if e.is_out_of_memory() => Some(e.to_string()),
            Err(e) => return Err(e.into()),
        };
        out.push(Request {
            what,
            managed,
            bytes,
            refused,
        });
    }
    Ok(out)
}
// ANCHOR_END: beyond_device

pub fn beyond_table(device: &Device, rows: &[Request]) -> Table {
    let mut t = Table::new(
        format!("Asking {device} for more than it has"),
        &["request", "size", "result"],
    );
    for r in rows {
        t.row([
            r.what.to_string(),
            bytes(r.bytes),
            match (&r.refused, r.managed) {
                (None, _) => "served",
                (Some(_), true) => "refused: the labs do not oversubscribe",
                (Some(_), false) => "out of memory: no fallback to host memory",
            }
            .to_string(),
        ]);
    }
    t
}

/// What the simulated GPU models of requests beyond the device.
pub const BEYOND_SIM: &str = "the same rules as on a GPU under Linux: the backend refuses \
managed memory beyond what is free, and device memory ends at the simulated capacity \
(LABS_SIM_CAPACITY) with nothing behind it";
