//! The public in-place ops and argument checks the layers above the tensors write with
//! (`copy_`, `zero_`, `fill_`, `write_bytes`, `is_same_view`, `check_*`): values on the
//! test device, and each refusal of a bad argument as one line.

use labs_core::tensor::no_grad;
use labs_core::testing::test_device;
use labs_core::{DType, Device, Error, Tensor};

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

fn one_line(e: Error) -> String {
    let s = e.to_string();
    assert!(!s.contains('\n'), "not one line: {s}");
    s
}

#[test]
fn copy_writes_dense_tensors_and_strided_views() {
    let d = test_device();
    let dst = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let src = Tensor::from_slice(&ramp(6), &[2, 3], &d).unwrap();
    dst.copy_(&src).unwrap();
    assert_eq!(dst.to_vec::<f32>().unwrap(), ramp(6));

    // Into a column of a matrix, from a transposed (strided) source.
    let m = Tensor::zeros(&[3, 2], DType::F32, &d).unwrap();
    let row = Tensor::from_slice(&[7.0f32, 8.0, 9.0], &[1, 3], &d).unwrap();
    m.narrow(1, 1, 1)
        .unwrap()
        .copy_(&row.transpose(0, 1).unwrap())
        .unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), [0.0, 7.0, 0.0, 8.0, 0.0, 9.0]);

    let empty = Tensor::zeros(&[0], DType::F32, &d).unwrap();
    empty
        .copy_(&Tensor::zeros(&[0], DType::F32, &d).unwrap())
        .unwrap();
}

#[test]
fn copy_refuses_other_shapes_dtypes_devices_repeats_and_recording() {
    let d = test_device();
    let dst = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let wide = Tensor::zeros(&[3, 2], DType::F32, &d).unwrap();
    let e = one_line(dst.copy_(&wide).unwrap_err());
    assert!(e.contains("[3, 2]") && e.contains("[2, 3]"), "{e}");
    let half = Tensor::zeros(&[2, 3], DType::F16, &d).unwrap();
    let e = one_line(dst.copy_(&half).unwrap_err());
    assert!(e.contains("float16"), "{e}");
    if d.id() != Device::cpu().id() {
        let host = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu()).unwrap();
        assert!(matches!(
            dst.copy_(&host),
            Err(Error::DeviceMismatch { .. })
        ));
    }
    let one = Tensor::zeros(&[1, 3], DType::F32, &d).unwrap();
    let repeated = one.expand(&[2, 3]).unwrap();
    let e = one_line(repeated.copy_(&dst).unwrap_err());
    assert!(e.contains("repeats elements"), "{e}");

    let param = Tensor::zeros(&[2, 3], DType::F32, &d)
        .unwrap()
        .requires_grad_(true);
    let e = one_line(param.copy_(&dst).unwrap_err());
    assert!(e.contains("copy_") && e.contains("no_grad"), "{e}");
    let _off = no_grad();
    let src = Tensor::full(&[2, 3], 2.0f32, &d).unwrap();
    param.copy_(&src).unwrap();
    assert_eq!(param.to_vec::<f32>().unwrap(), [2.0; 6]);
}

#[test]
fn zero_and_fill_write_every_element_of_their_dtype() {
    let d = test_device();
    let x = Tensor::from_slice(&ramp(5), &[5], &d).unwrap();
    x.zero_().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [0.0; 5]);
    x.fill_(1.5f32).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), [1.5; 5]);
    let i = Tensor::zeros(&[3], DType::I64, &d).unwrap();
    i.fill_(-3i64).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), [-3; 3]);
    i.zero_().unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), [0; 3]);

    let e = one_line(x.fill_(1i32).unwrap_err());
    assert!(e.contains("fill_") && e.contains("int32"), "{e}");
    // A transpose is dense in memory (one fill); a column is not (a copy into it).
    let m = Tensor::from_slice(&ramp(6), &[2, 3], &d).unwrap();
    m.transpose(0, 1).unwrap().fill_(2.0f32).unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), [2.0; 6]);
    m.narrow(1, 1, 1).unwrap().zero_().unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), [2.0, 0.0, 2.0, 2.0, 0.0, 2.0]);
    m.narrow(1, 2, 1).unwrap().fill_(5.0f32).unwrap();
    assert_eq!(m.to_vec::<f32>().unwrap(), [2.0, 0.0, 5.0, 2.0, 0.0, 5.0]);
    let row = Tensor::zeros(&[1, 3], DType::F32, &d).unwrap();
    let e = one_line(row.expand(&[2, 3]).unwrap().zero_().unwrap_err());
    assert!(e.contains("repeats elements"), "{e}");
    let param = Tensor::zeros(&[2], DType::F32, &d)
        .unwrap()
        .requires_grad_(true);
    assert!(param.zero_().is_err());
    assert!(no_grad_then(|| param.zero_()).is_ok());
}

fn no_grad_then<T>(f: impl FnOnce() -> T) -> T {
    let _off = no_grad();
    f()
}

#[test]
fn write_bytes_fills_a_tensor_piece_by_piece() {
    let d = test_device();
    let t = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let values = [1.0f32, 2.0, 3.0, 4.0];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    t.write_bytes(8, &bytes[8..]).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [0.0, 0.0, 3.0, 4.0]);
    t.write_bytes(0, &bytes[..8]).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), values);

    let e = one_line(t.write_bytes(12, &bytes[..8]).unwrap_err());
    assert!(
        e.contains("8 bytes at offset 12") && e.contains("16 bytes"),
        "{e}"
    );
    assert!(t.write_bytes(usize::MAX, &bytes[..1]).is_err());
    let m = Tensor::zeros(&[2, 2], DType::F32, &d).unwrap();
    assert!(m
        .transpose(0, 1)
        .unwrap()
        .write_bytes(0, &bytes[..4])
        .is_err());
}

#[test]
fn is_same_view_and_the_argument_checks() {
    let d = test_device();
    let m = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    assert!(m.is_same_view(&m.clone()));
    assert!(m.is_same_view(&m.narrow(0, 0, 2).unwrap()));
    assert!(!m.is_same_view(&m.narrow(0, 1, 1).unwrap()));
    assert!(!m.is_same_view(&m.view(&[6]).unwrap()));
    assert!(!m.is_same_view(&m.deep_clone().unwrap()));

    let t = m.transpose(0, 1).unwrap();
    m.check_contiguous("op").unwrap();
    let e = one_line(t.check_contiguous("op").unwrap_err());
    assert!(e.starts_with("op: ") && e.contains("not contiguous"), "{e}");
    m.check_same_shape(&m, "op").unwrap();
    let e = one_line(m.check_same_shape(&t, "op").unwrap_err());
    assert!(e.contains("[2, 3]") && e.contains("[3, 2]"), "{e}");
    let h = Tensor::zeros(&[2, 3], DType::F16, &d).unwrap();
    m.check_same_dtype(&m, "op").unwrap();
    let e = one_line(m.check_same_dtype(&h, "op").unwrap_err());
    assert!(e.contains("float32") && e.contains("float16"), "{e}");
    h.check_float_dtype("op").unwrap();
    let i = Tensor::zeros(&[1], DType::I32, &d).unwrap();
    let e = one_line(i.check_float_dtype("op").unwrap_err());
    assert!(e.contains("int32"), "{e}");
    m.check_same_device(&h).unwrap();
}
