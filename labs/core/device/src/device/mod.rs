//! The device registry: one handle type over the backends (`cuda`, `sim`, `dry`, `cpu`),
//! each device created once per process and owning its caching allocator, and the
//! selection rule every lab uses; how many devices of each kind there are, the thread's
//! current device, copies between two devices, and the communicators a device joins
//! groups with. It sits above the backends and the allocator: it is the one place that
//! builds them.

mod collectives;
mod count;
mod current;
mod current_stream;
mod graph;
pub mod profile;
mod select;
mod standalone;
mod transfer;

pub use crate::backend::{
    Backend, CollectiveCall, CollectiveKind, DeviceProperties, DevicePtr, Event, EventImpl,
    Exchange, FillPattern, HostPtr, Inputs, ManagedAdvice, MemInfo, MemLocation, ReduceOp, Stream,
    StreamImpl, Transport, UniqueId, UNIQUE_ID_BYTES,
};
pub use crate::device_id::{DeviceId, DeviceKind};
pub use count::{device_count, set_sim_device_count, MAX_SIM_DEVICES};
pub use current::{current_device, set_device, with_device, DeviceGuard};
pub use current_stream::StreamGuard;
pub use graph::{Graph, GraphPool};
pub use select::{
    select_device, Selection, DEFAULT_SIM_CAPACITY, ENV_DEVICE, ENV_SIM_CAPACITY, ENV_SIM_DEVICES,
    ENV_SIM_PEER,
};
pub use standalone::{replay_on_sim, sim_backend};
pub use transfer::{copy_between, CopyPath, CopyVia, STAGING_CHUNK};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::kernels::Kernel;

/// A device. Cloning is cheap; all clones share one backend (one context, one set of
/// compiled kernels, later one allocator).
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    id: DeviceId,
    backend: Arc<dyn Backend>,
    allocator: OnceLock<Result<crate::alloc::Allocator>>,
    /// The random generator's state, `(seed, offset)`: counter-based kernels (dropout)
    /// draw element `i` from counter `offset + i`, and the offset then advances past
    /// what they used, as PyTorch's CUDA generator does (`philox_seed_offset`).
    generator: Mutex<(u64, u64)>,
    /// The matrix products' workspace (see [`Device::gemm_workspace_bytes`]).
    gemm_workspace: Mutex<GemmWorkspace>,
    /// The stream graphs capture on unless given one (`graph.rs`), made on first use.
    capture_stream: OnceLock<Stream>,
}

/// The default stream's workspace for the matrix-product library: its size (from the
/// device's compute capability unless set), and the allocator's block once lent.
#[derive(Default)]
struct GemmWorkspace {
    bytes: Option<usize>,
    block: Option<crate::alloc::Allocation>,
    /// The workspaces of other streams that ran a product (a graph's capture stream),
    /// by stream handle: one per stream, as PyTorch keeps one per handle and stream.
    others: Vec<(u64, crate::alloc::Allocation)>,
}

/// PyTorch's default generator seed (`default_rng_seed_val`).
pub const DEFAULT_SEED: u64 = 67280421310721;

