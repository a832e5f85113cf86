//! Autograd against finite differences, and the graph's memory: saved tensors released
//! by a backward pass, a second pass refused, memory back to its baseline once the
//! outputs are dropped. Runs on the simulated GPU by default and on the GPU with
//! `LABS_DEVICE=cuda`.

use labs_core::tensor::no_grad;
use labs_core::testing::{serial, test_device};
use labs_core::Tensor;

mod gradcheck;

use gradcheck::{check_gradients, tensor, values};

const SHAPE: [usize; 2] = [3, 4];

fn input(seed: u64, lo: f32, hi: f32) -> (Vec<f32>, Vec<usize>) {
    (values(12, seed, lo, hi), SHAPE.to_vec())
}

#[test]
fn unary_ops_match_finite_differences() {
    let _serial = serial();
    let any = || input(1, -2.0, 2.0);
    let positive = || input(2, 0.5, 3.0);
    check_gradients("neg", &[any()], |t| t[0].neg().unwrap());
    check_gradients("scale", &[any()], |t| t[0].scale(-1.5).unwrap());
    check_gradients("exp", &[any()], |t| t[0].exp().unwrap());
    check_gradients("log", &[positive()], |t| {
        t[0].unary(labs_core::kernels::UnaryOp::Log).unwrap()
    });
    check_gradients("sqrt", &[positive()], |t| {
        t[0].unary(labs_core::kernels::UnaryOp::Sqrt).unwrap()
    });
    check_gradients("tanh", &[any()], |t| {
        t[0].unary(labs_core::kernels::UnaryOp::Tanh).unwrap()
    });
    check_gradients("sigmoid", &[any()], |t| {
        t[0].unary(labs_core::kernels::UnaryOp::Sigmoid).unwrap()
    });
    // Away from 0, where relu has no derivative.
    let (mut d, s) = any();
    for v in &mut d {
        if v.abs() < 0.1 {
            *v += 0.3;
        }
    }
    check_gradients("relu", &[(d, s)], |t| t[0].relu().unwrap());
}

#[test]
fn binary_ops_match_finite_differences() {
    let _serial = serial();
    let a = || input(3, -2.0, 2.0);
    let b = || input(4, -2.0, 2.0);
    let away_from_zero = || input(5, 0.5, 2.0);
    check_gradients("add", &[a(), b()], |t| t[0].add(&t[1]).unwrap());
    check_gradients("sub", &[a(), b()], |t| t[0].sub(&t[1]).unwrap());
    check_gradients("mul", &[a(), b()], |t| t[0].mul(&t[1]).unwrap());
    check_gradients("div", &[a(), away_from_zero()], |t| {
        t[0].div(&t[1]).unwrap()
    });
    // The same tensor on both sides: its gradient is the sum of both paths.
    check_gradients("x * x", &[a()], |t| t[0].mul(&t[0]).unwrap());
}

#[test]
fn reductions_and_views_match_finite_differences() {
    let _serial = serial();
    let a = || (values(24, 6, -2.0, 2.0), vec![2, 3, 4]);
    check_gradients("sum dim 1", &[a()], |t| t[0].sum_dims(&[1], false).unwrap());
    check_gradients("sum dims 0,2 keepdim", &[a()], |t| {
        t[0].sum_dims(&[0, 2], true).unwrap()
    });
    check_gradients("mean dim 2", &[a()], |t| {
        t[0].mean_dims(&[2], false).unwrap()
    });
    check_gradients("mean of all", &[a()], |t| {
        t[0].mean_all().unwrap().reshape(&[1]).unwrap()
    });
    check_gradients("transpose then exp", &[a()], |t| {
        t[0].transpose(0, 2).unwrap().exp().unwrap()
    });
    check_gradients("permute, contiguous, view", &[a()], |t| {
        t[0].permute(&[2, 0, 1])
            .unwrap()
            .contiguous()
            .unwrap()
            .view(&[4, 6])
            .unwrap()
    });
    check_gradients("a small network", &[a(), a()], |t| {
        let h = t[0].mul(&t[1]).unwrap().relu().unwrap();
        h.unary(labs_core::kernels::UnaryOp::Tanh)
            .unwrap()
            .sum_dims(&[2], false)
            .unwrap()
    });
}

