//! Experiment 4: how fast a tensor moves from one device to another, by each path. A
//! peer copy goes straight across NVLink or PCIe; a staged copy goes down to pinned
//! host memory and up again, chunk by chunk, so it crosses the host's bus twice. The
//! median of several copies of each size from 1 MiB to 1 GiB, in GB/s (10^9 bytes per
//! second), timed from the call to both devices being idle; and each path's last copy
//! compared with its source, bit for bit (on two GPUs, the check of the peer path).

use std::time::{Duration, Instant};

use labs_core::device::{CopyPath, CopyVia};
use labs_core::table::Table;
use labs_core::{Device, Result, Tensor};

/// One size: the path `to()` takes, each path's bandwidth (`None` for the peer path
/// where the devices have no peer access), and whether both paths' copies arrived bit
/// for bit.
#[derive(Debug, Clone)]
pub struct Row {
    pub bytes: usize,
    pub path: CopyPath,
    pub peer_gbps: Option<f64>,
    pub staged_gbps: f64,
    pub exact: bool,
}

/// 1 MiB to 1 GiB by factors of 4; up to 16 MiB with `quick`.
pub fn sizes(quick: bool) -> Vec<usize> {
    let top = if quick { 16 << 20 } else { 1 << 30 };
    std::iter::successors(Some(1usize << 20), |s| Some(s * 4))
        .take_while(|&s| s <= top)
        .collect()
}

/// What one path did: the median time, the path, and its last copy (to check).
struct Timed {
    median: Duration,
    path: CopyPath,
    last: Tensor,
}

/// The median time of `samples` copies of `x` to `dst` by `via`, after one copy that
/// warms up the path (the destination's cache, the pinned chunks).
fn time(x: &Tensor, dst: &Device, via: CopyVia, samples: usize) -> Result<Timed> {
    let idle = || -> Result<()> {
        x.device().synchronize()?;
        dst.synchronize()
    };
    let (mut last, path) = x.to_via(dst, via)?;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        drop(last);
        idle()?;
        let start = Instant::now();
        last = x.to_via(dst, via)?.0;
        idle()?;
        times.push(start.elapsed());
    }
    Ok(Timed {
        median: labs_core::timing::median(&mut times),
        path,
        last,
    })
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64().max(1e-9) / 1e9
}

pub fn measure(src: &Device, dst: &Device, sizes: &[usize], samples: usize) -> Result<Vec<Row>> {
    let peer = dst.can_access_peer(src)?;
    sizes
        .iter()
        .map(|&bytes| {
            let x = Tensor::randn(&[bytes / 4], bytes as u64, src)?;
            let n = if bytes >= 256 << 20 {
                samples.min(3)
            } else {
                samples
            };
            let staged = time(&x, dst, CopyVia::Staged, n)?;
            let auto = time(&x, dst, CopyVia::Any, n)?;
            let want = x.to_vec::<f32>()?;
            let exact = staged.last.to_vec::<f32>()? == want && auto.last.to_vec::<f32>()? == want;
            Ok(Row {
                bytes,
                path: auto.path,
                peer_gbps: peer.then(|| gbps(bytes, auto.median)),
                staged_gbps: gbps(bytes, staged.median),
                exact,
            })
        })
        .collect()
}

pub fn table(src: &Device, dst: &Device, rows: &[Row]) -> Table {
    let note = if src.is_cuda() {
        ""
    } else {
        " (simulated: the times mean nothing)"
    };
    let mut t = Table::new(
        format!("4. Copy bandwidth from {src} to {dst}, GB/s, median{note}"),
        &[
            "size MiB",
            "to() takes",
            "peer",
            "staged via pinned host",
            "copies exact",
        ],
    );
    for r in rows {
        t.row([
            format!("{}", r.bytes >> 20),
            r.path.to_string(),
            r.peer_gbps
                .map_or("- (no peer access)".to_string(), |g| format!("{g:.2}")),
            format!("{:.2}", r.staged_gbps),
            if r.exact { "yes" } else { "NO" }.to_string(),
        ]);
    }
    t
}
