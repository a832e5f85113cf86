//! CUDA graphs (`torch.cuda.CUDAGraph`, `with torch.cuda.graph(g, pool=...)`): a region
//! captured on a stream of its own replays its work in place on new inputs; what a
//! capture forbids fails and leaves nothing to replay; the region's memory comes from
//! the graph's private pool, which eager work never takes and graphs can share; and a
//! stream made current takes the work that names none. On the device under test.

use labs_core::alloc::MemPoolId;
use labs_core::device::{Graph, GraphPool, StreamGuard};
use labs_core::testing::{serial, test_device};
use labs_core::{DType, Device, Error, Tensor};

const N: usize = 1 << 16;

/// `x * 2 + 1`, the region most tests capture: two kernels and an intermediate.
fn affine(x: &Tensor) -> labs_core::Result<Tensor> {
    x.mul_scalar(2.0)?.add_scalar(1.0)
}

fn ramp(device: &Device, scale: f32) -> Tensor {
    let data: Vec<f32> = (0..N).map(|i| scale * (i % 100) as f32).collect();
    Tensor::from_slice(&data, &[N], device).unwrap()
}

#[test]
fn a_captured_region_replays_in_place_on_new_inputs() {
    let _serial = serial();
    let device = test_device();
    let x = ramp(&device, 1.0);
    // Warm up eagerly first, as PyTorch's recipe does (kernels loaded, workspaces made).
    affine(&x).unwrap();
    let mut g = Graph::new(&device).unwrap();
    let y = g.capture(None, || affine(&x)).unwrap();
    if !device.is_dry() {
        assert!(g.nodes() >= 2, "{} nodes", g.nodes());
    }
    g.replay().unwrap();
    let want = |scale: f32| -> Vec<f32> {
        (0..N)
            .map(|i| 2.0 * scale * (i % 100) as f32 + 1.0)
            .collect()
    };
    assert_eq!(y.to_vec::<f32>().unwrap(), want(1.0));
    // New data goes into the same input; the replay writes the same output.
    x.copy_(&ramp(&device, 10.0)).unwrap();
    let before = y.ptr();
    g.replay().unwrap();
    assert_eq!(y.ptr(), before);
    assert_eq!(y.to_vec::<f32>().unwrap(), want(10.0));
    // Replays queue on the current stream in order, like any work.
    x.copy_(&ramp(&device, 3.0)).unwrap();
    g.replay().unwrap();
    g.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), want(3.0));
}

#[test]
fn a_capture_forbids_reading_values_and_leaves_nothing_to_replay() {
    let _serial = serial();
    let device = test_device();
    let x = ramp(&device, 1.0);
    affine(&x).unwrap();
    let mut g = Graph::new(&device).unwrap();
    let outcome = g.capture(None, || -> labs_core::Result<Vec<f32>> {
        let y = affine(&x)?;
        // Reading values waits for work the capture has only recorded.
        y.to_vec::<f32>()
    });
    let err = outcome.unwrap_err();
    if !device.is_cuda() {
        assert!(matches!(err, Error::Capture { .. }), "{err}");
        assert!(err.to_string().contains("being captured"), "{err}");
    }
    let replay = g.replay().unwrap_err();
    assert!(replay.to_string().contains("not been captured"), "{replay}");
    // The stream and the device work as before, and the graph may capture again.
    assert_eq!(affine(&x).unwrap().to_vec::<f32>().unwrap()[3], 7.0);
    let y = g.capture(None, || affine(&x)).unwrap();
    g.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[5], 11.0);
}

#[test]
fn emptying_the_cache_inside_a_capture_gives_nothing_back() {
    let _serial = serial();
    let device = test_device();
    let a = device.allocator().unwrap();
    let x = ramp(&device, 1.0);
    affine(&x).unwrap();
    let mut g = Graph::new(&device).unwrap();
    let reserved_in_capture = std::cell::Cell::new(0);
    let y = g
        .capture(None, || -> labs_core::Result<Tensor> {
            let y = affine(&x)?;
            // Something cached and unused, that an empty_cache outside would release.
            drop(affine(&y)?);
            let reserved = a.memory_reserved();
            assert_eq!(
                a.empty_cache()?,
                0,
                "PyTorch's empty_cache releases nothing here"
            );
            reserved_in_capture.set(reserved);
            assert_eq!(a.memory_reserved(), reserved);
            Ok(y)
        })
        .unwrap();
    // The capture went on: the graph replays and computes.
    g.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[0], 1.0);
    assert!(reserved_in_capture.get() > 0);
}

