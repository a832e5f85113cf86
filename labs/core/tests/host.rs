//! Pinned host memory, non-blocking copies, mapped and managed memory, and the caching
//! host allocator, on the device under test.

use std::sync::Arc;
use std::time::Duration;

use labs_core::device::{FillPattern, ManagedAdvice, MemLocation};
use labs_core::host::{size_class, HostAllocator, MappedBuffer, PinnedTensor};
use labs_core::kernels::Kernel;
use labs_core::testing::test_device;
use labs_core::timing::calibrate_spin;
use labs_core::{DType, Device, Tensor};
use proptest::prelude::*;

#[test]
fn pinned_tensor_round_trips_asynchronously() {
    let d = test_device();
    let stream = d.new_stream().unwrap();
    let data: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
    let pinned = PinnedTensor::from_slice(&data, &[100, 100], &d).unwrap();
    assert!(pinned.is_pinned());
    let on_device = pinned.to_non_blocking(&d, &stream).unwrap();
    let mut back = PinnedTensor::empty(&[100, 100], DType::F32, &d).unwrap();
    back.copy_from_non_blocking(&on_device, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(back.as_slice::<f32>().unwrap(), &data[..]);
    assert_eq!(on_device.to_vec::<f32>().unwrap(), data);
}

#[test]
fn pin_memory_and_pageable_non_blocking_copy_keep_the_data() {
    let d = test_device();
    let stream = d.new_stream().unwrap();
    let data: Vec<f32> = (0..4096).map(|i| (i % 97) as f32).collect();
    let host = Tensor::from_slice(&data, &[4096], &Device::cpu()).unwrap();
    let pinned = host.pin_memory(&d).unwrap();
    assert_eq!(pinned.as_slice::<f32>().unwrap(), &data[..]);
    let a = pinned.to_non_blocking(&d, &stream).unwrap();
    let b = host.to_non_blocking(&d, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), data);
    assert_eq!(b.to_vec::<f32>().unwrap(), data);
}

#[test]
fn only_pinned_copies_return_before_the_stream_gets_to_them() {
    let d = test_device();
    let stream = d.new_stream().unwrap();
    let x = Tensor::zeros(&[1 << 16], DType::F32, &d).unwrap();
    let spin = calibrate_spin(&x, &stream, Duration::from_millis(60)).unwrap();
    let src = Tensor::zeros(&[1 << 16], DType::F32, &d).unwrap();
    // The zero fill runs on the default stream; the copies below run on another.
    d.synchronize().unwrap();
    let done = d.new_event().unwrap();

    // Pinned: the copy is queued behind the kernel and the call returns at once.
    let mut pinned = PinnedTensor::empty(&[1 << 16], DType::F32, &d).unwrap();
    x.spin_on(spin, &stream).unwrap();
    pinned.copy_from_non_blocking(&src, &stream).unwrap();
    stream.record(&done).unwrap();
    assert!(
        !done.query().unwrap(),
        "a pinned copy waited for the stream"
    );
    done.synchronize().unwrap();

    // Pageable: the same call cannot return before the data has landed.
    let mut pageable = vec![1u8; src.nbytes()];
    x.spin_on(spin, &stream).unwrap();
    unsafe {
        d.backend()
            .copy_dtoh_async(pageable.as_mut_ptr(), src.ptr(), src.nbytes(), &stream)
            .unwrap()
    };
    assert!(stream.query().unwrap(), "a pageable copy returned early");
    assert!(pageable.iter().all(|&b| b == 0));
}

#[test]
fn kernels_read_mapped_host_memory() {
    let d = test_device();
    let n = 1024;
    let mut mapped = MappedBuffer::new(&d, n * 4).unwrap();
    for (i, c) in mapped.as_mut_slice().chunks_mut(4).enumerate() {
        c.copy_from_slice(&(i as f32).to_ne_bytes());
    }
    let out = Tensor::zeros(&[n], DType::F32, &d).unwrap();
    d.launch(&Kernel::scale(mapped.device_ptr(), 2.0, out.ptr(), n))
        .unwrap();
    let v = out.to_vec::<f32>().unwrap();
    assert!(v.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f32));
    // And the other way: a kernel writes host memory in place.
    d.launch(&Kernel::scale(
        mapped.device_ptr(),
        3.0,
        mapped.device_ptr(),
        n,
    ))
    .unwrap();
    d.synchronize().unwrap();
    let first = f32::from_ne_bytes(mapped.as_slice()[4..8].try_into().unwrap());
    assert_eq!(first, 3.0);
}

#[test]
fn managed_memory_is_refused_beyond_free_memory_and_works_within() {
    let d = test_device();
    let backend = d.backend();
    let info = d.mem_info().unwrap();
    let err = backend
        .managed_alloc((info.free + (1 << 30)) as usize)
        .unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");

    let n = 1 << 16;
    let ptr = backend.managed_alloc(n * 4).unwrap();
    let stream = d.new_stream().unwrap();
    backend
        .managed_advise(
            ptr,
            n * 4,
            ManagedAdvice::PreferredLocation(MemLocation::Device),
        )
        .unwrap();
    backend
        .managed_prefetch(ptr, n * 4, MemLocation::Device, &stream)
        .unwrap();
    backend
        .fill(ptr, FillPattern::U32(1.5f32.to_bits()), n, &stream)
        .unwrap();
    backend
        .launch(&Kernel::scale(ptr, 2.0, ptr, n), &stream)
        .unwrap();
    let mut back = vec![0u8; n * 4];
    backend.copy_dtoh(&mut back, ptr, &stream).unwrap();
    assert!(back
        .chunks(4)
        .all(|c| f32::from_ne_bytes(c.try_into().unwrap()) == 3.0));
    backend.managed_free(ptr).unwrap();
}

