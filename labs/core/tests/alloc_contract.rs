//! The caching allocator needs only the memory half of the device contract
//! (`MemoryBackend`: memory, virtual memory, streams and events), never kernels, copies
//! or host memory: a device that offers nothing else (here the simulated GPU seen
//! through that half alone, counting its driver calls) runs it under both of PyTorch's
//! segment kinds, and a cached pair makes no driver call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use labs_core::alloc::{Allocator, Config};
use labs_core::backend::{
    AsyncPool, AsyncPools, DeviceId, DevicePtr, Event, MemInfo, Memory, MemoryBackend,
    PhysicalMemory, PoolAttribute, Stream, Streams, VirtualMemory,
};
use labs_core::sim::SimBackend;
use labs_core::Result;

/// The simulated GPU behind the memory half of the contract alone.
struct MemoryOnly {
    sim: SimBackend,
    driver_calls: AtomicU64,
}

impl MemoryOnly {
    fn call(&self) {
        self.driver_calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl Memory for MemoryOnly {
    fn raw_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.call();
        self.sim.raw_alloc(bytes)
    }
    fn raw_free(&self, ptr: DevicePtr) -> Result<()> {
        self.call();
        self.sim.raw_free(ptr)
    }
    fn raw_alloc_async(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        self.call();
        self.sim.raw_alloc_async(bytes, stream)
    }
    fn raw_free_async(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        self.call();
        self.sim.raw_free_async(ptr, stream)
    }
}

impl VirtualMemory for MemoryOnly {
    fn vm_granularity(&self) -> Result<usize> {
        self.sim.vm_granularity()
    }
    fn vm_reserve(&self, bytes: usize) -> Result<DevicePtr> {
        self.call();
        self.sim.vm_reserve(bytes)
    }
    fn vm_release(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        self.call();
        self.sim.vm_release(base, bytes)
    }
    fn vm_create(&self, bytes: usize) -> Result<PhysicalMemory> {
        self.call();
        self.sim.vm_create(bytes)
    }
    fn vm_map_memory(&self, ptr: DevicePtr, memory: PhysicalMemory) -> Result<()> {
        self.call();
        self.sim.vm_map_memory(ptr, memory)
    }
    fn vm_set_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.call();
        self.sim.vm_set_access(ptr, bytes)
    }
    fn vm_access(&self, ptr: DevicePtr, device: DeviceId) -> Result<bool> {
        self.sim.vm_access(ptr, device)
    }
    fn vm_unmap_memory(&self, ptr: DevicePtr, bytes: usize) -> Result<PhysicalMemory> {
        self.call();
        self.sim.vm_unmap_memory(ptr, bytes)
    }
    fn vm_free_memory(&self, memory: PhysicalMemory) -> Result<()> {
        self.call();
        self.sim.vm_free_memory(memory)
    }
}

impl Streams for MemoryOnly {
    fn default_stream(&self) -> Result<Stream> {
        self.sim.default_stream()
    }
    fn new_stream(&self, priority: i32) -> Result<Stream> {
        self.sim.new_stream(priority)
    }
    fn new_event(&self) -> Result<Event> {
        self.sim.new_event()
    }
    fn synchronize(&self) -> Result<()> {
        self.sim.synchronize()
    }
}

impl AsyncPools for MemoryOnly {
    fn pool_default(&self) -> Result<AsyncPool> {
        self.sim.pool_default()
    }
    fn pool_create(&self) -> Result<AsyncPool> {
        self.sim.pool_create()
    }
    fn pool_destroy(&self, pool: AsyncPool) -> Result<()> {
        self.sim.pool_destroy(pool)
    }
    fn pool_alloc_async(
        &self,
        pool: AsyncPool,
        bytes: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        self.call();
        self.sim.pool_alloc_async(pool, bytes, stream)
    }
    fn pool_attribute(&self, pool: AsyncPool, attribute: PoolAttribute) -> Result<u64> {
        self.sim.pool_attribute(pool, attribute)
    }
    fn pool_set_attribute(
        &self,
        pool: AsyncPool,
        attribute: PoolAttribute,
        value: u64,
    ) -> Result<()> {
        self.sim.pool_set_attribute(pool, attribute, value)
    }
    fn pool_trim_to(&self, pool: AsyncPool, keep: u64) -> Result<()> {
        self.sim.pool_trim_to(pool, keep)
    }
}

impl MemoryBackend for MemoryOnly {
    fn id(&self) -> DeviceId {
        self.sim.id()
    }
    fn mem_info(&self) -> Result<MemInfo> {
        self.sim.mem_info()
    }
}

#[test]
fn the_allocator_runs_on_the_memory_half_of_the_contract() {
    for conf in ["expandable_segments:False", "expandable_segments:True"] {
        let device = Arc::new(MemoryOnly {
            sim: SimBackend::new(DeviceId::Sim(0), 1 << 30),
            driver_calls: AtomicU64::new(0),
        });
        let allocator = Allocator::new(device.clone(), Config::parse(conf).unwrap()).unwrap();
        let stream = device.default_stream().unwrap();
        let sizes = [512, 1 << 20, 20 << 20, 3 << 20];
        let blocks: Vec<_> = (sizes.iter())
            .map(|&s| allocator.malloc(s, &stream).unwrap())
            .collect();
        let warm = device.driver_calls.load(Ordering::Relaxed);
        assert!(warm > 0, "{conf}: the first blocks came from the device");
        for b in blocks {
            allocator.free(b).unwrap();
        }
        // Freed blocks are cached: the same requests again cost no driver call.
        for _ in 0..100 {
            for &s in &sizes {
                let b = allocator.malloc(s, &stream).unwrap();
                allocator.free(b).unwrap();
            }
        }
        assert_eq!(
            device.driver_calls.load(Ordering::Relaxed),
            warm,
            "{conf}: cached pairs called the driver"
        );
        assert!(allocator.empty_cache().unwrap() > 0, "{conf}");
        assert!(device.driver_calls.load(Ordering::Relaxed) > warm, "{conf}");
        assert_eq!(allocator.stats().allocated.current, 0, "{conf}");
    }
}
