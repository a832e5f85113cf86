//! Activation offload: a saved-tensor hook pair that moves each saved activation to
//! pinned host memory as soon as it is saved and brings it back in backward just ahead
//! of use (PyTorch's `torch.autograd.graph.save_on_cpu(pin_memory=True)`, plus the
//! prefetch PyTorch leaves to libraries).
//!
//! Pack, for a tensor of at least `min_bytes`: an event recorded on the compute stream
//! (the default stream) orders the copy after the op that produced the tensor; the copy
//! stream waits for it and copies the tensor into a block of the caching host allocator
//! (`host::HostAllocator`). The hooks keep the device tensor until its copy is done,
//! and forward goes on without waiting: once more than `max_in_flight_bytes` are held
//! beside the newest, the compute stream (not the host) waits for the oldest copy, and
//! the hooks let go of its tensor, whose memory is then reused in stream order, after
//! the copy. Smaller tensors stay on the device (their copies would cost more in latency
//! than they save), counted as activations as usual.
//!
//! What is copied is a storage, not a tensor: the views of one storage that backward
//! needs (an attention's output and the same memory reshaped for the projection after
//! it, a packed projection's query, key and value) all go, or all stay, and a view
//! that covers its whole storage sends the storage once, every later view of it being
//! rebuilt from that copy on the way back. PyTorch's `save_on_cpu` copies each saved
//! tensor on its own: the same bytes twice where two ops save one tensor.
//!
//! Not `record_stream`: a block recorded on the copy stream and freed is pending until
//! the host sees the copy end, and the host runs ahead of the device by a whole forward
//! pass; a request meanwhile cannot reuse it and the allocator grows instead. Offloaded
//! that way, a step reserved almost what it reserves without offload.
//!
//! Unpack: the compute stream waits for the copy back (an event) and gets a device
//! tensor, from then on the compute stream's alone (not recorded on the copy stream,
//! for the same reason). When backward unpacks one node, the engine asks the next
//! node's tensors to be prefetched: their copies back run on the copy stream while this
//! node computes.
//!
//! Categories stay true: an offloaded tensor is host memory, never marked as a device
//! activation; a tensor brought back is the backward's temporary.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::alloc::Category;
use crate::device::{Device, DeviceId, Event, Stream};
use crate::error::{Error, Result};
use crate::host::PinnedTensor;
use crate::tensor::{
    push_saved_tensors_hooks, GradOp, Layout, Packed, SavedTensorsHooks, SavedTensorsHooksGuard,
    StorageKey, Tensor,
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
    /// Bytes of tensors being copied to the host that the hooks hold beside the
    /// newest: past it, the compute stream waits for the oldest copy (the host does
    /// not) and the hooks let go of its tensor. A tensor being copied out cannot be
    /// reused until its copy is done, so whatever is held is allocated. The default,
    /// 0, holds the newest alone: each copy overlaps the compute up to the next saved
    /// tensor, which a forward pass whose copies take longer than its kernels waits
    /// for anyway (PyTorch's `save_on_cpu` copies on the compute stream, which waits
    /// for every copy).
    pub max_in_flight_bytes: usize,
    /// The share of each forward pass's saved bytes that may go to the host (1: all
    /// of them, as `save_on_cpu`). Below 1, a storage goes only while the bytes sent
    /// stay within this share of those that could have gone, counted over storages
    /// (every view of one follows the first one's fate), so the copies spread evenly
    /// through forward: each one overlaps the compute that produces the tensors kept
    /// after it. Where the copy engine is slower than compute makes activations (the H100's
    /// host link against a small model's kernels), offloading everything makes the
    /// step wait for the copies; a share the link can carry in the compute's time
    /// saves less memory, hidden.
    pub share: f64,
    /// Time every copy on the copy stream (two events each), for
    /// [`OffloadHooks::take_copy_times`]: how long the copies kept the copy engine
    /// busy, to set against how much of that the step's compute hid.
    pub time_copies: bool,
}

impl Default for OffloadOptions {
    fn default() -> Self {
        OffloadOptions {
            pin_memory: true,
            min_bytes: 1 << 20,
            prefetch: true,
            max_in_flight_bytes: 0,
            share: 1.0,
            time_copies: false,
        }
    }
}

/// How long the copies took on the copy stream, from their events: the copy engine's
/// busy time, whether or not compute ran beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CopyTimes {
    /// To the host (forward), and back to the device (backward), in milliseconds.
    pub out_ms: f64,
    pub back_ms: f64,
    /// Copies timed.
    pub copies: usize,
}

