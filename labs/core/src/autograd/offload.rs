//! Activation offload: a saved-tensor hook pair that moves each saved activation to
//! pinned host memory as soon as it is saved and brings it back in backward just ahead
//! of use (PyTorch's `torch.autograd.graph.save_on_cpu(pin_memory=True)`, plus the
//! prefetch PyTorch leaves to libraries).
//!
//! Pack, for a tensor of at least `min_bytes`: an event recorded on the compute stream
//! (the default stream) orders the copy after the op that produced the tensor; the copy
//! stream waits for it and copies the tensor into a block of the caching host allocator
//! (`host::HostAllocator`). The device tensor is recorded on the copy stream
//! (`record_stream`), so dropping it at once gives its memory back to the cache only for
//! reuse after the copy: forward goes on without waiting. Smaller tensors stay on the
//! device (their copies would cost more in latency than they save), counted as
//! activations as usual.
//!
//! Unpack: the compute stream waits for the copy back (an event) and gets a device
//! tensor. When backward unpacks one node, the engine asks the next node's tensors to
//! be prefetched: their copies back run on the copy stream while this node computes.
//!
//! Categories stay true: an offloaded tensor is host memory, never marked as a device
//! activation; a tensor brought back is the backward's temporary.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::device::{Device, DeviceId, Event, Stream};
use crate::error::{Error, Result};
use crate::host::PinnedTensor;
use crate::tensor::{
    push_saved_tensors_hooks, GradOp, Packed, SavedTensorsHooks, SavedTensorsHooksGuard, Tensor,
};

/// Options of [`OffloadHooks`].
#[derive(Debug, Clone, Copy)]
pub struct OffloadOptions {
    /// Copy through pinned memory (asynchronous); `false` copies synchronously into
    /// pageable host memory, as `save_on_cpu(pin_memory=False)`.
    pub pin_memory: bool,
    /// Tensors smaller than this stay on the device.
    pub min_bytes: usize,
    /// Start bringing the next node's tensors back when one node is unpacked.
    pub prefetch: bool,
    /// At most this many bytes in copies to the host not yet finished: past it, the
    /// forward pass waits for the oldest. A tensor being copied out cannot be freed
    /// until its copy is done, so without a bound a forward pass faster than the copies
    /// reserves device memory for every tensor in flight (PyTorch's `save_on_cpu`
    /// copies on the compute stream and so never has more than one in flight).
    pub max_in_flight_bytes: usize,
}

impl Default for OffloadOptions {
    fn default() -> Self {
        OffloadOptions {
            pin_memory: true,
            min_bytes: 1 << 20,
            prefetch: true,
            max_in_flight_bytes: 64 << 20,
        }
    }
}

/// What the hooks did, for tests and the lab.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Tensors copied to the host, and their bytes.
    pub offloaded: usize,
    pub offloaded_bytes: u64,
    /// Tensors left on the device (below `min_bytes`, parameters, or tensors already
    /// on the host).
    pub kept_on_device: usize,
    /// Tensors whose copy back was started by a prefetch before backward unpacked them.
    pub prefetched: usize,
    /// Tensors unpacked with no copy back under way (copied back on demand).
    pub fetched_on_demand: usize,
}

/// A saved tensor in host memory, and its copy back once started.
struct Offloaded {
    device: Device,
    host: Host,
    shape: Vec<usize>,
    /// Recorded on the copy stream after the copy to the host.
    copied_out: Option<Event>,
    back: Mutex<Option<(Tensor, Event)>>,
}

enum Host {
    Pinned(PinnedTensor),
    /// A tensor of the host device (pageable memory).
    Pageable(Tensor),
}

enum Slot {
    OnDevice(Tensor),
    Offloaded(Offloaded),
}

/// The offload hook pair. One instance may serve several devices: each gets a copy
/// stream of its own.
pub struct OffloadHooks {
    options: OffloadOptions,
    copy_streams: Mutex<HashMap<DeviceId, Stream>>,
    stats: Mutex<OffloadStats>,
    /// Copies to the host under way, oldest first: their end events and bytes.
    in_flight: Mutex<VecDeque<(Event, usize)>>,
}

impl OffloadHooks {
    pub fn new(options: OffloadOptions) -> OffloadHooks {
        OffloadHooks {
            options,
            copy_streams: Mutex::new(HashMap::new()),
            stats: Mutex::new(OffloadStats::default()),
            in_flight: Mutex::new(VecDeque::new()),
        }
    }

    pub fn stats(&self) -> OffloadStats {
        *self.stats.lock().unwrap()
    }

    /// The stream the copies of `device` run on.
    pub fn copy_stream(&self, device: &Device) -> Result<Stream> {
        let mut streams = self.copy_streams.lock().unwrap();
        if let Some(s) = streams.get(&device.id()) {
            return Ok(s.clone());
        }
        let s = device.new_stream()?;
        streams.insert(device.id(), s.clone());
        Ok(s)
    }

