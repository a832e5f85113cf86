//! The strided copy and scatter kernels, launched directly on layouts that reach each
//! of their paths on the GPU, checked byte for byte against a plain host reference:
//! ranks 1 to 6 (each rank up to 4 has a loop of its own, higher ones share one),
//! 16-byte vectors (and the addresses off 16 bytes that rule them out), tiled
//! transposes of sizes that are not whole tiles (and batches past the grid's 65535
//! limit), broadcast and negative strides, elements of 1, 2, 4 and 8 bytes, and the
//! guard bytes around the destination left as they were.

use labs_core::kernels::{Kernel, Strided};
use labs_core::testing::test_device;
use labs_core::{Device, Tensor};

const WIDTHS: [usize; 4] = [1, 2, 4, 8];

/// Guard elements before and after each buffer, so that a stray write shows.
const GUARD: usize = 5;

/// Elements from a buffer's start (16-byte aligned, as every allocation is) to the
/// first aligned place past `at` elements: a multiple of 16 elements of any width.
fn aligned_past(at: usize) -> usize {
    at.next_multiple_of(16)
}

/// A byte pattern in which a wrong element is all but sure to differ.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

/// The element offsets of a view in row-major order, by plain counting.
fn offsets(shape: &[usize], strides: &[isize]) -> Vec<isize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..n {
        out.push(
            index
                .iter()
                .zip(strides)
                .map(|(&i, &s)| i as isize * s)
                .sum(),
        );
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// A buffer of bytes on the device with its contents.
fn buffer(bytes: &[u8], d: &Device) -> Tensor {
    Tensor::from_slice(bytes, &[bytes.len()], d).unwrap()
}

/// One view: its shape and strides, and how many elements its first element and the
/// contiguous side start past a 16-byte-aligned address.
struct Case<'a> {
    shape: &'a [usize],
    strides: &'a [isize],
    view_shift: usize,
    dense_shift: usize,
}

impl Case<'_> {
    fn name(&self, what: &str, width: usize, layout: &Strided) -> String {
        format!(
            "{what} of {width}-byte elements, shape {:?} strides {:?} (launched as {:?} \
             {:?}), shifts {} and {}",
            self.shape,
            self.strides,
            &layout.shape[..layout.rank as usize],
            &layout.strides[..layout.rank as usize],
            self.view_shift,
            self.dense_shift
        )
    }

    /// The strided side: a buffer holding every offset of the view, and where in it
    /// (in elements) the view's first element lies.
    fn strided_side(&self) -> (usize, usize, Vec<isize>) {
        let offsets = offsets(self.shape, self.strides);
        let low = offsets.iter().copied().min().unwrap_or(0);
        let high = offsets.iter().copied().max().unwrap_or(0);
        let first = aligned_past(GUARD + (-low) as usize) + self.view_shift;
        let len = first + high.max(0) as usize + 1 + GUARD;
        (first, len, offsets)
    }

    /// Copies the view with `layout` (the view's or its coalesced form) and checks
    /// every byte of the destination.
    fn check_copy(&self, d: &Device, width: usize, layout: Strided) {
        let (first, len, offsets) = self.strided_side();
        let n = offsets.len();
        let src_bytes = pattern(len * width, 1);
        let src = buffer(&src_bytes, d);
        let dense_first = aligned_past(GUARD) + self.dense_shift;
        let dst_len = dense_first + n + GUARD;
        let mut expected = pattern(dst_len * width, 2);
        let dst = buffer(&expected, d);
        d.launch(&Kernel::StridedCopy {
            width,
            src: src.ptr() + (first * width) as u64,
            dst: dst.ptr() + (dense_first * width) as u64,
            layout,
            n,
        })
        .unwrap();
        for (i, &o) in offsets.iter().enumerate() {
            let from = (first as isize + o) as usize * width;
            let to = (dense_first + i) * width;
            expected[to..to + width].copy_from_slice(&src_bytes[from..from + width]);
        }
        let got = dst.to_vec::<u8>().unwrap();
        assert!(got == expected, "{}", self.name("copy", width, &layout));
    }

    /// Scatters contiguous elements into the view with `layout` and checks every byte
    /// of the strided side (the view must not repeat elements).
    fn check_scatter(&self, d: &Device, width: usize, layout: Strided) {
        let (first, len, offsets) = self.strided_side();
        let n = offsets.len();
        let dense_first = aligned_past(GUARD) + self.dense_shift;
        let src_bytes = pattern((dense_first + n + GUARD) * width, 3);
        let src = buffer(&src_bytes, d);
        let mut expected = pattern(len * width, 4);
        let dst = buffer(&expected, d);
        d.launch(&Kernel::StridedScatter {
            width,
            src: src.ptr() + (dense_first * width) as u64,
            dst: dst.ptr() + (first * width) as u64,
            layout,
            n,
        })
        .unwrap();
        for (i, &o) in offsets.iter().enumerate() {
            let from = (dense_first + i) * width;
            let to = (first as isize + o) as usize * width;
            expected[to..to + width].copy_from_slice(&src_bytes[from..from + width]);
        }
        let got = dst.to_vec::<u8>().unwrap();
        assert!(got == expected, "{}", self.name("scatter", width, &layout));
    }

    /// Both directions (the scatter where the view does not repeat), every width, the
    /// layout as given and coalesced, as the tensor layer launches it.
    fn check(&self, d: &Device, widths: &[usize]) {
        let layout = Strided::new(self.shape, self.strides).unwrap();
        let repeats = self
            .shape
            .iter()
            .zip(self.strides)
            .any(|(&size, &stride)| size > 1 && stride == 0);
        for &width in widths {
            for l in [layout, layout.coalesced()] {
                self.check_copy(d, width, l);
                if !repeats {
                    self.check_scatter(d, width, l);
                }
            }
        }
    }
}