#[test]
fn matmul_matches_finite_differences() {
    let _serial = serial();
    let m =
        |rows: usize, cols: usize, seed| (values(rows * cols, seed, -1.0, 1.0), vec![rows, cols]);
    check_gradients("[3,4] @ [4,5]", &[m(3, 4, 10), m(4, 5, 11)], |t| {
        t[0].matmul(&t[1]).unwrap()
    });
    check_gradients(
        "batched [2,3,4] @ [2,4,2]",
        &[
            (values(24, 12, -1.0, 1.0), vec![2, 3, 4]),
            (values(16, 13, -1.0, 1.0), vec![2, 4, 2]),
        ],
        |t| t[0].matmul(&t[1]).unwrap(),
    );
    check_gradients(
        "shared weight [2,3,4] @ [4,2], then relu",
        &[(values(24, 14, -1.0, 1.0), vec![2, 3, 4]), m(4, 2, 15)],
        |t| t[0].matmul(&t[1]).unwrap().relu().unwrap(),
    );
    check_gradients("x @ xᵀ", &[m(3, 4, 16)], |t| {
        t[0].matmul(&t[0].transpose(0, 1).unwrap()).unwrap()
    });
}

#[test]
fn sums_match_host_arithmetic() {
    let _serial = serial();
    let device = test_device();
    let data = values(2 * 3 * 5, 7, -1.0, 1.0);
    let t = tensor(&data, &[2, 3, 5], &device);
    let by_dim0 = t.sum_dims(&[0], false).unwrap().to_vec::<f32>().unwrap();
    for j in 0..15 {
        let want = data[j] + data[15 + j];
        assert!((by_dim0[j] - want).abs() < 1e-5, "sum over dim 0 at {j}");
    }
    let all = t.sum_all().unwrap();
    assert_eq!(all.shape(), &[] as &[usize]);
    let want: f32 = data.iter().sum();
    assert!((all.to_vec::<f32>().unwrap()[0] - want).abs() < 1e-4);
    // An empty reduced dimension sums to zero.
    let empty = Tensor::zeros(&[3, 0], labs_core::DType::F32, &device).unwrap();
    assert_eq!(
        empty
            .sum_dims(&[1], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![0.0; 3]
    );
    assert!(t.sum_dims(&[3], false).is_err());
    assert!(t.sum_dims(&[1, 1], false).is_err());
}

#[test]
fn gradients_accumulate_and_clear() {
    let _serial = serial();
    let device = test_device();
    let x = tensor(&[1.0, 2.0, 3.0], &[3], &device).requires_grad_(true);
    for _ in 0..2 {
        x.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    }
    // d/dx sum(x^2) = 2x, twice.
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![4.0, 8.0, 12.0]
    );
    x.clear_grad();
    assert!(x.grad().is_none());
}

#[test]
fn no_grad_and_detach_record_nothing() {
    let _serial = serial();
    let device = test_device();
    let x = tensor(&[1.0, 2.0], &[2], &device).requires_grad_(true);
    {
        let _off = no_grad();
        let y = x.exp().unwrap();
        assert!(!y.requires_grad() && y.grad_fn().is_none());
    }
    let y = x.exp().unwrap();
    assert_eq!(y.grad_fn().unwrap().op.name(), "ExpBackward");
    assert!(!y.is_leaf());
    let d = y.detach();
    assert!(!d.requires_grad() && d.shares_storage(&y));
    assert!(
        d.sum_all().unwrap().backward().is_err(),
        "nothing to differentiate"
    );
    // In-place ops on tensors that need a gradient are refused while recording.
    assert!(x.axpy_(1.0, &x.detach()).is_err());
}

#[test]
fn a_backward_pass_releases_the_graph_unless_retained() {
    let _serial = serial();
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let x = Tensor::randn(&[256, 256], 1, &device)
        .unwrap()
        .requires_grad_(true);
    let base = alloc.memory_allocated();
    // exp saves its output (256 KiB), tanh too: two saved tensors beyond the inputs.
    let loss = x
        .exp()
        .unwrap()
        .unary(labs_core::kernels::UnaryOp::Tanh)
        .unwrap()
        .sum_all()
        .unwrap();
    let with_graph = alloc.memory_allocated();
    assert!(
        with_graph >= base + 2 * 256 * 256 * 4,
        "the graph keeps its saved tensors"
    );
    loss.backward_with(None, true).unwrap();
    loss.backward().unwrap(); // retained once: a second pass works, and releases
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("second time"), "{err}");
    let after = alloc.memory_allocated();
    assert!(
        after < with_graph,
        "released saved tensors go back to the cache"
    );
    assert_eq!(x.grad().unwrap().shape(), &[256, 256]);
    drop(loss);
    x.clear_grad();
    assert_eq!(
        alloc.memory_allocated(),
        base,
        "memory back to the baseline"
    );
}

