//! Peer access for the allocator's memory: memory mapped with the virtual memory API
//! (expandable segments) is reachable only by the devices its access descriptors name,
//! so the first peer copy between two devices grants each access to the other's
//! mappings, those made so far and those made later. Runs on two fresh simulated GPUs
//! by default, and on `cuda:0` and `cuda:1` with `LABS_DEVICE=cuda` (a machine with one
//! GPU checks that granting is refused).

use labs_core::alloc::Config;
use labs_core::device::{device_count, CopyPath, CopyVia, DeviceKind};
use labs_core::testing::test_device;
use labs_core::{DType, Device, DeviceId, Error, Tensor};

/// Two devices of the kind under test that no other test has touched (on a GPU, the
/// first two; `None` on a machine with one), their allocators on expandable segments
/// (`preset:labs`): memory mapped with the virtual memory API, whose access is what
/// this file tests.
fn pair() -> Option<(Device, Device)> {
    let (a, b) = match id_under_test() {
        DeviceId::Cuda(_) => {
            if device_count(DeviceKind::Cuda).unwrap() < 2 {
                return None;
            }
            let get = |i| Device::get(DeviceId::Cuda(i)).unwrap();
            (get(0), get(1))
        }
        DeviceId::Dry(_) => (Device::new_dry(1 << 30), Device::new_dry(1 << 30)),
        _ => (Device::new_sim(1 << 30), Device::new_sim(1 << 30)),
    };
    for d in [&a, &b] {
        d.configure_allocator(Config::labs()).unwrap();
    }
    Some((a, b))
}

/// The device under test (`LABS_DEVICE`, else `sim:0`), named without opening it:
/// `test_device()` makes the device's allocator, and this file's GPUs must have theirs
/// configured before their first allocation.
fn id_under_test() -> DeviceId {
    match std::env::var("LABS_DEVICE") {
        Ok(v) if !v.trim().is_empty() => v.parse().unwrap(),
        _ => DeviceId::Sim(0),
    }
}

/// Whether `device` may use the memory of tensor `t` (first and last byte).
fn reaches(t: &Tensor, device: &Device) -> bool {
    let backend = t.device().backend();
    let (first, last) = (t.ptr(), t.ptr() + t.nbytes() as u64 - 1);
    let a = backend.vm_access(first, device.id()).unwrap();
    let b = backend.vm_access(last, device.id()).unwrap();
    assert_eq!(a, b, "one tensor, two answers");
    a
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.25 - 3.0).collect()
}

/// One test for the pair, as on a GPU the pair is the process's: access before any
/// grant; a grant one way while the device maps memory on another thread (whichever
/// comes first, every mapping ends up reachable: the grant and the setting of access
/// exclude each other); then a peer copy, which grants the other way; then mappings
/// made after it.
#[test]
fn peer_access_covers_mappings_made_before_during_and_after_it() {
    let Some((a, b)) = pair() else {
        // One GPU: no peer to grant.
        let d = test_device();
        assert!(d.grant_peer_access(&d).is_err());
        return;
    };
    assert!(a.allocator().unwrap().config().expandable_segments);
    // Configured once, before the first allocation.
    let again = a.configure_allocator(Config::default()).unwrap_err();
    assert!(again.to_string().contains("in use already"), "{again}");
    let data = ramp(1 << 16);
    let x = Tensor::from_slice(&data, &[1 << 16], &a).unwrap();
    let w = Tensor::zeros(&[1 << 16], DType::F32, &b).unwrap();
    // Before any grant: each device its own memory, nobody else's.
    assert!(reaches(&x, &a) && reaches(&w, &b));
    assert!(!reaches(&x, &b) && !reaches(&w, &a));
    assert!(a.granted_peers().is_empty() && b.granted_peers().is_empty());
    if !b.can_access_peer(&a).unwrap() {
        // GPUs without a peer path: copies are staged, and granting is refused.
        let err = a.grant_peer_access(&b).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        return;
    }

    let mapper = {
        let a = a.clone();
        std::thread::spawn(move || {
            // Growing sizes: each lands on pages not mapped before.
            (1..=24)
                .map(|i| Tensor::zeros(&[i << 20], DType::U8, &a).unwrap())
                .collect::<Vec<_>>()
        })
    };
    a.grant_peer_access(&b).unwrap();
    let during = mapper.join().unwrap();
    for t in during.iter().chain([&x]) {
        assert!(reaches(t, &b), "{} bytes at {:#x}", t.nbytes(), t.ptr());
    }
    assert_eq!(a.granted_peers(), [b.id()]);
    assert!(b.granted_peers().is_empty(), "one way only so far");
    assert!(!reaches(&w, &a));

    // A peer copy grants both ways (the copy engine of either side may use either).
    let (y, path) = x.to_via(&b, CopyVia::Any).unwrap();
    assert_eq!(path, CopyPath::Peer);
    if !b.is_dry() {
        assert_eq!(y.to_vec::<f32>().unwrap(), data);
    }
    assert_eq!(b.granted_peers(), [a.id()]);
    assert!(
        reaches(&w, &a) && reaches(&y, &a),
        "mappings of b made before the copy"
    );
    // Listed once however many copies and grants follow.
    let back = y.to_via(&a, CopyVia::Any).unwrap().0;
    a.grant_peer_access(&b).unwrap();
    assert_eq!(a.granted_peers(), [b.id()]);
    assert_eq!(b.granted_peers(), [a.id()]);
    assert!(reaches(&back, &b));

    // Mappings made later, on fresh pages (larger than anything cached), both sides.
    for (d, peer) in [(&a, &b), (&b, &a)] {
        let z = Tensor::zeros(&[48 << 20], DType::U8, d).unwrap();
        assert!(
            reaches(&z, d) && reaches(&z, peer),
            "a mapping of {} made after",
            d.id()
        );
    }
}

#[test]
fn granting_access_is_refused_to_the_device_itself_and_to_other_kinds() {
    let d = Device::get(id_under_test()).unwrap();
    for peer in [d.clone(), Device::cpu()] {
        let err = d.grant_peer_access(&peer).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(
            err.to_string().contains("cannot be granted access"),
            "{err}"
        );
    }
    assert!(!d.granted_peers().contains(&d.id()));
}
