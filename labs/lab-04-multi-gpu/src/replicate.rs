//! Experiment 5: the memory of DataParallel-style replication. A two-layer model's
//! parameters live on the first device and are broadcast to every device; the batch,
//! made on the first device, is scattered in chunks; each device runs its chunk; the
//! outputs are gathered back on the first device. Every device then holds a whole copy
//! of the parameters, and the first holds more: the whole batch, and the whole output
//! on top of its own share. That imbalance is one reason `DistributedDataParallel`
//! (one process per GPU, each with its own batch) replaced `DataParallel`.

use labs_core::table::Table;
use labs_core::tensor::no_grad;
use labs_core::{Device, Result, Tensor};

use crate::exercises::{gather, scatter};

/// The model, `y = relu(x W1ᵀ + b1) W2ᵀ + b2`, and the batch.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub width: usize,
    pub hidden: usize,
    pub batch: usize,
}

impl Sizes {
    /// 2048 wide, hidden 8192 (128 MiB of parameters), 4096 rows per GPU on GPUs; 256
    /// wide and 512 rows per device on simulated ones and with `quick`.
    pub fn for_devices(devices: &[Device], quick: bool) -> Sizes {
        let n = devices.len();
        if devices[0].is_cuda() && !quick {
            Sizes {
                width: 2048,
                hidden: 8192,
                batch: 4096 * n,
            }
        } else {
            Sizes {
                width: 256,
                hidden: 1024,
                batch: 512 * n,
            }
        }
    }
}

/// One device's share.
#[derive(Debug, Clone)]
pub struct Row {
    pub device: String,
    pub parameters: u64,
    pub input: u64,
    /// The most allocated at once during the step, above what was allocated before it.
    pub peak: u64,
}

fn parameters(s: Sizes, device: &Device) -> Result<Vec<Tensor>> {
    let init = |shape: &[usize], seed| Tensor::randn(shape, seed, device)?.scale(0.02);
    Ok(vec![
        init(&[s.hidden, s.width], 1)?,
        init(&[s.hidden], 2)?,
        init(&[s.width, s.hidden], 3)?,
        init(&[s.width], 4)?,
    ])
}

fn forward(p: &[Tensor], x: &Tensor) -> Result<Tensor> {
    let h = x.matmul(&p[0].transpose(0, 1)?)?.add(&p[1])?.relu()?;
    h.matmul(&p[2].transpose(0, 1)?)?.add(&p[3])
}

// ANCHOR: replicate
/// One forward step, DataParallel's way, on `devices` (the first is the one the model
/// and the batch start on); the output, gathered on the first device, and each
/// device's share.
pub fn measure(devices: &[Device], s: Sizes) -> Result<(Tensor, Vec<Row>)> {
    let _no_grad = no_grad();
    let mut before = Vec::new();
    for d in devices {
        let a = d.allocator()?;
        a.reset_peak_memory_stats();
        before.push(a.memory_allocated());
    }
    let home = &devices[0];
    let params = parameters(s, home)?;
    let batch = Tensor::randn(&[s.batch, s.width], 5, home)?;
    // Broadcast: a whole copy of every parameter on every device.
    let replicas = devices
        .iter()
        .map(|d| params.iter().map(|p| p.to(d)).collect::<Result<Vec<_>>>())
        .collect::<Result<Vec<_>>>()?;
    let shards = scatter(&batch, devices)?;
    let outputs = replicas
        .iter()
        .zip(&shards)
        .map(|(p, x)| forward(p, x))
        .collect::<Result<Vec<_>>>()?;
    let output = gather(&outputs, home)?;
    let mut rows = Vec::new();
    for ((d, base), (p, x)) in devices.iter().zip(before).zip(replicas.iter().zip(&shards)) {
        d.synchronize()?;
        rows.push(Row {
            device: d.id().to_string(),
            parameters: p.iter().map(|t| t.nbytes() as u64).sum(),
            input: x.nbytes() as u64,
            peak: d.allocator()?.max_memory_allocated().saturating_sub(base),
        });
    }
    Ok((output, rows))
}
// ANCHOR_END: replicate

/// The same step on the first device alone, for the check that replication computes
/// what one device does.
pub fn reference(device: &Device, s: Sizes) -> Result<Tensor> {
    let _no_grad = no_grad();
    let params = parameters(s, device)?;
    let batch = Tensor::randn(&[s.batch, s.width], 5, device)?;
    forward(&params, &batch)
}

pub fn table(s: Sizes, rows: &[Row]) -> Table {
    let mut t = Table::new(
        format!(
            "5. DataParallel-style replication (MiB): a {}x{}x{} model broadcast from {}, a \
             batch of {} scattered, outputs gathered back",
            s.width,
            s.hidden,
            s.width,
            rows.first().map_or("", |r| r.device.as_str()),
            s.batch
        ),
        &["device", "parameters", "batch share", "peak allocated"],
    );
    for r in rows {
        t.row([
            r.device.clone(),
            crate::mib(r.parameters),
            crate::mib(r.input),
            crate::mib(r.peak),
        ]);
    }
    t
}