#[test]
fn an_unused_graph_is_freed_with_its_output() {
    let _serial = serial();
    // Tutorial 002's graph kept by an unused result: it holds what its nodes saved until
    // the result is dropped, then everything goes.
    let device = test_device();
    let alloc = device.allocator().unwrap();
    let a = Tensor::randn(&[128, 128], 2, &device)
        .unwrap()
        .requires_grad_(true);
    let b = Tensor::randn(&[128, 128], 3, &device)
        .unwrap()
        .requires_grad_(true);
    let base = alloc.memory_allocated();
    let c = a.mul(&b).unwrap().exp().unwrap();
    assert!(alloc.memory_allocated() > base);
    drop(c);
    assert_eq!(alloc.memory_allocated(), base);
}

#[test]
fn backward_refuses_bad_calls() {
    let _serial = serial();
    let device = test_device();
    let x = tensor(&[1.0, 2.0], &[2], &device).requires_grad_(true);
    let y = x.exp().unwrap();
    let err = y.backward().unwrap_err().to_string();
    assert!(err.contains("one-element"), "{err}");
    let wrong = tensor(&[1.0], &[1], &device);
    assert!(y.backward_with(Some(wrong), false).is_err());
    assert!(
        x.expand(&[3, 2]).is_err(),
        "no gradient for expand yet: refused, not dropped"
    );
    // narrow's gradient lands in its place, zeros around it; two narrows of one
    // tensor add up.
    let w = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0], &[5], &device).requires_grad_(true);
    let a = w.narrow(0, 1, 3).unwrap();
    let b = w.narrow(0, 3, 2).unwrap();
    let loss = a
        .mul(&tensor(&[10.0, 20.0, 30.0], &[3], &device))
        .unwrap()
        .sum_all()
        .unwrap()
        .add(&b.sum_all().unwrap())
        .unwrap();
    loss.backward().unwrap();
    assert_eq!(
        w.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 10.0, 20.0, 31.0, 1.0]
    );
}

