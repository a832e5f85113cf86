//! Several devices: how many there are, the current device and its guard, operations
//! across devices, copies between them (peer, staged, through the host) and each
//! device's own allocator. Tests that need two devices use simulated GPUs, which every
//! machine has; on a GPU (`LABS_DEVICE=cuda`) the GPU tests check the second GPU when
//! there is one, and that `cuda:1` is refused when there is not.

use labs_core::device::{
    current_device, device_count, set_sim_device_count, with_device, CopyPath, CopyVia,
    DeviceGuard, DeviceKind, ENV_DEVICE, ENV_SIM_PEER, STAGING_CHUNK,
};
use labs_core::testing::test_device;
use labs_core::{select_device, DType, Device, DeviceId, Error, Tensor};

/// Every test asks for the same count, so none depends on which runs first.
/// `sim:0` to `sim:3` are shared; `sim:4` and `sim:5` belong to the statistics test
/// alone, whose figures other tests' allocations would disturb.
const SIMS: usize = 6;

fn sim(index: usize) -> Device {
    set_sim_device_count(SIMS).unwrap();
    Device::get(DeviceId::Sim(index)).unwrap()
}

fn sim_peer_disabled() -> bool {
    std::env::var(ENV_SIM_PEER).is_ok_and(|v| v.trim() == "0")
}

fn cuda_expected() -> bool {
    std::env::var(ENV_DEVICE).is_ok_and(|v| v.trim().starts_with("cuda"))
}

/// `n` distinct float32 values that survive any copy bit for bit.
fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.5 - 7.25).collect()
}