#[test]
fn the_default_stream_cannot_capture() {
    let _serial = serial();
    let device = test_device();
    let stream = device.default_stream().unwrap();
    let err = device.backend().begin_capture(&stream).unwrap_err();
    assert!(err.to_string().contains("default stream cannot"), "{err}");
    assert!(!device.backend().is_capturing(&stream).unwrap());
}

#[test]
fn a_graphs_memory_comes_from_its_pool_and_eager_work_never_takes_it() {
    let _serial = serial();
    let device = test_device();
    let a = device.allocator().unwrap();
    let x = ramp(&device, 1.0);
    affine(&x).unwrap();
    let mut g = Graph::new(&device).unwrap();
    let y = g.capture(None, || affine(&x)).unwrap();
    let pool = g.pool().unwrap().id();
    assert_ne!(pool, MemPoolId::DEFAULT);
    let stats = a.pool_stats(pool).unwrap();
    // The output is alive in the pool; the intermediate was freed back into it.
    assert_eq!(stats.blocks, 1, "{stats:?}");
    assert!(stats.reserved >= 2 * (N * 4) as u64, "{stats:?}");
    // An eager tensor of the same size after the capture: from the default pool, not
    // the intermediate's free block, which the next replay writes.
    let eager = Tensor::zeros(&[N], DType::F32, &device).unwrap();
    let again = affine(&eager).unwrap();
    assert_eq!(a.pool_stats(pool).unwrap().blocks, 1);
    assert_eq!(a.pool_stats(pool).unwrap().reserved, stats.reserved);
    drop((eager, again));
    // The pool outlives the graph while its output lives, and goes back after both.
    drop(g);
    assert!(a.pool_stats(pool).unwrap().released);
    assert_eq!(a.pool_stats(pool).unwrap().blocks, 1);
    drop(y);
    let after = a.pool_stats(pool).unwrap();
    assert_eq!((after.blocks, after.reserved), (0, 0), "{after:?}");
}

#[test]
fn graphs_sharing_a_pool_reuse_its_memory() {
    let _serial = serial();
    let device = test_device();
    let a = device.allocator().unwrap();
    let x = ramp(&device, 1.0);
    affine(&x).unwrap();
    // Two graphs captured one after the other, each with a pool of its own: the
    // second cannot take the first's freed intermediate.
    let reserved = |pools: &[MemPoolId]| -> u64 {
        pools
            .iter()
            .map(|&p| a.pool_stats(p).unwrap().reserved)
            .sum()
    };
    let (mut g1, mut g2) = (Graph::new(&device).unwrap(), Graph::new(&device).unwrap());
    let y1 = g1.capture(None, || affine(&x)).unwrap();
    let y2 = g2.capture(None, || affine(&y1)).unwrap();
    let apart = reserved(&[g1.pool().unwrap().id(), g2.pool().unwrap().id()]);
    // Shared: the second graph's intermediate reuses the first's freed block.
    let (mut h1, mut h2) = (Graph::new(&device).unwrap(), Graph::new(&device).unwrap());
    let z1 = h1.capture(None, || affine(&x)).unwrap();
    let shared: GraphPool = h1.pool().unwrap();
    let z2 = h2.capture(Some(&shared), || affine(&z1)).unwrap();
    assert_eq!(h2.pool().unwrap().id(), shared.id());
    let together = reserved(&[shared.id()]);
    assert!(
        together < apart,
        "shared pool {together} B, separate pools {apart} B"
    );
    // Replayed in capture order, both chains compute what eager work does.
    for (first, second, out) in [(&g1, &g2, &y2), (&h1, &h2, &z2)] {
        first.replay().unwrap();
        second.replay().unwrap();
        let got = out.to_vec::<f32>().unwrap();
        assert_eq!(got[7], 2.0 * (2.0 * 7.0 + 1.0) + 1.0);
    }
}

#[test]
fn a_current_stream_takes_the_work_that_names_none() {
    let _serial = serial();
    let device = test_device();
    let default = device.default_stream().unwrap();
    let side = device.new_stream().unwrap();
    assert_eq!(device.current_stream().unwrap().handle(), default.handle());
    {
        let _guard = StreamGuard::new(&device, &side).unwrap();
        assert_eq!(device.current_stream().unwrap().handle(), side.handle());
        // The default stream is still the default stream.
        assert_eq!(device.default_stream().unwrap().handle(), default.handle());
        let y = affine(&ramp(&device, 1.0)).unwrap();
        side.synchronize().unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap()[2], 5.0);
        // Nested guards restore what was current before them.
        let other = device.new_stream().unwrap();
        device
            .with_stream(&other, || {
                assert_eq!(device.current_stream().unwrap().handle(), other.handle())
            })
            .unwrap();
        assert_eq!(device.current_stream().unwrap().handle(), side.handle());
    }
    assert_eq!(device.current_stream().unwrap().handle(), default.handle());
}