#[test]
fn post_accumulate_grad_hooks_run_once_per_pass_with_the_complete_gradient() {
    use std::sync::{Arc, Mutex};
    let device = test_device();
    let leaf = |v: &[f32]| {
        Tensor::from_slice(v, &[v.len()], &device)
            .unwrap()
            .requires_grad_(true)
    };
    // `tied` is used twice (as a tied embedding and head are); `first` feeds the
    // graph's first op, so backward reaches it last.
    let (first, tied, last) = (leaf(&[1.0, 2.0]), leaf(&[3.0, 4.0]), leaf(&[5.0, 6.0]));
    type Seen = Vec<(&'static str, Vec<f32>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut handles = Vec::new();
    for (name, t) in [("first", &first), ("tied", &tied), ("last", &last)] {
        let seen = seen.clone();
        handles.push(
            t.register_post_accumulate_grad_hook(move |g| {
                seen.lock().unwrap().push((name, g.to_vec::<f32>()?));
                Ok(())
            })
            .unwrap(),
        );
    }
    let loss = |first: &Tensor, tied: &Tensor, last: &Tensor| {
        let h = first.mul(tied).unwrap(); // d/dtied = first
        let h = h.add(tied).unwrap().mul(last).unwrap(); // d/dtied += last
        h.sum_all().unwrap()
    };
    loss(&first, &tied, &last).backward().unwrap();
    {
        let seen = seen.lock().unwrap();
        let names: Vec<_> = seen.iter().map(|(n, _)| *n).collect();
        // One call per leaf; the last op's parameter is ready first; tied is ready
        // only after the first op's node, which also completes `first`.
        assert_eq!(names, ["last", "first", "tied"]);
        // tied's hook saw both contributions: first·last + last.
        let tied_seen = &seen.iter().find(|(n, _)| *n == "tied").unwrap().1;
        assert_eq!(tied_seen, &vec![1.0 * 5.0 + 5.0, 2.0 * 6.0 + 6.0]);
    }
    // A second pass accumulates, and the hook sees the running sum.
    seen.lock().unwrap().clear();
    loss(&first, &tied, &last).backward().unwrap();
    let tied_seen = seen
        .lock()
        .unwrap()
        .iter()
        .find(|(n, _)| *n == "tied")
        .unwrap()
        .1
        .clone();
    assert_eq!(tied_seen, vec![20.0, 36.0]);
    // Removed hooks stay quiet; non-leaves are refused.
    for h in handles {
        h.remove();
    }
    seen.lock().unwrap().clear();
    loss(&first, &tied, &last).backward().unwrap();
    assert!(seen.lock().unwrap().is_empty());
    let inner = first.mul(&tied).unwrap();
    assert!(inner
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .is_err());
}

#[test]
fn a_hook_on_a_non_leaf_sees_its_gradient_before_the_ops_below_it_run() {
    use std::sync::{Arc, Mutex};
    let _serial = serial();
    let device = test_device();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &device)
        .unwrap()
        .requires_grad_(true);
    let h = x.scale(2.0).unwrap(); // dh/dx = 2
    let y = h.mul(&h).unwrap(); // dy/dh = 2h
    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = order.clone();
    h.register_hook(move |g| {
        seen.lock()
            .unwrap()
            .push(format!("h {:?}", g.to_vec::<f32>().unwrap()));
        Ok(())
    })
    .unwrap();
    let seen = order.clone();
    x.register_post_accumulate_grad_hook(move |_| {
        seen.lock().unwrap().push("x".into());
        Ok(())
    })
    .unwrap();
    y.sum_all().unwrap().backward().unwrap();
    // The hook got dL/dh = 2h = [4, 8, 12], before x's gradient existed.
    assert_eq!(*order.lock().unwrap(), ["h [4.0, 8.0, 12.0]", "x"]);
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        [8.0, 16.0, 24.0]
    );
    // A hook's error stops backward, as any error there does.
    let z = x.scale(3.0).unwrap();
    z.register_hook(|_| Err(labs_core::Error::InvalidArgument("stop".into())))
        .unwrap();
    let err = z.sum_all().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("stop"), "{err}");
    // A leaf has no grad_fn to hang it on.
    let err = x.register_hook(|_| Ok(())).unwrap_err();
    assert!(
        err.to_string()
            .contains("register_post_accumulate_grad_hook"),
        "{err}"
    );
}

#[test]
fn a_freed_storage_gives_its_memory_back_under_its_tensors_and_the_graph() {
    let _serial = serial();
    let device = test_device();
    let allocator = device.allocator().unwrap();
    let w = {
        let _p = labs_core::alloc::Category::Parameter.scope();
        Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &device).unwrap()
    }
    .requires_grad_(true);
    let x = Tensor::from_slice(&[1.0f32, 1.0], &[1, 2], &device).unwrap();
    // The product saves the weight (its transposed view) for backward.
    let y = x.matmul(&w.transpose(0, 1).unwrap()).unwrap();
    let before = allocator.memory_allocated();
    w.free_storage().unwrap();
    assert!(!w.is_storage_allocated());
    assert_eq!(
        allocator.memory_allocated(),
        before - 512,
        "one 512-byte block back"
    );
    // Reading it is refused until it is allocated again.
    let err = w.category().unwrap_err();
    assert!(err.to_string().contains("alloc_storage"), "{err}");
    w.free_storage().unwrap(); // freeing twice is nothing
    w.alloc_storage().unwrap();
    assert!(w.is_storage_allocated());
    assert_eq!(allocator.memory_allocated(), before);
    assert_eq!(w.category().unwrap(), labs_core::alloc::Category::Parameter);
    // Filled again (as FSDP's all-gather fills it), backward reads the new values
    // through the view the product saved.
    {
        let _off = no_grad();
        w.copy_(&Tensor::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2], &device).unwrap())
            .unwrap();
    }
    let x = x.requires_grad_(true);
    let y2 = x.matmul(&w.transpose(0, 1).unwrap()).unwrap();
    y2.sum_all().unwrap().backward().unwrap();
    // d(sum x Wᵀ)/dx = the column sums of W: [5 + 7, 6 + 8].
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [12.0, 14.0]);
    drop(y);
}
