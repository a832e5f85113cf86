//! Views over shared storage: values checked against host indexing, and no allocation
//! for any view. This binary holds one test on purpose: the allocator's
//! `memory_allocated` counts the whole device, so a test running beside it in the same
//! process would change the figure under it.

use half::f16;
use labs_core::testing::test_device;
use labs_core::{DType, Tensor};

/// `[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]`.
fn matrix(d: &labs_core::Device) -> Tensor {
    let values: Vec<f32> = (0..12).map(|i| i as f32).collect();
    Tensor::from_slice(&values, &[3, 4], d).unwrap()
}

#[test]
fn views_share_storage_allocate_nothing_and_read_like_host_indexing() {
    let d = test_device();
    let allocator = d.allocator().unwrap();
    let m = matrix(&d);
    let before = allocator.memory_allocated();

    let t = m.transpose(0, 1).unwrap();
    let rows = m.narrow(0, 1, 2).unwrap();
    let cols = m.narrow(1, 1, 2).unwrap();
    let flat = m.view(&[12]).unwrap();
    let cube = m.reshape(&[2, 3, 2]).unwrap();
    let column = Tensor::from_slice(&[10.0f32, 20.0, 30.0], &[3, 1], &d).unwrap();
    let with_column = allocator.memory_allocated();
    let wide = column.expand(&[2, 3, 4]).unwrap();
    assert_eq!(
        allocator.memory_allocated(),
        with_column,
        "expand allocated memory"
    );
    let views = [&t, &rows, &cols, &flat, &cube];
    assert!(views.iter().all(|v| v.shares_storage(&m)));
    assert!(wide.shares_storage(&column));
    assert_eq!(
        with_column - before,
        column.allocation().size(),
        "views allocated memory"
    );
    assert!(rows.is_contiguous() && flat.is_contiguous() && cube.is_contiguous());
    assert!(!t.is_contiguous() && !cols.is_contiguous() && !wide.is_contiguous());
    assert_eq!(t.strides(), [1, 4]);
    assert_eq!(rows.ptr(), m.ptr() + 4 * 4);
    assert_eq!(cols.ptr(), m.ptr() + 4);

    // Reading a view gathers it (a temporary copy, gone once read).
    let v = |x: &Tensor| x.to_vec::<f32>().unwrap();
    assert_eq!(v(&t), [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
    assert_eq!(v(&rows), [4., 5., 6., 7., 8., 9., 10., 11.]);
    assert_eq!(v(&cols), [1., 2., 5., 6., 9., 10.]);
    assert_eq!(v(&cube), (0..12).map(|i| i as f32).collect::<Vec<_>>());
    let expanded = v(&wide);
    for (i, x) in expanded.iter().enumerate() {
        assert_eq!(*x, [10.0, 20.0, 30.0][(i / 4) % 3], "expand at {i}");
    }
    assert_eq!(allocator.memory_allocated(), with_column);

    // A view of a view: the middle two columns of the transpose's last two rows.
    let tt = t.narrow(0, 2, 2).unwrap().narrow(1, 1, 2).unwrap();
    assert_eq!(tt.shape(), [2, 2]);
    assert_eq!(v(&tt), [6., 10., 7., 11.]);

    // Writes through the storage are seen by every view: views are not copies.
    m.axpy_(1.0, &m).unwrap();
    assert_eq!(v(&cols), [2., 4., 10., 12., 18., 20.]);

    // `contiguous` of a dense tensor is the tensor; of a view, a new dense tensor.
    assert!(m.contiguous().unwrap().shares_storage(&m));
    let dense = t.contiguous().unwrap();
    assert!(!dense.shares_storage(&m) && dense.is_contiguous());
    assert_eq!(dense.shape(), [4, 3]);
    assert!(allocator.memory_allocated() > with_column);
    drop(dense);
    assert_eq!(allocator.memory_allocated(), with_column);

    // `view` refuses what only a copy can do; `reshape` copies.
    assert!(t.view(&[12]).is_err());
    let r = t.reshape(&[12]).unwrap();
    assert!(!r.shares_storage(&m));
    assert_eq!(v(&r)[..4], [0., 8., 16., 2.]);

    // Every element width goes through the strided copy: 2-byte halves and 1-byte u8.
    let h: Vec<f16> = (0..6).map(|i| f16::from_f32(i as f32)).collect();
    let ht = Tensor::from_slice(&h, &[2, 3], &d).unwrap();
    let got = ht.transpose(0, 1).unwrap().to_vec::<f16>().unwrap();
    assert_eq!(got, [0., 3., 1., 4., 2., 5.].map(f16::from_f32));
    let bytes = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[3, 2], &d).unwrap();
    let got = bytes.transpose(0, 1).unwrap().to_vec::<u8>().unwrap();
    assert_eq!(got, [1, 3, 5, 2, 4, 6]);
    // Moving a view to another device moves its elements, not its storage.
    let host = cols.cpu().unwrap();
    assert!(host.is_contiguous());
    assert_eq!(v(&host), [2., 4., 10., 12., 18., 20.]);
    let empty = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    assert_eq!(v(&empty.transpose(0, 1).unwrap()), Vec::<f32>::new());
}
