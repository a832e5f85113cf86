//! The lab's experiments on simulated GPUs, which every machine has (two, or
//! `LABS_SIM_DEVICES`, and private ones where figures must not be shared): the
//! exercises (scatter and gather, DDP's buckets), each device's own allocator, and
//! replication's memory. On two GPUs the binary shows the same.

use lab_04::exercises::{buckets, gather, scatter};
use lab_04::{caches, every_device, replicate};
use labs_core::dist::{assign_buckets, BucketInput};
use labs_core::{DType, Device, DeviceId, Tensor};

/// Two simulated GPUs of this test's own (`new_sim` makes extras), for figures that
/// other tests' allocations must not disturb.
fn private_pair() -> Vec<Device> {
    vec![Device::new_sim(1 << 30), Device::new_sim(1 << 30)]
}

fn sims() -> Vec<Device> {
    let first = Device::get(DeviceId::Sim(0)).unwrap();
    let devices = every_device(&first).unwrap();
    assert!(devices.len() >= 2, "{devices:?}");
    devices
}

#[test]
fn scatter_chunks_like_torch_chunk_and_gather_restores_the_batch() {
    let devices = sims();
    let k = devices.len();
    for rows in [1, k - 1, k, 3 * k + 1] {
        let data: Vec<f32> = (0..rows * 3).map(|i| i as f32).collect();
        let batch = Tensor::from_slice(&data, &[rows, 3], &devices[0]).unwrap();
        let shards = scatter(&batch, &devices).unwrap();
        let chunk = rows.div_ceil(k);
        assert_eq!(shards.len(), rows.div_ceil(chunk), "{rows} rows");
        let mut seen = 0;
        for (i, s) in shards.iter().enumerate() {
            assert_eq!(s.device().id(), devices[i].id());
            let n = chunk.min(rows - seen);
            assert_eq!(s.shape(), [n, 3]);
            assert_eq!(s.to_vec::<f32>().unwrap(), data[seen * 3..(seen + n) * 3]);
            seen += n;
        }
        let back = gather(&shards, &devices[0]).unwrap();
        assert_eq!(back.device().id(), devices[0].id());
        assert_eq!(back.to_vec::<f32>().unwrap(), data);
    }
}

#[test]
fn each_allocator_sees_only_its_device() {
    let devices = private_pair();
    let unit = 2 << 20;
    let rows = caches::measure(&devices, unit).unwrap();
    assert_eq!(rows.len(), devices.len());
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.tensor, ((i + 1) * unit) as u64);
        assert!(
            r.allocated >= r.tensor && r.reserved >= r.allocated,
            "{r:?}"
        );
        assert!(r.cached >= r.tensor, "freed memory stays cached: {r:?}");
    }
    assert_eq!(rows[0].after_empty, 0, "{:?}", rows[0]);
    for r in &rows[1..] {
        assert_eq!(
            r.after_empty, r.cached,
            "another device's empty_cache: {r:?}"
        );
    }
}

#[test]
fn replication_computes_what_one_device_does_and_weighs_most_on_the_first() {
    let devices = private_pair();
    let s = replicate::Sizes::for_devices(&devices, true);
    let (output, rows) = replicate::measure(&devices, s).unwrap();
    let want = replicate::reference(&devices[0], s).unwrap();
    assert_eq!(output.device().id(), devices[0].id());
    assert_eq!(output.shape(), want.shape());
    let (got, want) = (
        output.to_vec::<f32>().unwrap(),
        want.to_vec::<f32>().unwrap(),
    );
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 + 1e-5 * w.abs(), "{g} vs {w}");
    }
    let params = ((2 * s.width * s.hidden + s.hidden + s.width) * 4) as u64;
    for r in &rows {
        assert_eq!(r.parameters, params, "{r:?}");
        assert!(r.peak >= r.parameters, "{r:?}");
    }
    for r in &rows[1..] {
        assert!(rows[0].peak > r.peak, "{:?} vs {r:?}", rows[0]);
    }
}

#[test]
fn buckets_by_hand_are_ddps() {
    // The first bucket holds up to 40 bytes, the others 80; the last parameter first.
    assert_eq!(
        buckets(&[20, 20, 40, 40, 20, 20], 40, 80),
        vec![vec![5, 4], vec![3, 2], vec![1, 0]]
    );
    // A parameter larger than the cap is alone.
    assert_eq!(buckets(&[4, 400, 4], 8, 8), vec![vec![2], vec![1], vec![0]]);
    assert!(buckets(&[], 8, 8).is_empty());
    // Against the library's assignment, on sizes from a fixed generator.
    let mut x: u64 = 7;
    for case in 0..50 {
        let n = 1 + case % 17;
        let bytes: Vec<usize> = (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                4 * (1 + (x >> 33) as usize % 3000)
            })
            .collect();
        let inputs: Vec<BucketInput> = bytes
            .iter()
            .map(|&b| BucketInput {
                dtype: DType::F32,
                numel: b / 4,
            })
            .collect();
        let (first, cap) = (4096 + 4 * case, 12_000);
        assert_eq!(
            buckets(&bytes, first, cap),
            assign_buckets(&inputs, first, cap).unwrap(),
            "{bytes:?}"
        );
    }
}

/// The memory outside the allocator: on simulated GPUs there is none (no context, no
/// NCCL), and the first all-reduce's buffer is the allocator's; on GPUs (with
/// `LABS_DEVICE=cuda` and two or more of them) the context and NCCL's communicator take
/// memory the allocator never reserved.
#[test]
fn memory_outside_the_allocator_is_the_context_and_nccls() {
    // Named, not opened: test_device() would make cuda:0's allocator and its workspace.
    let on_gpu = std::env::var("LABS_DEVICE").is_ok_and(|v| v.trim().starts_with("cuda"));
    let devices: Vec<labs_core::Device> = if on_gpu {
        let n = labs_core::device::device_count(labs_core::device::DeviceKind::Cuda).unwrap();
        (0..n)
            .map(|i| labs_core::Device::get(labs_core::DeviceId::Cuda(i)).unwrap())
            .collect()
    } else {
        vec![
            labs_core::Device::new_sim(1 << 30),
            labs_core::Device::new_sim(1 << 30),
        ]
    };
    let rows = lab_04::outside::run(&devices).unwrap();
    assert_eq!(rows.len(), devices.len());
    for r in &rows {
        // The 1 MiB buffer of the all-reduce is the allocator's, in a 2 MiB segment (on a
        // GPU other tests of this file may have left more in the cache).
        assert!(r.reserved >= 2 << 20, "{r:?}");
        if on_gpu {
            assert!(r.context > 0, "{r:?}");
            assert!(
                r.outside() > r.context,
                "NCCL's memory is outside too: {r:?}"
            );
        } else {
            assert_eq!(r.reserved, 2 << 20, "{r:?}");
            assert_eq!((r.context, r.communicator, r.outside()), (0, 0, 0), "{r:?}");
            assert_eq!(r.first_collective, r.reserved);
        }
    }
    let table = lab_04::outside::table(&rows);
    assert!(table.contains("outside the allocator MiB"), "{table}");
}