#[test]
fn freed_blocks_are_cached_and_counted() {
    let d = test_device();
    let a = Arc::new(HostAllocator::new(&d));
    let b1 = a.allocate(5000).unwrap();
    assert_eq!(b1.capacity(), 8192);
    let p = b1.as_ptr();
    drop(b1);
    let b2 = a.allocate(6000).unwrap();
    assert_eq!(
        b2.as_ptr(),
        p,
        "a freed block without streams is reused at once"
    );
    let s = a.stats();
    assert_eq!((s.alloc_calls, s.cache_hits, s.host_alloc_calls), (2, 1, 1));
    assert_eq!(s.allocated_bytes, 8192);
    drop(b2);
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(
        (s.reserved_bytes, s.reserved_peak, s.host_free_calls),
        (0, 8192, 1)
    );
    assert_eq!(a.recount(), s);
}

#[test]
fn a_block_waits_for_the_copy_that_used_it() {
    let d = test_device();
    let a = Arc::new(HostAllocator::new(&d));
    let stream = d.new_stream().unwrap();
    let x = Tensor::zeros(&[1 << 16], DType::F32, &d).unwrap();
    let spin = calibrate_spin(&x, &stream, Duration::from_millis(40)).unwrap();
    let dst = d.raw_buffer(4096).unwrap();

    let block = a.allocate(4096).unwrap();
    let p = block.as_ptr();
    x.spin_on(spin, &stream).unwrap();
    block
        .copy_to_device_async(dst.ptr(), 4096, &stream)
        .unwrap();
    drop(block);
    assert_eq!(a.stats().pending_blocks, 1);
    let other = a.allocate(4096).unwrap();
    assert_ne!(other.as_ptr(), p, "handed out while its copy was queued");
    stream.synchronize().unwrap();
    let again = a.allocate(4096).unwrap();
    assert_eq!(again.as_ptr(), p, "reused once the copy finished");
    assert_eq!(a.recount(), a.stats());
}

#[test]
fn size_classes_are_powers_of_two() {
    assert_eq!(size_class(0), 4096);
    assert_eq!(size_class(4097), 8192);
    assert_eq!(size_class(1 << 20), 1 << 20);
    assert_eq!(size_class((1 << 20) + 1), 2 << 20);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    /// Free the i-th live block (modulo), after `spin` iterations of work and a copy
    /// that read it on the stream.
    Free {
        index: usize,
        spin: u32,
        copy: bool,
    },
    Process,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..70_000).prop_map(Op::Alloc),
        3 => (any::<usize>(), 0u32..40, any::<bool>())
            .prop_map(|(index, spin, copy)| Op::Free { index, spin, copy }),
        1 => Just(Op::Process),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn host_allocator_invariants(ops in proptest::collection::vec(op(), 1..40)) {
        let d = test_device();
        let a = Arc::new(HostAllocator::new(&d));
        let stream = d.new_stream().unwrap();
        let x = Tensor::zeros(&[1 << 12], DType::F32, &d).unwrap();
        let dst = d.raw_buffer(1 << 17).unwrap();
        let mut live = Vec::new();
        // Events the test itself records before each free, per block address: when the
        // allocator hands a block out again, every one of them must have completed.
        let mut uses: Vec<(usize, labs_core::Event)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(n) => {
                    let b = a.allocate(n).unwrap();
                    let p = b.as_ptr() as usize;
                    for (q, e) in &uses {
                        if *q == p {
                            prop_assert!(e.query().unwrap(), "block {p:#x} handed out while in use");
                        }
                    }
                    uses.retain(|(q, _)| *q != p);
                    live.push(b);
                }
                Op::Free { index, spin, copy } if !live.is_empty() => {
                    let b = live.swap_remove(index % live.len());
                    if copy {
                        x.spin_on(spin * 64, &stream).unwrap();
                        b.copy_to_device_async(dst.ptr(), b.len().min(1 << 17), &stream).unwrap();
                        let e = d.new_event().unwrap();
                        stream.record(&e).unwrap();
                        uses.push((b.as_ptr() as usize, e));
                    }
                    drop(b);
                }
                Op::Free { .. } => {}
                Op::Process => a.process_events().unwrap(),
            }
            let blocks = a.live_blocks();
            for w in blocks.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0, "live blocks overlap: {w:?}");
            }
            prop_assert_eq!(blocks.len(), live.len());
            prop_assert_eq!(a.recount(), a.stats());
        }
        drop(live);
        // `x` goes back to the shared device allocator: its kernels must be done.
        stream.synchronize().unwrap();
        a.empty_cache().unwrap();
        prop_assert_eq!(a.stats().reserved_bytes, 0);
        prop_assert_eq!(a.recount(), a.stats());
    }
}