#[test]
fn simulated_gpus_exist_up_to_the_count_and_not_beyond() {
    let devices: Vec<Device> = (0..SIMS).map(sim).collect();
    assert_eq!(device_count(DeviceKind::Sim).unwrap(), SIMS);
    assert_eq!(device_count(DeviceKind::Dry).unwrap(), SIMS);
    assert_eq!(device_count(DeviceKind::Cpu).unwrap(), 1);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.id(), DeviceId::Sim(i));
        assert_eq!(d.index(), Some(i));
        assert!(Device::get(DeviceId::Sim(i)).unwrap().same(d));
    }
    assert!(!devices[0].same(&devices[1]));
    // Beyond the count, except where `new_sim` registers extras (another test does).
    for id in [DeviceId::Sim(SIMS + 100), DeviceId::Dry(SIMS + 100)] {
        let err = Device::get(id).unwrap_err();
        assert!(matches!(
            err,
            Error::NoSuchDevice {
                available: SIMS,
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            format!(
                "invalid device ordinal: {id} requested, but there are {SIMS} {} devices \
                 (LABS_SIM_DEVICES sets how many)",
                id.kind()
            )
        );
    }
}

#[test]
fn a_missing_gpu_is_refused_in_the_same_words() {
    let n = device_count(DeviceKind::Cuda).unwrap();
    if cuda_expected() {
        assert!(
            n >= 1,
            "LABS_DEVICE asks for a GPU, but the driver reports none"
        );
    }
    if n == 0 {
        // No driver (or no GPU): opening one says why.
        assert!(Device::get(DeviceId::Cuda(0)).is_err());
        return;
    }
    let err = Device::get(DeviceId::Cuda(n)).unwrap_err();
    let (verb, plural) = if n == 1 { ("is", "") } else { ("are", "s") };
    assert_eq!(
        err.to_string(),
        format!(
            "invalid device ordinal: cuda:{n} requested, but there {verb} {n} cuda device{plural}"
        )
    );
    // A one-GPU machine has no cuda:1; a larger one does, and says whether the two
    // GPUs reach each other's memory.
    let second = Device::get(DeviceId::Cuda(1));
    if n == 1 {
        assert!(matches!(
            second,
            Err(Error::NoSuchDevice { available: 1, .. })
        ));
    } else {
        let (a, b) = (Device::get(DeviceId::Cuda(0)).unwrap(), second.unwrap());
        assert_eq!(
            a.can_access_peer(&b).unwrap(),
            b.can_access_peer(&a).unwrap()
        );
        assert!(!a.can_access_peer(&a).unwrap());
    }
}

#[test]
fn new_sims_are_extras_after_the_configured_ones() {
    set_sim_device_count(SIMS).unwrap();
    let extra = Device::new_sim(64 << 20);
    let index = extra.index().unwrap();
    assert!(index >= SIMS, "{}", extra.id());
    assert_eq!(extra.mem_info().unwrap().total, 64 << 20);
    assert!(Device::get(extra.id()).unwrap().same(&extra));
    assert_eq!(device_count(DeviceKind::Sim).unwrap(), SIMS);
    assert!(set_sim_device_count(0).is_err());
}

#[test]
fn the_current_device_is_per_thread_and_guards_restore_it() {
    assert_eq!(current_device(), 0);
    {
        let outer = DeviceGuard::new(2).unwrap();
        assert_eq!((current_device(), outer.previous()), (2, 0));
        // Another thread has its own current device.
        assert_eq!(std::thread::spawn(current_device).join().unwrap(), 0);
        let inner = with_device(1, current_device).unwrap();
        assert_eq!(inner, 1);
        assert_eq!(current_device(), 2);
    }
    assert_eq!(current_device(), 0);
    // A panic inside the scope restores the previous device too.
    let result = std::panic::catch_unwind(|| with_device(3, || panic!("inside")));
    assert!(result.is_err());
    assert_eq!(current_device(), 0);
}

#[test]
fn work_without_a_device_lands_on_the_guarded_one() {
    let (d1, d3) = (sim(1), sim(3));
    let t = with_device(3, || {
        Tensor::zeros(&[4], DType::F32, &Device::current(DeviceKind::Sim)?)
    })
    .unwrap()
    .unwrap();
    assert_eq!(t.device().id(), d3.id());
    assert_eq!(t.to_vec::<f32>().unwrap(), [0.0; 4]);
    // A kind without an index is the current device of that kind; with one, that one.
    with_device(1, || {
        assert_eq!(select_device(Some("sim")).unwrap().device.id(), d1.id());
        assert_eq!(select_device(Some("sim:3")).unwrap().device.id(), d3.id());
    })
    .unwrap();
    assert_eq!(
        select_device(Some("sim")).unwrap().device.id(),
        DeviceId::Sim(0)
    );
    // An index that does not exist is refused when a device is made from it.
    let err = with_device(SIMS + 100, || Device::current(DeviceKind::Sim).map(|_| ())).unwrap();
    assert!(matches!(err, Err(Error::NoSuchDevice { .. })));
}

#[test]
fn the_gpu_guard_switches_gpus_or_refuses_a_missing_one() {
    let d = test_device();
    if !d.is_cuda() {
        // The simulator's guard is the index alone, tested above.
        assert_eq!(
            with_device(0, || Device::current(DeviceKind::Sim).unwrap().id()).unwrap(),
            DeviceId::Sim(0)
        );
        return;
    }
    let n = device_count(DeviceKind::Cuda).unwrap();
    let here = with_device(0, || Device::current(DeviceKind::Cuda))
        .unwrap()
        .unwrap();
    assert!(here.same(&d));
    let second = with_device(1, || Device::current(DeviceKind::Cuda)).unwrap();
    if n == 1 {
        assert!(matches!(
            second,
            Err(Error::NoSuchDevice { available: 1, .. })
        ));
        return;
    }
    let second = second.unwrap();
    assert_eq!(second.id(), DeviceId::Cuda(1));
    let data = ramp(1 << 20);
    let x = Tensor::from_slice(&data, &[1 << 20], &d).unwrap();
    let (y, path) = x.to_via(&second, CopyVia::Any).unwrap();
    let expected = if second.can_access_peer(&d).unwrap() {
        CopyPath::Peer
    } else {
        CopyPath::Staged
    };
    assert_eq!(path, expected);
    assert_eq!(y.to_vec::<f32>().unwrap(), data);
    let (z, path) = y.to_via(&d, CopyVia::Staged).unwrap();
    assert_eq!(path, CopyPath::Staged);
    assert_eq!(z.to_vec::<f32>().unwrap(), data);
}

#[test]
fn operations_across_devices_fail_with_pytorchs_message() {
    let (a, b) = (sim(1), sim(2));
    let x = Tensor::full(&[3], 1.0f32, &a).unwrap();
    let y = Tensor::full(&[3], 2.0f32, &b).unwrap();
    assert_eq!(
        x.add(&y).unwrap_err().to_string(),
        "Expected all tensors to be on the same device, but found at least two devices, \
         sim:1 and sim:2!"
    );
    assert!(matches!(
        y.matmul(&x.view(&[3, 1]).unwrap()),
        Err(Error::DeviceMismatch { .. })
    ));
    // Moved to one device, the same operation runs.
    assert_eq!(
        x.add(&y.to(&a).unwrap()).unwrap().to_vec::<f32>().unwrap(),
        [3.0; 3]
    );
}

#[test]
fn copies_between_simulated_gpus_are_peer_copies_and_exact() {
    let (a, b) = (sim(1), sim(2));
    assert_eq!(a.can_access_peer(&b).unwrap(), !sim_peer_disabled());
    assert!(!a.can_access_peer(&a).unwrap());
    assert!(!a.can_access_peer(&Device::cpu()).unwrap());
    let data = ramp(6 * 5);
    let x = Tensor::from_slice(&data, &[6, 5], &a).unwrap();
    let (y, path) = x.to_via(&b, CopyVia::Any).unwrap();
    let expected = if sim_peer_disabled() {
        CopyPath::Staged
    } else {
        CopyPath::Peer
    };
    assert_eq!(path, expected);
    assert_eq!(y.device().id(), b.id());
    assert_eq!(y.to_vec::<f32>().unwrap(), data);
    // A strided view arrives as its elements in order.
    let xt = x.transpose(0, 1).unwrap();
    let yt = xt.to(&b).unwrap();
    assert_eq!(yt.shape(), [5, 6]);
    assert!(yt.is_contiguous());
    assert_eq!(yt.to_vec::<f32>().unwrap(), xt.to_vec::<f32>().unwrap());
    // `to` the device a tensor is on is the tensor itself.
    assert!(y.to(&b).unwrap().shares_storage(&y));
}

#[test]
fn staged_copies_cross_chunk_boundaries_exactly() {
    let (a, b) = (sim(2), sim(3));
    // Two chunks and a ragged tail, each way.
    let n = (2 * STAGING_CHUNK + 4 * 1001) / 4;
    let data = ramp(n);
    let x = Tensor::from_slice(&data, &[n], &a).unwrap();
    let (y, path) = x.to_via(&b, CopyVia::Staged).unwrap();
    assert_eq!(path, CopyPath::Staged);
    assert_eq!(y.to_vec::<f32>().unwrap(), data);
    let (back, _) = y.to_via(&a, CopyVia::Staged).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), data);
}

