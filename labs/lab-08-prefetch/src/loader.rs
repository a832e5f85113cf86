//! A data pipeline in the spirit of `DataLoader(pin_memory=True)` followed by a
//! `PrefetchLoader`. Worker threads build batches in pinned buffers from the host
//! allocator; the prefetcher copies batch N+1 on its own stream while the compute
//! stream works on batch N, and events order the two.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use labs_core::device::{DevicePtr, RawBuffer};
use labs_core::host::{HostAllocator, PinnedBuffer};
use labs_core::{Device, Event, Result, Stream};

/// What the workers write into a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Every value, from the synthetic dataset (what a real collate step costs).
    Full,
    /// Only the first value of each sample: the benchmark measures the transfer
    /// pipeline, and a host thread cannot write bytes as fast as PCIe moves them.
    Header,
}

#[derive(Debug, Clone, Copy)]
pub struct LoaderConfig {
    /// Samples per batch.
    pub batch_size: usize,
    /// f32 values per sample.
    pub sample_elems: usize,
    pub batches: usize,
    pub workers: usize,
    /// Batches ready ahead of the consumer, host side and device side each.
    pub prefetch_depth: usize,
    pub fill: Fill,
}

impl LoaderConfig {
    pub fn batch_elems(&self) -> usize {
        self.batch_size * self.sample_elems
    }
    pub fn batch_bytes(&self) -> usize {
        self.batch_elems() * 4
    }
}

/// The synthetic dataset: value `j` of sample `s`. Cheap, and checkable on arrival.
pub fn sample_value(sample: usize, j: usize) -> f32 {
    ((sample * 31 + j * 7) % 1024) as f32
}

pub struct HostBatch {
    pub index: usize,
    pub data: PinnedBuffer,
}

// ANCHOR: host_loader
/// Worker threads producing batches into pinned buffers, delivered in order. Worker
/// `w` builds batches `w`, `w + workers`, ...; each has its own bounded queue, so at
/// most `prefetch_depth` batches (rounded up to whole workers) wait in pinned memory.
pub struct HostLoader {
    queues: Vec<Receiver<Result<HostBatch>>>,
    workers: Vec<JoinHandle<()>>,
    next: usize,
    total: usize,
}

impl HostLoader {
    /// Batches in pinned memory from the device's shared host allocator.
    pub fn new(device: &Device, config: LoaderConfig) -> HostLoader {
        HostLoader::with_allocator(HostAllocator::get(device), config)
    }

    /// Batches from a pool of one's own: a benchmark then sees only its own blocks,
    /// whatever other code left in (or takes from) the shared pool.
    pub fn with_allocator(allocator: Arc<HostAllocator>, config: LoaderConfig) -> HostLoader {
        let workers = config.workers.max(1);
        let per_worker = config.prefetch_depth.div_ceil(workers).max(1);
        let mut queues = Vec::new();
        let mut handles = Vec::new();
        for w in 0..workers {
            let (tx, rx) = sync_channel(per_worker);
            let allocator: Arc<HostAllocator> = allocator.clone();
            let handle = std::thread::Builder::new()
                .name(format!("loader-worker-{w}"))
                .spawn(move || {
                    for index in (w..config.batches).step_by(workers) {
                        let batch = build(&allocator, &config, index);
                        // The loader was dropped: stop early.
                        if tx.send(batch).is_err() {
                            return;
                        }
                    }
                })
                .expect("spawning a loader worker");
            queues.push(rx);
            handles.push(handle);
        }
        HostLoader {
            queues,
            workers: handles,
            next: 0,
            total: config.batches,
        }
    }
}

fn build(allocator: &Arc<HostAllocator>, config: &LoaderConfig, index: usize) -> Result<HostBatch> {
    let mut data = allocator.allocate(config.batch_bytes())?;
    let values: &mut [f32] = {
        let bytes = data.as_mut_slice();
        // SAFETY: pinned blocks are page aligned and hold `batch_elems` f32 values.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, bytes.len() / 4) }
    };
    for (s, sample) in values.chunks_mut(config.sample_elems).enumerate() {
        let global = index * config.batch_size + s;
        match config.fill {
            Fill::Full => {
                for (j, v) in sample.iter_mut().enumerate() {
                    *v = sample_value(global, j);
                }
            }
            Fill::Header => sample[0] = sample_value(global, 0),
        }
    }
    Ok(HostBatch { index, data })
}

