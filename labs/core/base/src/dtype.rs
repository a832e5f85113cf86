//! Element types, at the bottom of the crate: everything above may name them. `f16` and
//! `bf16` come from the `half` crate. Every dtype can be stored, filled, copied, cast and
//! compared; elementwise arithmetic runs on every dtype (integers for the ops PyTorch
//! runs on them), reductions and matrix products on the float ones. `U8` also stands for
//! PyTorch's `bool`: comparisons give uint8 masks of 0 and 1.

use std::fmt;

use half::{bf16, f16};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    U8,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
        })
    }
}

/// A bit pattern to fill memory with (`cuMemsetD8/D16/D32`): fills work for every dtype
/// by writing the element's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillPattern {
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
}

impl FillPattern {
    pub fn width(self) -> usize {
        match self {
            FillPattern::U8(_) => 1,
            FillPattern::U16(_) => 2,
            FillPattern::U32(_) => 4,
            FillPattern::U64(_) => 8,
        }
    }
}

/// A Rust type that can be a tensor element.
///
/// # Safety
/// Implementors must be plain old data: every bit pattern of `size_of::<Self>()` bytes
/// is a valid value, and the type has no padding.
pub unsafe trait Element: Copy + Send + Sync + 'static + fmt::Debug {
    const DTYPE: DType;
    /// The element's bits as a fill pattern of its width.
    fn pattern(self) -> FillPattern;
}

unsafe impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn pattern(self) -> FillPattern {
        FillPattern::U32(self.to_bits())
    }
}
unsafe impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn pattern(self) -> FillPattern {
        FillPattern::U16(self.to_bits())
    }
}
unsafe impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn pattern(self) -> FillPattern {
        FillPattern::U16(self.to_bits())
    }
}
unsafe impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn pattern(self) -> FillPattern {
        FillPattern::U32(self as u32)
    }
}
unsafe impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn pattern(self) -> FillPattern {
        FillPattern::U64(self as u64)
    }
}
unsafe impl Element for u8 {
    const DTYPE: DType = DType::U8;
    fn pattern(self) -> FillPattern {
        FillPattern::U8(self)
    }
}

/// The bytes of a slice of elements.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain old data without padding.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) }
}

/// Elements from bytes (any alignment).
pub fn from_bytes<T: Element>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut out: Vec<T> = Vec::with_capacity(n);
    // SAFETY: `Element` types accept any bit pattern; exactly n elements are written.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            out.as_mut_ptr() as *mut u8,
            n * std::mem::size_of::<T>(),
        );
        out.set_len(n);
    }
    out
}