#[test]
fn a_copy_waits_for_the_work_that_produces_its_source() {
    let (a, b) = (sim(1), sim(3));
    let n = 1 << 20;
    let data = ramp(n);
    let expected: Vec<f32> = data.iter().map(|v| v * 3.0 + 1.0).collect();
    for via in [CopyVia::Any, CopyVia::Staged] {
        let x = Tensor::from_slice(&data, &[n], &a).unwrap();
        // Queued on `a`'s stream; the copy must not read the memory before it is written.
        let y = x.mul_scalar(3.0).unwrap().add_scalar(1.0).unwrap();
        let (z, _) = y.to_via(&b, via).unwrap();
        // The source freed at once and its memory reused by new work on `a` must not
        // reach the copy either.
        drop(y);
        let _overwrite = Tensor::full(&[n], -1.0f32, &a).unwrap();
        assert_eq!(z.to_vec::<f32>().unwrap(), expected, "{via:?}");
    }
}

#[test]
fn copies_to_the_host_or_another_kind_go_through_host_memory() {
    let d = test_device();
    let other = sim(1);
    let data = ramp(1000);
    let x = Tensor::from_slice(&data, &[1000], &d).unwrap();
    let (y, path) = x.to_via(&other, CopyVia::Any).unwrap();
    // The device under test is sim:0 on the simulator (a peer), a GPU otherwise.
    let expected = if d.is_cuda() {
        CopyPath::Host
    } else if sim_peer_disabled() {
        CopyPath::Staged
    } else {
        CopyPath::Peer
    };
    assert_eq!(path, expected);
    assert_eq!(y.to_vec::<f32>().unwrap(), data);
    let (h, path) = y.to_via(&Device::cpu(), CopyVia::Any).unwrap();
    assert_eq!(path, CopyPath::Host);
    let (back, _) = h.to_via(&d, CopyVia::Any).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), data);
    assert!(
        x.to_via(&d, CopyVia::Any).is_err(),
        "a device to itself is no transfer"
    );
}