impl CopyTimes {
    pub fn total_ms(&self) -> f64 {
        self.out_ms + self.back_ms
    }
}

/// One copy's events on the copy stream: recorded after its waits, and after it.
struct TimedCopy {
    start: Event,
    done: Event,
    back: bool,
}

/// What the hooks did, for tests and the lab.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Tensors copied to the host, and their bytes.
    pub offloaded: usize,
    pub offloaded_bytes: u64,
    /// Tensors left on the device (below `min_bytes`, parameters and their views, or
    /// tensors already on the host).
    pub kept_on_device: usize,
    /// Tensors whose copy back was started by a prefetch before backward unpacked them.
    pub prefetched: usize,
    /// Tensors unpacked from a copy back that backward itself started, when it
    /// needed them or a view sharing their copy (no prefetch had started it).
    pub fetched_on_demand: usize,
    /// Copies to the host that the compute stream was made to wait for, to keep the
    /// bytes in flight under the bound: waits on the device, never on the host.
    pub compute_waits: usize,
    /// Tensors that could have gone to the host but stayed to hold the share
    /// ([`OffloadOptions::share`]), and their bytes.
    pub kept_for_share: usize,
    pub kept_for_share_bytes: u64,
    /// The bytes of the distinct storages sent, and of those that could have gone,
    /// summed over forward passes: what the share is kept on (a tensor saved twice, or
    /// three views of one storage, count once).
    pub share_sent_bytes: u64,
    pub share_could_bytes: u64,
    /// Bytes copied to the host: less than `offloaded_bytes` where views of one
    /// storage shared one copy of it.
    pub copied_out_bytes: u64,
}

/// Which storages one forward pass sends, and the host copies made of whole storages.
#[derive(Default)]
struct ShareLedger {
    /// Each storage met in this forward pass, and its fate.
    decided: HashMap<StorageKey, Fate>,
    /// Bytes of the storages sent, and of all those that could have gone.
    sent: u64,
    could: u64,
}

// ANCHOR: share
impl ShareLedger {
    /// Whether a tensor that could go is sent, and the bytes its storage added to
    /// those counted (0 when the storage was met before). The share is kept over
    /// storages, each counted once, because freeing a storage is what gives memory
    /// back: a view follows the first view's decision (sending q while keeping k and
    /// v of one packed projection frees nothing), and a tensor saved by two ops counts
    /// once. Each forward pass starts afresh, so every step sends the same tensors.
    fn decide(&mut self, t: &Tensor, share: f64) -> (Fate, u64) {
        let key = t.storage_key();
        if let Some(fate) = self.decided.get(&key) {
            return (fate.clone(), 0);
        }
        let bytes = t.storage_nbytes();
        let send =
            share >= 1.0 || (self.sent + bytes) as f64 <= share * (self.could + bytes) as f64;
        self.could += bytes;
        let fate = if send {
            self.sent += bytes;
            Fate::Sent(None)
        } else {
            Fate::Kept
        };
        self.decided.insert(key, fate.clone());
        (fate, bytes)
    }
}
// ANCHOR_END: share

impl ShareLedger {
    /// The whole of `t`'s storage went to the host as `copy`: later views of the
    /// storage in this forward pass are rebuilt from it rather than copied again.
    fn sent_whole(&mut self, t: &Tensor, copy: &Arc<Offloaded>) {
        self.decided
            .insert(t.storage_key(), Fate::Sent(Some(copy.clone())));
    }
}

/// What happens to a storage's saved views in one forward pass.
#[derive(Clone)]
enum Fate {
    /// They stay on the device, to hold the share.
    Kept,
    /// They go to the host; once a view covered the whole storage, the host copy of
    /// it, which every later view shares.
    Sent(Option<Arc<Offloaded>>),
}

/// Memory copied to the host (a whole storage, or one view's elements made dense),
/// and its copy back once started.
struct Offloaded {
    device: Device,
    host: Host,
    /// Recorded on the copy stream after the copy to the host.
    copied_out: Option<Event>,
    /// The saved views rebuilt from this copy.
    views: AtomicUsize,
    back: Mutex<Back>,
}

