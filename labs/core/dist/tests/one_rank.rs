//! Every collective on a group of one rank of the device under test (through NCCL under
//! `LABS_DEVICE=cuda`): over one rank a sum, an average, a gather and a scatter are each
//! the input itself, to the last element, whatever the length. ZeRO-3's units have
//! lengths such as 49,984 elements (a GPT-2 block of width 64), where a transport that
//! dropped a tail would leave a layer's last parameters stale.

use labs_device::testing::test_device;
use labs_dist::dist::{self, ReduceOp};
use labs_tensor::Tensor;

/// Lengths that are multiples of nothing in particular, of a few powers of two, and a
/// GPT-2 block's.
const LENGTHS: [usize; 8] = [1, 3, 63, 1000, 4099, 49_984, 65_536, 1_000_003];

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 1009) as f32 + 0.25).collect()
}

/// The output against the input: how many elements differ, and where the first is.
fn check(failures: &mut Vec<String>, what: &str, got: &Tensor, want: &[f32]) {
    let got = got.to_vec::<f32>().unwrap();
    let wrong: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
    if let Some(&first) = wrong.first() {
        failures.push(format!(
            "{what} of {} elements: {} differ, the first at {first} ({} for {})",
            want.len(),
            wrong.len(),
            got[first],
            want[first]
        ));
    }
}

#[test]
fn every_collective_over_one_rank_returns_its_input_whole() {
    let device = test_device();
    let comm = dist::group(std::slice::from_ref(&device))
        .unwrap()
        .pop()
        .unwrap();
    let mut failures = Vec::new();
    for n in LENGTHS {
        let want = values(n);
        for op in [ReduceOp::Sum, ReduceOp::Avg] {
            let input = Tensor::from_slice(&want, &[n], &device).unwrap();
            let out = Tensor::full(&[n], -1.0f32, &device).unwrap();
            comm.reduce_scatter(&input, &out, op)
                .unwrap()
                .wait()
                .unwrap();
            check(
                &mut failures,
                &format!("reduce_scatter {op:?}"),
                &out,
                &want,
            );
            // An input that is a view into a larger buffer, as ZeRO's shards are.
            let big = Tensor::full(&[n + 7], -1.0f32, &device).unwrap();
            let part = big.narrow(0, 5, n).unwrap();
            comm.reduce_scatter(&input, &part, op)
                .unwrap()
                .wait()
                .unwrap();
            check(
                &mut failures,
                &format!("reduce_scatter {op:?} into a view"),
                &part,
                &want,
            );
            let t = Tensor::from_slice(&want, &[n], &device).unwrap();
            comm.all_reduce(&t, op).unwrap().wait().unwrap();
            check(&mut failures, &format!("all_reduce {op:?}"), &t, &want);
        }
        let input = Tensor::from_slice(&want, &[n], &device).unwrap();
        let out = Tensor::full(&[n], -1.0f32, &device).unwrap();
        comm.all_gather(&input, &out).unwrap().wait().unwrap();
        check(&mut failures, "all_gather", &out, &want);
        let t = Tensor::from_slice(&want, &[n], &device).unwrap();
        comm.broadcast(&t, 0).unwrap().wait().unwrap();
        check(&mut failures, "broadcast", &t, &want);
    }
    assert!(failures.is_empty(), "on {device}:\n{}", failures.join("\n"));
}
