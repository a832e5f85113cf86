//! Lab 13's experiments and exercises, on the device under test.

use lab_13::exercises::{graphed, two_sharing};
use lab_13::{chain, launches, pools, rules, scoped};
use labs_core::testing::{serial, test_device};
use labs_core::Tensor;

/// `chain`'s value from 1.0 after `depth` steps of `y = 0.5 y + 1`.
fn chained(mut y: f32, depth: usize) -> f32 {
    for _ in 0..depth {
        y = 0.5 * y + 1.0;
    }
    y
}

#[test]
fn a_graph_records_one_node_per_launch() {
    let _serial = serial();
    let d = test_device();
    let m = launches::measure(&d, 50, 3).unwrap();
    assert_eq!(m.kernels, 50);
    if !d.is_dry() {
        assert_eq!(m.nodes, 50);
    }
    assert!(m.eager.as_nanos() > 0 && m.graph.as_nanos() > 0);
}

#[test]
fn a_graph_keeps_its_regions_memory_and_a_shared_pool_keeps_less() {
    let _serial = serial();
    let d = test_device();
    let (n, depth) = (1 << 18, 4);
    let rows = pools::measure(&d, n, depth).unwrap();
    let by = |how: &str| rows.iter().find(|r| r.how == how).unwrap();
    let (eager, one) = (by("eager"), by("one graph"));
    let (apart, shared) = (by("two graphs, a pool each"), by("two graphs, one pool"));
    let out = (n * 4) as u64;
    assert_eq!((eager.allocated, one.allocated), (out, out));
    assert_eq!((apart.allocated, shared.allocated), (2 * out, 2 * out));
    // A graph's pool holds at least its output and one temporary beside it.
    assert!(one.reserved >= 2 * out, "{}", one.reserved);
    assert_eq!(apart.reserved, 2 * one.reserved);
    assert!(
        shared.reserved < apart.reserved,
        "{} vs {}",
        shared.reserved,
        apart.reserved
    );
}

#[test]
fn every_forbidden_call_fails_the_capture_and_the_graph_captures_again() {
    let _serial = serial();
    let d = test_device();
    let rules = rules::measure(&d).unwrap();
    assert_eq!(rules.len(), 3);
    for r in &rules {
        assert_ne!(r.error, "(allowed)", "{}", r.call);
        assert!(r.recovered, "{}: {}", r.call, r.error);
    }
}

#[test]
fn a_scoped_pool_keeps_its_region_apart_and_gives_it_back_when_released() {
    let _serial = serial();
    let d = test_device();
    let s = scoped::measure(&d, 1 << 18, 4).unwrap();
    let [(_, in_pool, default_1), (_, pool_2, default_2), (_, freed, _), (_, released, default_4)] =
        &s.points[..]
    else {
        panic!("four points");
    };
    assert_eq!(in_pool.allocated, 1 << 20);
    assert!(in_pool.reserved > 0);
    // The region outside the scope grows the default pool, not the scoped one.
    assert_eq!(pool_2.reserved, in_pool.reserved);
    assert!(default_2.allocated > default_1.allocated);
    assert_eq!((freed.allocated, freed.reserved), (0, in_pool.reserved));
    assert_eq!((released.reserved, released.segments), (0, 0));
    assert!(released.released);
    assert_eq!(default_4.reserved, default_2.reserved);
}

#[test]
fn exercise_1_a_graphed_region_recomputes_its_output_on_each_replay() {
    let _serial = serial();
    let d = test_device();
    let x = Tensor::full(&[1000], 1.0f32, &d).unwrap();
    chain(&x, 3).unwrap();
    let (graph, y) = graphed(&d, &x, 3).unwrap();
    assert!(graph.pool().is_some(), "the graph was captured");
    graph.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[9], chained(1.0, 3));
    x.copy_(&Tensor::full(&[1000], 4.0f32, &d).unwrap())
        .unwrap();
    graph.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap()[9], chained(4.0, 3));
}

#[test]
fn exercise_2_two_graphs_share_one_pool() {
    let _serial = serial();
    let d = test_device();
    let a = d.allocator().unwrap();
    let x = Tensor::full(&[1 << 18], 1.0f32, &d).unwrap();
    chain(&x, 4).unwrap();
    let (first, second, z) = two_sharing(&d, &x, 4).unwrap();
    let (p1, p2) = (first.pool().unwrap(), second.pool().unwrap());
    assert_eq!(p1.id(), p2.id(), "one pool for both");
    // Less than two graphs with a pool each keep (measured as the experiment does).
    let rows = pools::measure(&d, 1 << 18, 4).unwrap();
    let apart = rows
        .iter()
        .find(|r| r.how == "two graphs, a pool each")
        .unwrap();
    assert!(a.pool_stats(p1.id()).unwrap().reserved < apart.reserved);
    first.replay().unwrap();
    second.replay().unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap()[0], chained(chained(1.0, 4), 4));
}