/// Every case at every alignment: both sides aligned, either off by one element, and
/// both off by three.
fn check_shifted(d: &Device, shape: &[usize], strides: &[isize], widths: &[usize]) {
    for (view_shift, dense_shift) in [(0, 0), (1, 0), (0, 1), (3, 3)] {
        Case {
            shape,
            strides,
            view_shift,
            dense_shift,
        }
        .check(d, widths);
    }
}

/// The strides of a dense tensor of `shape` permuted by `dims`: the permuted shape
/// and its strides.
fn permuted(shape: &[usize], dims: &[usize]) -> (Vec<usize>, Vec<isize>) {
    let mut dense = vec![1isize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        dense[d] = dense[d + 1] * shape[d + 1] as isize;
    }
    (
        dims.iter().map(|&d| shape[d]).collect(),
        dims.iter().map(|&d| dense[d]).collect(),
    )
}

#[test]
fn permuted_views_of_ranks_one_to_six_move_every_element() {
    let d = test_device();
    // Each permutation keeps neighbours apart, so that coalescing leaves the rank.
    let cases: [(&[usize], &[usize]); 6] = [
        (&[37], &[0]),
        (&[5, 7], &[1, 0]),
        (&[3, 4, 5], &[2, 1, 0]),
        (&[2, 3, 4, 5], &[1, 3, 0, 2]),
        (&[2, 3, 2, 3, 4], &[4, 1, 3, 0, 2]),
        (&[2, 3, 2, 2, 3, 4], &[5, 2, 0, 4, 1, 3]),
    ];
    for (shape, dims) in cases {
        let (shape, strides) = permuted(shape, dims);
        let layout = Strided::new(&shape, &strides).unwrap();
        assert_eq!(layout.coalesced().rank as usize, shape.len(), "{shape:?}");
        check_shifted(&d, &shape, &strides, &WIDTHS);
    }
    // The scalar of rank 0 and a one-element view.
    check_shifted(&d, &[], &[], &WIDTHS);
    check_shifted(&d, &[1, 1], &[7, 3], &WIDTHS);
}

#[test]
fn rows_with_whole_vectors_move_in_vectors_and_agree_at_every_alignment() {
    let d = test_device();
    // Heads gathered from a packed projection [B, T, 3 H D] as [B, H, T, D], heads
    // from [B, T, H D], the query part of packed rows, and a contiguous run: the
    // layouts a training step copies and scatters (at a smaller batch).
    check_shifted(&d, &[2, 8, 10, 32], &[7680, 32, 768, 1], &WIDTHS);
    check_shifted(&d, &[2, 8, 10, 32], &[2560, 32, 256, 1], &WIDTHS);
    check_shifted(&d, &[20, 64], &[192, 1], &WIDTHS);
    check_shifted(&d, &[1000], &[1], &WIDTHS);
    // Rows of 36 elements: whole vectors of 4- and 8-byte elements only.
    check_shifted(&d, &[3, 5, 36], &[360, 72, 1], &WIDTHS);
    // Rank 5 and 6 rows (the shared loop), in vectors.
    let (shape, strides) = permuted(&[2, 3, 2, 3, 32], &[3, 1, 0, 2, 4]);
    check_shifted(&d, &shape, &strides, &WIDTHS);
    let (shape, strides) = permuted(&[2, 2, 3, 2, 3, 16], &[4, 2, 0, 3, 1, 5]);
    check_shifted(&d, &shape, &strides, &WIDTHS);
}

