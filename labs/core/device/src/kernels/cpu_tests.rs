//! Tests of the CPU twins (`cpu.rs`).

use super::*;
use crate::kernels::UnaryOp;

/// Plain host bytes posing as device memory at address `BASE`: the twins need
/// nothing more than [`HostAccess`].
struct Bytes(std::cell::RefCell<Vec<u8>>);
const BASE: DevicePtr = 0x1000;

impl HostAccess for Bytes {
    fn with_host_ptrs(
        &self,
        ranges: &[(DevicePtr, usize)],
        f: &mut dyn FnMut(&[*mut u8]),
    ) -> Result<()> {
        let mut bytes = self.0.borrow_mut();
        let len = bytes.len() as u64;
        if ranges
            .iter()
            .any(|&(a, n)| a < BASE || a + n as u64 > BASE + len)
        {
            return Err(Error::InvalidArgument("out of range".into()));
        }
        let base = bytes.as_mut_ptr();
        let ptrs: Vec<*mut u8> = ranges
            .iter()
            .map(|&(a, _)| base.wrapping_add((a - BASE) as usize))
            .collect();
        f(&ptrs);
        Ok(())
    }
}

fn floats(memory: &Bytes) -> Vec<f32> {
    memory
        .0
        .borrow()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn tf32_rounding_keeps_ten_mantissa_bits_to_nearest_even() {
    let ulp = 1.0 / 1024.0; // TF32's spacing just above 1
    assert_eq!(round_to_tf32(1.0 + ulp / 4.0), 1.0);
    assert_eq!(round_to_tf32(1.0 + ulp * 0.75), 1.0 + ulp);
    assert_eq!(round_to_tf32(1.0 + ulp / 2.0), 1.0, "a tie goes to even");
    assert_eq!(round_to_tf32(1.0 + ulp * 1.5), 1.0 + 2.0 * ulp);
    assert_eq!(round_to_tf32(-(1.0 + ulp * 0.75)), -(1.0 + ulp));
    assert_eq!(round_to_tf32(f32::INFINITY), f32::INFINITY);
    assert!(round_to_tf32(f32::NAN).is_nan());
    assert_eq!(round_to_tf32(f32::MAX), f32::INFINITY);
}

#[test]
fn twins_run_on_any_host_memory_in_place_and_strided() {
    let values: Vec<u8> = [
        1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect();
    let memory = Bytes(std::cell::RefCell::new(values));
    // In place: `x` and `out` alias.
    run(&Kernel::scale(BASE, 10.0, BASE, 6), &memory).unwrap();
    // The transpose of the 2x3 matrix into the second half.
    let copy = Kernel::StridedCopy {
        width: 4,
        src: BASE,
        dst: BASE + 24,
        layout: Strided::new(&[3, 2], &[1, 3]).unwrap(),
        n: 6,
    };
    run(&copy, &memory).unwrap();
    assert_eq!(
        floats(&memory),
        [10., 20., 30., 40., 50., 60., 10., 40., 20., 50., 30., 60.]
    );
    let past_the_end = Kernel::Unary {
        op: UnaryOp::Neg,
        dtype: DType::F32,
        x: BASE,
        out: BASE + 4,
        n: 12,
        alpha: 0.0,
    };
    assert!(run(&past_the_end, &memory).is_err());
}