impl Iterator for HostLoader {
    type Item = Result<HostBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let queue = &self.queues[self.next % self.queues.len()];
        self.next += 1;
        Some(queue.recv().unwrap_or_else(|_| {
            Err(labs_core::Error::InvalidArgument(
                "a loader worker stopped".into(),
            ))
        }))
    }
}

impl Drop for HostLoader {
    fn drop(&mut self) {
        // Closing the queues ends the workers at their next send.
        self.queues.clear();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
// ANCHOR_END: host_loader

/// A batch on the device. It is valid for work enqueued on the compute stream until
/// the next call to `next_batch`.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBatch {
    pub index: usize,
    pub ptr: DevicePtr,
    pub elems: usize,
}

struct Slot {
    buffer: RawBuffer,
    /// Recorded on the copy stream after the batch's copy.
    copied: Event,
    /// Recorded on the compute stream once the consumer has moved on.
    released: Event,
}

// ANCHOR: prefetch_loader
/// Keeps `depth` batches in flight to the device. Device buffers are a ring of
/// `depth + 1` slots allocated once: one for the batch being computed on, `depth` being
/// filled.
pub struct PrefetchLoader {
    host: HostLoader,
    copy_stream: Stream,
    slots: Vec<Slot>,
    in_flight: VecDeque<(usize, usize)>,
    next_slot: usize,
    current: Option<usize>,
    elems: usize,
}

impl PrefetchLoader {
    pub fn new(device: &Device, config: LoaderConfig) -> Result<PrefetchLoader> {
        PrefetchLoader::with_allocator(device, HostAllocator::get(device), config)
    }

    /// As `new`, with the host batches from `allocator` (see `HostLoader::with_allocator`).
    pub fn with_allocator(
        device: &Device,
        allocator: Arc<HostAllocator>,
        config: LoaderConfig,
    ) -> Result<PrefetchLoader> {
        let depth = config.prefetch_depth.max(1);
        let slots = (0..=depth)
            .map(|_| {
                Ok(Slot {
                    buffer: device.raw_buffer(config.batch_bytes())?,
                    copied: device.new_event()?,
                    released: device.new_event()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PrefetchLoader {
            host: HostLoader::with_allocator(allocator, config),
            // A copy stream of its own, so copies never queue behind kernels.
            copy_stream: device.new_stream()?,
            slots,
            in_flight: VecDeque::new(),
            next_slot: 0,
            current: None,
            elems: config.batch_elems(),
        })
    }

    /// The next batch, with `compute` made to wait for its copy. The previous batch's
    /// slot is released to the copy stream once `compute` has finished with it.
    pub fn next_batch(&mut self, compute: &Stream) -> Result<Option<DeviceBatch>> {
        if let Some(done) = self.current.take() {
            compute.record(&self.slots[done].released)?;
        }
        while self.in_flight.len() < self.slots.len() - 1 {
            let Some(batch) = self.host.next() else { break };
            let batch = batch?;
            let slot = &self.slots[self.next_slot];
            // Do not overwrite a slot the compute stream may still be reading.
            self.copy_stream.wait(&slot.released)?;
            batch.data.copy_to_device_async(
                slot.buffer.ptr(),
                batch.data.len(),
                &self.copy_stream,
            )?;
            self.copy_stream.record(&slot.copied)?;
            self.in_flight.push_back((self.next_slot, batch.index));
            self.next_slot = (self.next_slot + 1) % self.slots.len();
            // Dropping the pinned buffer is safe: the allocator keeps it out of the
            // pool until an event after the copy completes.
            drop(batch);
        }
        let Some((slot, index)) = self.in_flight.pop_front() else {
            return Ok(None);
        };
        compute.wait(&self.slots[slot].copied)?;
        self.current = Some(slot);
        Ok(Some(DeviceBatch {
            index,
            ptr: self.slots[slot].buffer.ptr(),
            elems: self.elems,
        }))
    }
}
// ANCHOR_END: prefetch_loader