fn registry() -> &'static Mutex<HashMap<DeviceId, Device>> {
    static REGISTRY: OnceLock<Mutex<HashMap<DeviceId, Device>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Device {
    // ANCHOR: device_get
    /// The process-wide device with this id, created on first use. Creating a `cuda`
    /// device checks that it exists but does not create its context: that happens at
    /// its first real use, as in PyTorch. `sim:N` and `dry:N` exist for `N` below
    /// `LABS_SIM_DEVICES` (1 unless set), and beyond it those `new_sim` and `new_dry`
    /// made.
    pub fn get(id: DeviceId) -> Result<Device> {
        let mut map = registry().lock().unwrap();
        if let Some(d) = map.get(&id) {
            return Ok(d.clone());
        }
        if let DeviceId::Sim(index) | DeviceId::Dry(index) = id {
            let available = count::sim_device_count()?;
            if index >= available {
                return Err(crate::error::Error::NoSuchDevice {
                    requested: id,
                    available,
                });
            }
        }
        let backend: Arc<dyn Backend> = match id {
            DeviceId::Cpu => Arc::new(crate::sim::SimBackend::host()),
            DeviceId::Sim(_) => Arc::new(crate::sim::SimBackend::new(
                id,
                select::sim_capacity_from_env()?,
            )),
            DeviceId::Dry(_) => Arc::new(crate::sim::SimBackend::dry(
                id,
                select::sim_capacity_from_env()?,
            )),
            DeviceId::Cuda(ordinal) => crate::cuda::open_backend(ordinal)?,
        };
        let device = Device::from_backend(backend);
        map.insert(id, device.clone());
        Ok(device)
    }
    // ANCHOR_END: device_get

    /// Host memory.
    pub fn cpu() -> Device {
        Device::get(DeviceId::Cpu).expect("the host device always exists")
    }

    /// A new simulated GPU of the given capacity, registered under the next free
    /// `sim:N` beyond the configured ones (`N >= device_count(Sim)`), so that `sim:0`
    /// and its siblings keep `LABS_SIM_CAPACITY`. Used where a lab needs a device the
    /// size of another machine's GPU; not counted by `device_count`, but `Device::get`
    /// finds it by its id.
    pub fn new_sim(capacity: u64) -> Device {
        let mut map = registry().lock().unwrap();
        let index = (count::sim_device_count().unwrap_or(1)..)
            .find(|i| !map.contains_key(&DeviceId::Sim(*i)))
            .expect("a free index");
        let id = DeviceId::Sim(index);
        let device = Device::from_backend(Arc::new(crate::sim::SimBackend::new(id, capacity)));
        map.insert(id, device.clone());
        device
    }

    /// A new dry-run device of the given capacity, registered under the next free
    /// `dry:N` beyond the configured ones (as `new_sim`): the simulated GPU's
    /// allocations without its work, to learn what fits on a GPU of that size before
    /// running on it.
    pub fn new_dry(capacity: u64) -> Device {
        let mut map = registry().lock().unwrap();
        let index = (count::sim_device_count().unwrap_or(1)..)
            .find(|i| !map.contains_key(&DeviceId::Dry(*i)))
            .expect("a free index");
        let id = DeviceId::Dry(index);
        let device = Device::from_backend(Arc::new(crate::sim::SimBackend::dry(id, capacity)));
        map.insert(id, device.clone());
        device
    }

    fn from_backend(backend: Arc<dyn Backend>) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                id: backend.id(),
                backend,
                allocator: OnceLock::new(),
                generator: Mutex::new((DEFAULT_SEED, 0)),
                gemm_workspace: Mutex::new(GemmWorkspace::default()),
                capture_stream: OnceLock::new(),
            }),
        }
    }

    pub fn id(&self) -> DeviceId {
        self.inner.id
    }

    /// The device's index among those of its kind (`torch.device.index`); `None` for
    /// the host.
    pub fn index(&self) -> Option<usize> {
        self.inner.id.index()
    }

    pub fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// The backend, shared: for an allocator of one's own (trace replay, comparisons).
    pub fn backend_arc(&self) -> Arc<dyn Backend> {
        self.inner.backend.clone()
    }

    // ANCHOR: device_allocator
    /// The device's caching allocator, where every tensor's memory comes from. It is
    /// configured from `LABS_ALLOC_CONF` when first used; a bad setting is an error
    /// here (and at every later call).
    pub fn allocator(&self) -> Result<&crate::alloc::Allocator> {
        self.inner
            .allocator
            .get_or_init(|| {
                crate::alloc::Config::from_env()
                    .and_then(|c| crate::alloc::Allocator::new(self.inner.backend.clone(), c))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
    // ANCHOR_END: device_allocator

    /// Configures the device's allocator with `config` instead of `LABS_ALLOC_CONF`,
    /// before its first use (as `PYTORCH_CUDA_ALLOC_CONF` must be set before CUDA's
    /// first allocation); an error once the allocator exists.
    pub fn configure_allocator(&self, config: crate::alloc::Config) -> Result<()> {
        let mut made = false;
        self.inner.allocator.get_or_init(|| {
            made = true;
            crate::alloc::Allocator::new(self.inner.backend.clone(), config)
        });
        if !made {
            return Err(crate::error::Error::InvalidArgument(format!(
                "the allocator of {} is in use already: configure it before the device's first allocation",
                self.id()
            )));
        }
        self.allocator().map(|_| ())
    }

    /// Seeds the device's random generator and resets its offset (`manual_seed`).
    pub fn manual_seed(&self, seed: u64) {
        *self.inner.generator.lock().unwrap() = (seed, 0);
    }

    /// The generator's `(seed, offset)` for a kernel that draws `increment` counters,
    /// advancing the offset past them, so that the next draw is fresh.
    pub fn philox_seed_offset(&self, increment: u64) -> (u64, u64) {
        let mut g = self.inner.generator.lock().unwrap();
        let current = *g;
        g.1 = g.1.wrapping_add(increment);
        current
    }

    /// The generator's `(seed, offset)` without advancing it (`get_rng_state`):
    /// activation checkpointing saves it at the forward to replay the same dropout
    /// masks in the recomputation.
    pub fn rng_state(&self) -> (u64, u64) {
        *self.inner.generator.lock().unwrap()
    }

    /// Puts the generator back to a state [`Device::rng_state`] returned
    /// (`set_rng_state`).
    pub fn set_rng_state(&self, state: (u64, u64)) {
        *self.inner.generator.lock().unwrap() = state;
    }

    pub fn is_cuda(&self) -> bool {
        matches!(self.id(), DeviceId::Cuda(_))
    }

    /// A dry run: allocations without kernels, copies or values.
    pub fn is_dry(&self) -> bool {
        matches!(self.id(), DeviceId::Dry(_))
    }

    pub fn properties(&self) -> Result<DeviceProperties> {
        self.backend().properties()
    }

    pub fn mem_info(&self) -> Result<MemInfo> {
        self.backend().mem_info()
    }

    /// The device's default stream, whatever stream is current on this thread (see
    /// [`Device::current_stream`], where work goes when it names no stream).
    pub fn default_stream(&self) -> Result<Stream> {
        self.backend().default_stream()
    }

    pub fn new_stream(&self) -> Result<Stream> {
        self.backend().new_stream(0)
    }

    pub fn new_event(&self) -> Result<Event> {
        self.backend().new_event()
    }

    pub fn synchronize(&self) -> Result<()> {
        self.backend().synchronize()
    }

    // ANCHOR: gemm_workspace
    /// The workspace cuBLAS gets for this device's products: PyTorch's default size
    /// for the GPU's compute capability (32 MiB from Hopper on), none on the simulated
    /// GPU, or what [`Device::set_gemm_workspace_bytes`] set.
    pub fn gemm_workspace_bytes(&self) -> Result<usize> {
        if let Some(bytes) = self.inner.gemm_workspace.lock().unwrap().bytes {
            return Ok(bytes);
        }
        Ok(crate::backend::gemm_workspace_bytes(
            self.properties()?.compute_capability,
        ))
    }

    /// Gives this device's products a workspace of `bytes`, as a GPU's: a dry run
    /// that predicts a GPU's allocations takes the GPU's size. An error once the
    /// workspace has been lent.
    pub fn set_gemm_workspace_bytes(&self, bytes: usize) -> Result<()> {
        let mut w = self.inner.gemm_workspace.lock().unwrap();
        if w.block.is_some() {
            return Err(crate::error::Error::InvalidArgument(format!(
                "{}: the matrix products' workspace is already allocated",
                self.id()
            )));
        }
        w.bytes = Some(bytes);
        Ok(())
    }

    /// Lends the matrix-product library its workspace from this device's caching
    /// allocator, once, before the first product: PyTorch's cuBLAS workspaces come
    /// from its allocator, so `memory_allocated` counts them there (32 MiB per cuBLAS
    /// handle and stream on an H100, from the first product on, never freed). Counted
    /// as `Other`: memory no tensor holds.
    pub fn ensure_gemm_workspace(&self) -> Result<()> {
        let mut w = self.inner.gemm_workspace.lock().unwrap();
        if w.block.is_some() {
            return Ok(());
        }
        let bytes = match w.bytes {
            Some(b) => b,
            None => crate::backend::gemm_workspace_bytes(self.properties()?.compute_capability),
        };
        w.bytes = Some(bytes);
        if bytes == 0 {
            return Ok(());
        }
        let stream = self.default_stream()?;
        let block = self
            .allocator()?
            .malloc_as(bytes, &stream, crate::alloc::Category::Other)?;
        self.backend()
            .lend_gemm_workspace(&stream, block.ptr(), bytes)?;
        w.block = Some(block);
        Ok(())
    }
    // ANCHOR_END: gemm_workspace

    /// Whether the matrix products' workspace has been lent (a product has run).
    pub fn has_gemm_workspace(&self) -> bool {
        self.inner.gemm_workspace.lock().unwrap().block.is_some()
    }

    /// [`Device::ensure_gemm_workspace`] for another stream than the default one: its
    /// own workspace, lent from the caching allocator once, before its first product
    /// (a graph lends its capture stream one before capturing, so that the workspace
    /// comes from the cache, not from the graph's pool or a driver call in the capture).
    pub fn ensure_stream_gemm_workspace(&self, stream: &Stream) -> Result<()> {
        self.ensure_gemm_workspace()?;
        // The default stream is handle 0 on every backend (`StreamImpl::handle`).
        if stream.handle() == 0 {
            return Ok(());
        }
        let mut w = self.inner.gemm_workspace.lock().unwrap();
        let bytes = w.bytes.unwrap_or(0);
        if bytes == 0 || w.others.iter().any(|(h, _)| *h == stream.handle()) {
            return Ok(());
        }
        let block = self
            .allocator()?
            .malloc_as(bytes, stream, crate::alloc::Category::Other)?;
        self.backend()
            .lend_gemm_workspace(stream, block.ptr(), bytes)?;
        w.others.push((stream.handle(), block));
        Ok(())
    }

    /// A dry-run device of `capacity` that predicts this one: its matrix products'
    /// workspace is this device's size (cuBLAS's 32 MiB on an H100, in the allocator
    /// from the first product on), lent before anything else, as a run on this device
    /// finds it. A prediction made on a plain `new_dry` device would miss those bytes.
    pub fn dry_twin(&self, capacity: u64) -> Result<Device> {
        let dry = Device::new_dry(capacity);
        dry.set_gemm_workspace_bytes(self.gemm_workspace_bytes()?)?;
        dry.ensure_gemm_workspace()?;
        Ok(dry)
    }

    /// Enqueues a kernel on this thread's current stream (the default stream unless a
    /// [`StreamGuard`] made another current).
    pub fn launch(&self, kernel: &Kernel) -> Result<()> {
        let stream = self.current_stream()?;
        if let Kernel::Gemm(_) = kernel {
            self.ensure_stream_gemm_workspace(&stream)?;
        }
        if profile::enabled() && !self.is_dry() {
            let (start, end) = (self.new_event()?, self.new_event()?);
            stream.record(&start)?;
            self.backend().launch(kernel, &stream)?;
            stream.record(&end)?;
            profile::record(kernel, start, end);
            return Ok(());
        }
        self.backend().launch(kernel, &stream)
    }

    // ANCHOR: raw_buffer
    /// A raw device allocation, owned: freed with `cuMemFree` when dropped. This is the
    /// slow path lab-01 measures.
    pub fn raw_buffer(&self, bytes: usize) -> Result<RawBuffer> {
        let ptr = self.backend().raw_alloc(bytes)?;
        Ok(RawBuffer {
            device: self.clone(),
            ptr,
            bytes,
        })
    }
    // ANCHOR_END: raw_buffer

    /// Whether this device can read `peer`'s memory directly, so that copies from it
    /// skip host memory (`torch.cuda.can_device_access_peer`). False for the device
    /// itself and for devices of another kind.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        self.backend().can_access_peer(peer.id())
    }

    /// Lets `peer` read and write this device's memory directly, what its allocator
    /// has mapped and will map (see `PeerAccess::grant_peer_access`). The first peer
    /// copy between two devices grants it both ways; this does it ahead of time, for
    /// a measurement that should not include it.
    pub fn grant_peer_access(&self, peer: &Device) -> Result<()> {
        self.backend().grant_peer_access(peer.id())
    }

    /// The devices granted direct access to this device's memory, in the order granted.
    pub fn granted_peers(&self) -> Vec<DeviceId> {
        self.backend().granted_peers()
    }

    /// Two handles to the same device?
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.id())
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.id())
    }
}

/// Memory from `raw_alloc`, returned to the driver on drop.
pub struct RawBuffer {
    device: Device,
    ptr: DevicePtr,
    bytes: usize,
}

impl std::fmt::Debug for RawBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RawBuffer({:#x}, {} bytes on {})",
            self.ptr, self.bytes, self.device
        )
    }
}

impl RawBuffer {
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
}

// ANCHOR: raw_buffer_drop
impl Drop for RawBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.device.backend().raw_free(self.ptr) {
            // Drop cannot return an error; a failed free means the device is already in
            // a broken state, which the next checked call reports.
            eprintln!("warning: freeing {:#x} on {}: {e}", self.ptr, self.device);
        }
    }
}
// ANCHOR_END: raw_buffer_drop
