//! Deep autograd graphs: a chain of a million nodes is dropped, and a chain of tens of
//! thousands of ops is differentiated and dropped, on a thread whose stack is far too
//! small for a walk that recurses once per node. Runs on the simulated GPU by default
//! and on the GPU with `LABS_DEVICE=cuda`.

use std::sync::{Arc, Mutex, Weak};

use labs_core::tensor::{Edge, GradOp, Node};
use labs_core::testing::test_device;
use labs_core::Tensor;

/// A stack that holds a few hundred frames, not tens of thousands.
const SMALL_STACK: usize = 256 << 10;

fn on_small_stack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::Builder::new()
        .name("small-stack".into())
        .stack_size(SMALL_STACK)
        .spawn(f)
        .expect("spawning the test thread")
        .join()
        .expect("the test thread panicked")
}

fn identity_node(input: Option<Arc<Node>>, sequence_nr: u64) -> Arc<Node> {
    Arc::new(Node {
        op: GradOp::Identity,
        sequence_nr,
        inputs: vec![input.map(Edge::Node)],
        saved: Mutex::new(None),
        packed: None,
        hooks: Mutex::new(Vec::new()),
    })
}

#[test]
fn a_million_node_chain_drops_on_a_small_stack() {
    const NODES: u64 = 1_000_000;
    let (deepest, root_weak) = on_small_stack(|| {
        let first = identity_node(None, 0);
        let deepest: Weak<Node> = Arc::downgrade(&first);
        let mut root = first;
        for i in 1..NODES {
            root = identity_node(Some(root), i);
        }
        let root_weak = Arc::downgrade(&root);
        drop(root);
        (deepest, root_weak)
    });
    assert!(
        root_weak.upgrade().is_none(),
        "the root outlived its last Arc"
    );
    assert!(
        deepest.upgrade().is_none(),
        "the deepest node of the chain was not freed with the root"
    );
}

#[test]
fn a_shared_subgraph_outlives_one_of_its_users() {
    // Two chains over one shared tail: dropping one chain keeps the tail for the other.
    let tail = (0..1000).fold(identity_node(None, 0), |n, i| identity_node(Some(n), i));
    let deepest = {
        let mut n = tail.clone();
        while let Some(Some(Edge::Node(next))) = n.inputs.first().cloned() {
            n = next;
        }
        Arc::downgrade(&n)
    };
    let a = (0..1000).fold(tail.clone(), |n, i| identity_node(Some(n), i));
    let b = identity_node(Some(tail.clone()), 0);
    drop(tail);
    drop(a);
    assert!(deepest.upgrade().is_some(), "the tail went with one user");
    match &b.inputs[0] {
        Some(Edge::Node(n)) => assert_eq!(n.inputs.len(), 1, "the tail lost its edges"),
        _ => panic!("b lost its edge"),
    }
    drop(b);
    assert!(deepest.upgrade().is_none(), "the tail outlived both users");
}

#[test]
fn a_deep_chain_of_ops_differentiates_and_drops_on_a_small_stack() {
    const OPS: usize = 20_000;
    const FACTOR: f32 = 1.000_01;
    let device = test_device();
    let grad = on_small_stack(move || {
        let x = Tensor::from_slice(&[2.0f32], &[1], &device)
            .unwrap()
            .requires_grad_(true);
        let mut y = x.clone();
        for _ in 0..OPS {
            y = y.scale(FACTOR).unwrap();
        }
        y.backward().unwrap();
        drop(y);
        x.grad().expect("x got a gradient").item::<f32>().unwrap()
    });
    let expected = (FACTOR as f64).powi(OPS as i32);
    assert!(
        ((grad as f64) - expected).abs() < 1e-3 * expected,
        "gradient through {OPS} scales: {grad}, expected {expected}"
    );
}