/// A copy back on its way or arrived: the device tensor, the event after its copy,
/// and how many of the views have been unpacked from it in this backward pass.
#[derive(Default)]
struct Back {
    copy: Option<(Tensor, Event)>,
    /// Whether a prefetch started it (rather than backward needing a view).
    prefetched: bool,
    unpacked: usize,
}

/// A saved view that went to the host: the copy it comes back from, and its layout
/// over that copy.
struct SentView {
    copy: Arc<Offloaded>,
    layout: Layout,
}

enum Host {
    Pinned(PinnedTensor),
    /// A tensor of the host device (pageable memory).
    Pageable(Tensor),
}

enum Slot {
    OnDevice(Tensor),
    Offloaded(SentView),
}

/// The offload hook pair. One instance may serve several devices: each gets a copy
/// stream of its own.
pub struct OffloadHooks {
    options: OffloadOptions,
    copy_streams: Mutex<HashMap<DeviceId, Stream>>,
    stats: Mutex<OffloadStats>,
    /// Copies to the host under way, oldest first.
    in_flight: Mutex<VecDeque<InFlight>>,
    /// The copies timed since the last [`OffloadHooks::take_copy_times`].
    timed: Mutex<Vec<TimedCopy>>,
    /// What this forward pass sends, with a share below 1.
    ledger: Mutex<ShareLedger>,
}

/// A copy to the host under way: the device tensor it reads, held until the copy is
/// done, and the event recorded on the copy stream after it.
struct InFlight {
    tensor: Tensor,
    done: Event,
}

impl InFlight {
    /// Lets go of the tensor once the stream that allocated it (the device's default
    /// stream, where its memory is reused) has been made to wait for the copy.
    fn release_after_copy(self) -> Result<()> {
        self.tensor.device().current_stream()?.wait(&self.done)
    }
}

impl OffloadHooks {
    pub fn new(options: OffloadOptions) -> OffloadHooks {
        OffloadHooks {
            options,
            copy_streams: Mutex::new(HashMap::new()),
            stats: Mutex::new(OffloadStats::default()),
            in_flight: Mutex::new(VecDeque::new()),
            timed: Mutex::new(Vec::new()),
            ledger: Mutex::new(ShareLedger::default()),
        }
    }

    /// The copies' times since the last call (with `time_copies`; nothing without),
    /// forgetting them. Call once the device has finished them (after a
    /// synchronisation): an event not yet reached has no time.
    pub fn take_copy_times(&self) -> Result<CopyTimes> {
        let timed = std::mem::take(&mut *self.timed.lock().unwrap());
        let mut times = CopyTimes::default();
        for c in &timed {
            let ms = c.start.elapsed_ms(&c.done)? as f64;
            if c.back {
                times.back_ms += ms;
            } else {
                times.out_ms += ms;
            }
        }
        times.copies = timed.len();
        Ok(times)
    }

    /// With `time_copies`, an event on `copy` now: where the next copy starts, after
    /// the waits queued before it.
    fn copy_start(&self, device: &Device, copy: &Stream) -> Result<Option<Event>> {
        if !self.options.time_copies {
            return Ok(None);
        }
        let start = device.new_event()?;
        copy.record(&start)?;
        Ok(Some(start))
    }