#[test]
fn dry_runs_copy_allocations_only() {
    set_sim_device_count(SIMS).unwrap();
    let (d1, d2) = (
        Device::get(DeviceId::Dry(1)).unwrap(),
        Device::get(DeviceId::Dry(2)).unwrap(),
    );
    let x = Tensor::empty(&[1 << 18], DType::F32, &d1).unwrap();
    let before = d2.allocator().unwrap().memory_allocated();
    let (y, path) = x.to_via(&d2, CopyVia::Any).unwrap();
    assert_eq!(
        path,
        if sim_peer_disabled() {
            CopyPath::Staged
        } else {
            CopyPath::Peer
        }
    );
    assert_eq!(
        d2.allocator().unwrap().memory_allocated(),
        before + (1 << 20)
    );
    assert!(y.to_vec::<f32>().is_err(), "a dry run has no values");
    // A simulated GPU's values cannot come from a dry run.
    assert!(x.to(&sim(2)).is_err());
}

#[test]
fn each_device_keeps_its_own_statistics() {
    let (a, b) = (sim(4), sim(5));
    let (alloc_a, alloc_b) = (a.allocator().unwrap(), b.allocator().unwrap());
    let b_before = (alloc_b.memory_allocated(), alloc_b.memory_reserved());
    let a_before = alloc_a.memory_allocated();
    let on_a = with_device(4, || {
        Tensor::zeros(
            &[1 << 20],
            DType::F32,
            &Device::current(DeviceKind::Sim).unwrap(),
        )
    })
    .unwrap()
    .unwrap();
    assert_eq!(alloc_a.memory_allocated(), a_before + (4 << 20));
    assert_eq!(
        (alloc_b.memory_allocated(), alloc_b.memory_reserved()),
        b_before,
        "an allocation on sim:4 showed on sim:5"
    );
    // A copy to b is b's allocation; a's figures do not move.
    let on_b = on_a.to(&b).unwrap();
    assert_eq!(alloc_b.memory_allocated(), b_before.0 + (4 << 20));
    assert_eq!(alloc_a.memory_allocated(), a_before + (4 << 20));
    drop((on_a, on_b));
    // Emptying a's cache returns a's memory and leaves b's cache as it was.
    let b_cached = alloc_b.memory_reserved();
    assert!(b_cached >= 4 << 20);
    assert!(alloc_a.empty_cache().unwrap() >= 4 << 20);
    assert_eq!(alloc_a.memory_reserved(), 0);
    assert_eq!(alloc_b.memory_reserved(), b_cached);
    alloc_a.check_invariants().unwrap();
    alloc_b.check_invariants().unwrap();
}