#[test]
fn a_captured_capturable_adam_step_replays_each_step_with_its_count() {
    use labs_core::optim::{AdamW, Optimizer};
    let _serial = serial();
    let device = test_device();
    let p0: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
    let grads: Vec<Vec<f32>> = (1..=4)
        .map(|k| (0..256).map(|i| ((i * k) as f32 * 0.11).cos()).collect())
        .collect();
    let leaf = |device: &Device| {
        Tensor::from_slice(&p0, &[256], device)
            .unwrap()
            .requires_grad_(true)
    };
    // Eager: four steps of a capturable AdamW.
    let eager = leaf(&device);
    let mut opt = AdamW::new(vec![eager.clone()], 0.05);
    opt.capturable = true;
    let grad = Tensor::zeros(&[256], DType::F32, &device).unwrap();
    let give = |p: &Tensor, g: &[f32]| {
        grad.copy_(&Tensor::from_slice(g, &[256], &device).unwrap())
            .unwrap();
        p.clear_grad();
        *p.grad_slot().unwrap().lock().unwrap() = Some(grad.clone());
    };
    for g in &grads {
        give(&eager, g);
        opt.step().unwrap();
    }
    // Captured: the first step eager (its state made), the next three replays of a
    // captured step, new gradients copied into the same tensor before each.
    let graphed = leaf(&device);
    let mut opt2 = AdamW::new(vec![graphed.clone()], 0.05);
    opt2.capturable = true;
    give(&graphed, &grads[0]);
    opt2.step().unwrap();
    let mut g = Graph::new(&device).unwrap();
    give(&graphed, &grads[1]);
    g.capture(None, || opt2.step()).unwrap();
    for next in &grads[1..] {
        grad.copy_(&Tensor::from_slice(next, &[256], &device).unwrap())
            .unwrap();
        g.replay().unwrap();
    }
    // The capture ran nothing: the replays are the three steps.
    assert_eq!(
        graphed.to_vec::<f32>().unwrap(),
        eager.to_vec::<f32>().unwrap()
    );
    let count = opt2.state(0).unwrap().device_step.as_ref().unwrap();
    assert_eq!(count.to_vec::<f32>().unwrap(), vec![4.0]);
}

#[test]
fn arange_is_computed_on_the_device_and_can_be_captured() {
    let _serial = serial();
    let device = test_device();
    let eager = Tensor::arange(-3, 1000, &device).unwrap();
    let want: Vec<i64> = (-3..997).collect();
    assert_eq!(eager.to_vec::<i64>().unwrap(), want);
    assert_eq!(eager.shape(), &[1000]);
    assert_eq!(eager.dtype(), DType::I64);
    let mut g = Graph::new(&device).unwrap();
    let captured = g.capture(None, || Tensor::arange(7, 5, &device)).unwrap();
    g.replay().unwrap();
    assert_eq!(captured.to_vec::<i64>().unwrap(), vec![7, 8, 9, 10, 11]);
}

#[test]
fn a_capture_stream_gets_its_own_gemm_workspace_from_the_cache_not_the_pool() {
    // A dry device with a GPU's cuBLAS workspace (32 MiB): the default stream's is lent
    // at the first product, the capture stream's before its capture begins.
    let device = Device::new_dry(1 << 34);
    let workspace = 32 << 20;
    device.set_gemm_workspace_bytes(workspace).unwrap();
    let a = device.allocator().unwrap();
    let x = Tensor::zeros(&[64, 64], DType::F32, &device).unwrap();
    x.matmul(&x).unwrap();
    let eager = a.memory_allocated();
    let mut g = Graph::new(&device).unwrap();
    let y = g.capture(None, || x.matmul(&x)).unwrap();
    let pool = a.pool_stats(g.pool().unwrap().id()).unwrap();
    // The product's output is the pool's only block; the workspace is outside it.
    assert_eq!((pool.blocks, pool.allocated), (1, (64 * 64 * 4) as u64));
    assert_eq!(
        a.memory_allocated(),
        eager + workspace as u64 + pool.allocated
    );
    // A second graph on the same capture stream lends nothing more.
    let mut h = Graph::new(&device).unwrap();
    let z = h.capture(None, || x.matmul(&x)).unwrap();
    assert_eq!(
        a.memory_allocated(),
        eager + workspace as u64 + 2 * pool.allocated
    );
    drop((y, z));
}