    fn copy_timed(&self, start: Option<Event>, done: &Event, back: bool) {
        if let Some(start) = start {
            self.timed.lock().unwrap().push(TimedCopy {
                start,
                done: done.clone(),
                back,
            });
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

    /// Adds a copy to the host to those under way; while more than
    /// `max_in_flight_bytes` are (keeping one, however large), the compute stream
    /// waits for the oldest, whose tensor is let go. Which tensors are held depends on
    /// the sizes alone, never on how far the copies have got (no `query`), so that the
    /// allocations are the same on every device: the dry run predicts them exactly.
    fn bound_in_flight(&self, copy: InFlight) -> Result<()> {
        let mut q = self.in_flight.lock().unwrap();
        q.push_back(copy);
        let mut total: usize = q.iter().map(|c| c.tensor.nbytes()).sum();
        let mut waits = 0;
        while total > self.options.max_in_flight_bytes && q.len() > 1 {
            let oldest = q.pop_front().expect("more than one");
            total -= oldest.tensor.nbytes();
            oldest.release_after_copy()?;
            waits += 1;
        }
        drop(q);
        self.stats.lock().unwrap().compute_waits += waits;
        Ok(())
    }

    /// Lets go of every tensor still being copied out, each device's compute stream
    /// waiting for the copies first: backward has begun, and what it needs back comes
    /// from the host.
    fn release_in_flight(&self) -> Result<()> {
        let copies = std::mem::take(&mut *self.in_flight.lock().unwrap());
        // The copies of one device run in order on its copy stream: waiting for the
        // newest waits for them all.
        let mut newest: HashMap<DeviceId, InFlight> = HashMap::new();
        for c in copies {
            newest.insert(c.tensor.device().id(), c);
        }
        newest
            .into_values()
            .try_for_each(InFlight::release_after_copy)
    }

    /// Backward is unpacking: the forward pass is over, and the next one counts its
    /// share afresh. The host copies it made are held by their views alone from now on.
    fn backward_begun(&self) {
        let mut ledger = self.ledger.lock().unwrap();
        if !ledger.decided.is_empty() {
            *ledger = ShareLedger::default();
        }
    }

    /// Starts the copy back of `o` on the copy stream unless it is under way, for a
    /// prefetch or for a view backward needs now.
    fn start_copy_back(&self, o: &Offloaded, prefetch: bool) -> Result<bool> {
        let mut back = o.back.lock().unwrap();
        if back.copy.is_some() {
            return Ok(false);
        }
        let copy = self.copy_stream(&o.device)?;
        let mut start = None;
        let t = match &o.host {
            Host::Pinned(h) => {
                if let Some(e) = &o.copied_out {
                    copy.wait(e)?;
                }
                // The device block comes from the compute stream's pool: a block freed
                // there may still be read by compute work already enqueued, so the copy
                // into it waits for that work.
                let allocated = o.device.new_event()?;
                o.device.current_stream()?.record(&allocated)?;
                copy.wait(&allocated)?;
                start = self.copy_start(&o.device, &copy)?;
                // Not recorded on the copy stream: `unpack` (or dropping `o`) makes the
                // compute stream wait for the copy before anything else uses it.
                h.to_non_blocking_unrecorded(&o.device, &copy)?
            }
            Host::Pageable(h) => h.to(&o.device)?,
        };
        let done = o.device.new_event()?;
        copy.record(&done)?;
        self.copy_timed(start, &done, true);
        back.copy = Some((t, done));
        back.prefetched = prefetch;
        Ok(true)
    }

    /// Copies `dense` (a whole storage, flat, or one view made dense) to the host: on
    /// the copy stream into pinned memory, after the op that wrote it, or plainly into
    /// pageable memory.
    fn copy_out(&self, dense: &Tensor) -> Result<Offloaded> {
        let device = dense.device().clone();
        let (host, copied_out) = if self.options.pin_memory {
            let compute = device.current_stream()?;
            let copy = self.copy_stream(&device)?;
            // The copy starts after the op that wrote the tensor.
            let produced = device.new_event()?;
            compute.record(&produced)?;
            copy.wait(&produced)?;
            let mut host = PinnedTensor::empty(dense.shape(), dense.dtype(), &device)?;
            let start = self.copy_start(&device, &copy)?;
            // Not recorded on the copy stream: the hooks hold `dense` until the
            // compute stream has waited for the copy (`bound_in_flight`).
            host.copy_from_non_blocking_unrecorded(dense, &copy)?;
            let done = device.new_event()?;
            copy.record(&done)?;
            self.copy_timed(start, &done, false);
            self.bound_in_flight(InFlight {
                tensor: dense.clone(),
                done: done.clone(),
            })?;
            (Host::Pinned(host), Some(done))
        } else {
            (Host::Pageable(dense.cpu()?), None)
        };
        self.stats.lock().unwrap().copied_out_bytes += dense.nbytes() as u64;
        Ok(Offloaded {
            device,
            host,
            copied_out,
            views: AtomicUsize::new(0),
            back: Mutex::new(Back::default()),
        })
    }

    /// The host copy `t` comes back from, and its layout over it: the copy of its whole
    /// storage made for an earlier view, a new copy of the whole storage when `t` covers
    /// it, else a dense copy of `t`'s own elements (a part of a larger storage).
    fn send(&self, t: &Tensor, whole: Option<Arc<Offloaded>>) -> Result<SentView> {
        let (copy, layout) = match (whole, t.whole_storage()) {
            (Some(copy), _) => (copy, t.layout().clone()),
            (None, Some(flat)) => {
                let copy = Arc::new(self.copy_out(&flat)?);
                self.ledger.lock().unwrap().sent_whole(t, &copy);
                (copy, t.layout().clone())
            }
            (None, None) => {
                let dense = t.detach().contiguous()?;
                let layout = Layout::contiguous(t.shape(), 0);
                (Arc::new(self.copy_out(&dense)?), layout)
            }
        };
        copy.views.fetch_add(1, Ordering::Relaxed);
        Ok(SentView { copy, layout })
    }
}

impl SavedTensorsHooks for OffloadHooks {
    fn pack(&self, t: &Tensor, saved_by: &GradOp) -> Result<Packed> {
        let device = t.device().clone();
        // A parameter stays on the device anyway: copying it out would cost bandwidth
        // and pinned memory for nothing, and copying it back would make a second copy of
        // the weight. So does a view of one (a weight transposed for a product, a packed
        // projection's part): it is recognised by its memory, which is a parameter's.
        if device.id() == DeviceId::Cpu
            || t.nbytes() < self.options.min_bytes
            || (t.is_leaf() && t.requires_grad())
            || t.category()? == Category::Parameter
        {
            self.stats.lock().unwrap().kept_on_device += 1;
            t.mark_saved(saved_by);
            return Ok(Box::new(Slot::OnDevice(t.detach())));
        }
        let (fate, counted) = self.ledger.lock().unwrap().decide(t, self.options.share);
        let mut stats = self.stats.lock().unwrap();
        stats.share_could_bytes += counted;
        // A view of a storage already on its way shares that copy. Its contents cannot
        // have changed since: a saved tensor written in place would be wrong for
        // backward with or without offload.
        let whole = match fate {
            Fate::Sent(whole) => whole,
            Fate::Kept => {
                stats.kept_for_share += 1;
                stats.kept_for_share_bytes += t.nbytes() as u64;
                drop(stats);
                t.mark_saved(saved_by);
                return Ok(Box::new(Slot::OnDevice(t.detach())));
            }
        };
        stats.share_sent_bytes += counted;
        drop(stats);
        let view = self.send(t, whole)?;
        let mut stats = self.stats.lock().unwrap();
        stats.offloaded += 1;
        stats.offloaded_bytes += t.nbytes() as u64;
        Ok(Box::new(Slot::Offloaded(view)))
    }

    fn unpack(&self, packed: &Packed) -> Result<Tensor> {
        self.backward_begun();
        let view = match downcast(packed)? {
            Slot::OnDevice(t) => return Ok(t.clone()),
            Slot::Offloaded(view) => view,
        };
        let o = &view.copy;
        self.release_in_flight()?;
        self.start_copy_back(o, false)?;
        // Once every view has been unpacked, taken, so that a retained graph's next
        // pass copies it back again rather than keeping a device copy alive between
        // passes.
        let (t, done) = {
            let mut back = o.back.lock().unwrap();
            let (t, done) = back.copy.clone().expect("a copy back was started");
            let mut stats = self.stats.lock().unwrap();
            if back.prefetched {
                stats.prefetched += 1;
            } else {
                stats.fetched_on_demand += 1;
            }
            drop(stats);
            back.unpacked += 1;
            if back.unpacked >= o.views.load(Ordering::Relaxed) {
                *back = Back::default();
            }
            (t, done)
        };
        o.device.current_stream()?.wait(&done)?;
        t.over(&view.layout)
    }

    fn resident(&self, packed: &Packed) -> Option<Tensor> {
        match downcast(packed).ok()? {
            Slot::OnDevice(t) => Some(t.clone()),
            Slot::Offloaded(_) => None,
        }
    }

    fn prefetch(&self, packed: &Packed) -> Result<bool> {
        self.backward_begun();
        if let (true, Slot::Offloaded(view)) = (self.options.prefetch, downcast(packed)?) {
            self.release_in_flight()?;
            self.start_copy_back(&view.copy, true)?;
            return Ok(true);
        }
        Ok(false)
    }
}

impl Drop for OffloadHooks {
    fn drop(&mut self) {
        let _ = self.release_in_flight();
    }
}

/// A copy back never unpacked (the graph was dropped before backward reached it):
/// the compute stream waits for it before its memory can be reused.
impl Drop for Offloaded {
    fn drop(&mut self) {
        if let Some((t, done)) = self.back.get_mut().unwrap().copy.take() {
            if let Ok(compute) = self.device.current_stream() {
                let _ = compute.wait(&done);
            }
            drop(t);
        }
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