    /// Adds a copy to the host to those under way, then waits for the oldest while
    /// more than `max_in_flight_bytes` are (keeping one, however large).
    fn bound_in_flight(&self, done: Event, bytes: usize) -> Result<()> {
        let mut q = self.in_flight.lock().unwrap();
        q.push_back((done, bytes));
        let mut total: usize = q.iter().map(|(_, b)| b).sum();
        while total > self.options.max_in_flight_bytes && q.len() > 1 {
            let (oldest, b) = q.pop_front().expect("more than one");
            oldest.synchronize()?;
            total -= b;
        }
        // Finished ones leave without a wait.
        while q.front().is_some_and(|(e, _)| e.query().unwrap_or(false)) {
            q.pop_front();
        }
        Ok(())
    }

    /// Starts the copy back of `o` on the copy stream unless it is under way.
    fn start_copy_back(&self, o: &Offloaded) -> Result<bool> {
        let mut back = o.back.lock().unwrap();
        if back.is_some() {
            return Ok(false);
        }
        let copy = self.copy_stream(&o.device)?;
        let t = match &o.host {
            Host::Pinned(h) => {
                if let Some(e) = &o.copied_out {
                    copy.wait(e)?;
                }
                // The device block comes from the compute stream's pool: a block freed
                // there may still be read by compute work already enqueued, so the copy
                // into it waits for that work.
                let allocated = o.device.new_event()?;
                o.device.default_stream()?.record(&allocated)?;
                copy.wait(&allocated)?;
                h.to_non_blocking(&o.device, &copy)?
            }
            Host::Pageable(h) => h.to(&o.device)?.reshape(&o.shape)?,
        };
        let done = o.device.new_event()?;
        copy.record(&done)?;
        *back = Some((t, done));
        Ok(true)
    }
}

impl SavedTensorsHooks for OffloadHooks {
    fn pack(&self, t: &Tensor, saved_by: &GradOp) -> Result<Packed> {
        let device = t.device().clone();
        // A parameter (a leaf that requires grad) stays on the device anyway: copying
        // it out would cost bandwidth and pinned memory for nothing.
        let parameter = t.is_leaf() && t.requires_grad();
        if parameter || t.nbytes() < self.options.min_bytes || device.id() == DeviceId::Cpu {
            self.stats.lock().unwrap().kept_on_device += 1;
            t.mark_saved(saved_by);
            return Ok(Box::new(Slot::OnDevice(t.detach())));
        }
        let dense = t.detach().contiguous()?;
        let (host, copied_out) = if self.options.pin_memory {
            let compute = device.default_stream()?;
            let copy = self.copy_stream(&device)?;
            // The copy starts after the op that wrote the tensor.
            let produced = device.new_event()?;
            compute.record(&produced)?;
            copy.wait(&produced)?;
            let mut host = PinnedTensor::empty(t.shape(), t.dtype(), &device)?;
            // Records `dense` on the copy stream: dropping it below is safe.
            host.copy_from_non_blocking(&dense, &copy)?;
            let done = device.new_event()?;
            copy.record(&done)?;
            self.bound_in_flight(done.clone(), dense.nbytes())?;
            (Host::Pinned(host), Some(done))
        } else {
            (Host::Pageable(dense.cpu()?), None)
        };
        drop(dense);
        let mut stats = self.stats.lock().unwrap();
        stats.offloaded += 1;
        stats.offloaded_bytes += t.nbytes() as u64;
        Ok(Box::new(Slot::Offloaded(Offloaded {
            device,
            host,
            shape: t.shape().to_vec(),
            copied_out,
            back: Mutex::new(None),
        })))
    }

    fn unpack(&self, packed: &Packed) -> Result<Tensor> {
        let o = match downcast(packed)? {
            Slot::OnDevice(t) => return Ok(t.clone()),
            Slot::Offloaded(o) => o,
        };
        let started_now = self.start_copy_back(o)?;
        {
            let mut stats = self.stats.lock().unwrap();
            if started_now {
                stats.fetched_on_demand += 1;
            } else {
                stats.prefetched += 1;
            }
        }
        // Taken, so that a retained graph's next pass copies it back again rather than
        // keeping a device copy alive between passes.
        let (t, done) = o
            .back
            .lock()
            .unwrap()
            .take()
            .expect("a copy back was started");
        o.device.default_stream()?.wait(&done)?;
        Ok(t)
    }

    fn resident(&self, packed: &Packed) -> Option<Tensor> {
        match downcast(packed).ok()? {
            Slot::OnDevice(t) => Some(t.clone()),
            Slot::Offloaded(_) => None,
        }
    }

    fn prefetch(&self, packed: &Packed) -> Result<()> {
        if let (true, Slot::Offloaded(o)) = (self.options.prefetch, downcast(packed)?) {
            self.start_copy_back(o)?;
        }
        Ok(())
    }
}

fn downcast(packed: &Packed) -> Result<&Slot> {
    packed
        .downcast_ref::<Slot>()
        .ok_or_else(|| Error::InvalidArgument("offload: a foreign packed value".into()))
}

/// Offloads saved activations until the guard drops (`save_on_cpu`): returns the guard
/// and the hooks (for their statistics).
pub fn save_on_cpu(options: OffloadOptions) -> (SavedTensorsHooksGuard, Arc<OffloadHooks>) {
    let hooks = Arc::new(OffloadHooks::new(options));
    (push_saved_tensors_hooks(hooks.clone()), hooks)
}