#[test]
fn transposes_of_sizes_that_are_not_whole_tiles_go_through_tiles_correctly() {
    let d = test_device();
    let transposes: [(&[usize], &[isize]); 6] = [
        // A matrix transpose: 2 x 2 tiles, both partial.
        (&[37, 45], &[1, 37]),
        // Exactly one tile, and one element past it on each side.
        (&[32, 32], &[1, 32]),
        (&[33, 33], &[1, 33]),
        // [B, T, D] as [B, D, T]: a batch of 3.
        (&[3, 33, 50], &[1650, 1, 33]),
        // The contiguous dimension between two batch dimensions.
        (&[5, 40, 3, 36], &[4320, 1, 1440, 40]),
        // The smallest sizes that are tiled.
        (&[8, 9], &[1, 8]),
    ];
    for (shape, strides) in transposes {
        let layout = Strided::new(shape, strides).unwrap();
        assert!(layout.coalesced().transposed_dim().is_some(), "{shape:?}");
        check_shifted(&d, shape, strides, &WIDTHS);
    }
    // Ranks 5 and 6 with a transpose in them.
    let (shape, strides) = permuted(&[2, 3, 2, 20, 33], &[1, 0, 2, 4, 3]);
    check_shifted(&d, &shape, &strides, &WIDTHS);
    let (shape, strides) = permuted(&[2, 2, 3, 2, 17, 9], &[3, 0, 2, 1, 5, 4]);
    check_shifted(&d, &shape, &strides, &WIDTHS);
    // Too small to tile: the element kernel.
    check_shifted(&d, &[7, 50], &[1, 7], &WIDTHS);
}

#[test]
fn broadcast_copies_repeat_their_elements() {
    let d = test_device();
    // A scalar expanded, rows repeated (in vectors), a column repeated along the last
    // dimension, and a transpose repeated over a batch.
    let cases: [(&[usize], &[isize]); 5] = [
        (&[300], &[0]),
        (&[4, 3, 16], &[0, 16, 1]),
        (&[6, 9], &[1, 0]),
        (&[3, 40, 50], &[0, 1, 40]),
        (&[2, 3, 4, 5, 6], &[0, 30, 0, 6, 1]),
    ];
    for (shape, strides) in cases {
        check_shifted(&d, shape, strides, &WIDTHS);
    }
}

#[test]
fn negative_strides_walk_backwards() {
    let d = test_device();
    let cases: [(&[usize], &[isize]); 5] = [
        // Reversed rows (in vectors), a reversed last dimension, reversed both.
        (&[5, 16], &[-16, 1]),
        (&[7, 9], &[9, -1]),
        (&[7, 9], &[-9, -1]),
        // A transpose whose contiguous dimension runs backwards (tiled).
        (&[40, 50], &[-1, 40]),
        // ... and one whose last dimension does.
        (&[40, 50], &[1, -40]),
    ];
    for (shape, strides) in cases {
        check_shifted(&d, shape, strides, &WIDTHS);
    }
}

#[test]
fn launches_larger_than_one_grid_loop_over_the_rest() {
    let d = test_device();
    // More elements than a grid of 32 blocks of 256 threads per multiprocessor holds
    // (about a million on 132 of them), element by element and in vectors.
    let case = |shape: &'static [usize], strides: &'static [isize], view_shift| Case {
        shape,
        strides,
        view_shift,
        dense_shift: 0,
    };
    case(&[2100, 1000], &[1001, 1], 1).check(&d, &[1]);
    case(&[4, 1_200_000], &[1_200_016, 1], 0).check(&d, &[4]);
    // A tiled transpose of more batches than the grid's z axis (65535) and more
    // tiles than its y axis.
    case(&[66_000, 8, 8], &[64, 1, 8], 0).check(&d, &[1]);
    case(&[2_100_000, 9], &[1, 2_100_000], 0).check(&d, &[1]);
}

#[test]
fn a_transposed_tensor_made_contiguous_is_its_transpose() {
    let d = test_device();
    // [B, T, D] read as [B, D, T] (a tiled launch on the GPU), in float32 and int64.
    let (b, t, c) = (3, 37, 45);
    let values: Vec<i64> = (0..(b * t * c) as i64).map(|v| v * 7 - 1000).collect();
    let expected: Vec<i64> = (0..b)
        .flat_map(|i| (0..c).flat_map(move |k| (0..t).map(move |j| (i * t + j) * c + k)))
        .map(|at| values[at])
        .collect();
    let x = Tensor::from_slice(&values, &[b, t, c], &d).unwrap();
    let y = x.transpose(1, 2).unwrap().contiguous().unwrap();
    assert_eq!(y.shape(), [b, c, t]);
    assert_eq!(y.to_vec::<i64>().unwrap(), expected);
    let floats: Vec<f32> = values.iter().map(|&v| v as f32 * 0.25).collect();
    let x = Tensor::from_slice(&floats, &[b, t, c], &d).unwrap();
    let y = x.transpose(1, 2).unwrap().contiguous().unwrap();
    let expected: Vec<f32> = expected.iter().map(|&v| v as f32 * 0.25).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), expected);
}
