//! Binary ops on float operands of two different dtypes, each read in its own dtype
//! (PyTorch's TensorIterator "dynamic casting" on CUDA): `x_f32 + y_bf16` in one
//! kernel that widens each element of `y` as it loads it, where casting first would
//! launch a cast kernel and allocate a float32 copy of `y`. The result is float32, the
//! promoted dtype of any two different float dtypes (`torch.promote_types`).
//!
//! Every op of [`BinaryOp`] has a kernel for every ordered pair of different float
//! dtypes, dense, with a broadcast row, and strided, the three forms the same-dtype
//! kernels have: `kernels/mixed.cu` holds the templates, [`modules`] generates one
//! module per pair, named `binary_mixed_{a}_{b}`, with functions `{op}_{a}_{b}`,
//! `{op}_rows_{a}_{b}` and `{op}_strided_{a}_{b}`. The twins are in `mixed_cpu.rs`.
//!
//! Each element is widened to float exactly, as a cast to float32 would, and the op's
//! expression is the float32 kernel's: the result has the bits of casting first.

use super::source::{dtype_name, dtype_section, layout_section, FLOAT_DTYPES};
use super::{BinaryOp, Module, Strided};
use crate::device_id::DevicePtr;
use crate::dtype::DType;
use crate::error::{Error, Result};

const MIXED_CU: &str = include_str!("../../../../../kernels/mixed.cu");

/// How the operands of a [`MixedBinary`] lie over its `n` dense output elements. The
/// strided form carries its two layouts by value, as `Kernel::BinaryStrided` does: a
/// launch record is built once per launch, and the layouts go to the GPU by value.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MixedForm {
    /// Both dense, of the output's shape.
    Dense,
    /// One dense, the other a dense row of `cols` elements repeated over it (a bias),
    /// as `Kernel::BinaryRows`: the row is `a` when `row_first`.
    Rows { cols: usize, row_first: bool },
    /// Any layouts, broadcast ones included (stride 0), as `Kernel::BinaryStrided`;
    /// `a` and `b` are the addresses of each view's first element.
    Strided {
        a_layout: Strided,
        b_layout: Strided,
    },
}

/// `out[i] = op(a[i], b[i])` into `n` dense float32 elements, `a` read as `a_dtype` and
/// `b` as `b_dtype`, two different float dtypes; `alpha` as for `Kernel::Binary`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixedBinary {
    pub op: BinaryOp,
    pub a_dtype: DType,
    pub b_dtype: DType,
    pub a: DevicePtr,
    pub b: DevicePtr,
    pub out: DevicePtr,
    pub n: usize,
    pub alpha: f32,
    pub form: MixedForm,
}

impl MixedBinary {
    /// The dtype of the output: float32, what any two different float dtypes promote
    /// to.
    pub const OUT_DTYPE: DType = DType::F32;

    /// The CUDA function's name (`add_f32_bf16`, `mul_rows_bf16_f32`,
    /// `div_strided_f16_f32`).
    pub fn function_name(&self) -> String {
        let form = match self.form {
            MixedForm::Dense => "",
            MixedForm::Rows { .. } => "_rows",
            MixedForm::Strided { .. } => "_strided",
        };
        format!(
            "{}{form}_{}_{}",
            self.op.name(),
            dtype_name(self.a_dtype),
            dtype_name(self.b_dtype)
        )
    }

    /// An error unless the operands are two different float dtypes (no kernel is
    /// generated for the others: one dtype runs the same-dtype kernels).
    pub fn validate(&self) -> Result<()> {
        let float = |d| FLOAT_DTYPES.contains(&d);
        if self.a_dtype == self.b_dtype || !float(self.a_dtype) || !float(self.b_dtype) {
            return Err(Error::InvalidArgument(format!(
                "{} has no mixed-dtype kernel for {} and {}: it takes two different float \
                 dtypes",
                self.op.name(),
                self.a_dtype,
                self.b_dtype
            )));
        }
        if let MixedForm::Rows { cols, .. } = self.form {
            if self.n > 0 && (cols == 0 || !self.n.is_multiple_of(cols)) {
                return Err(Error::InvalidArgument(format!(
                    "a broadcast row of {cols} elements over {} elements",
                    self.n
                )));
            }
        }
        Ok(())
    }

    /// How many GPU threads the launch wants: one per four elements for the dense and
    /// row forms (each moves four at a time when it can), one per element strided.
    pub fn threads(&self) -> usize {
        match self.form {
            MixedForm::Dense | MixedForm::Rows { .. } => self.n.div_ceil(4),
            MixedForm::Strided { .. } => self.n,
        }
    }
}

/// The module of one ordered pair of dtypes: both dtypes' sections of
/// `kernels/dtypes.cu`, each in a namespace of its name, aliased `A` (the first
/// operand's) and `B`, the layout part of `kernels/strided.cu`, `kernels/mixed.cu`,
/// then the three forms of every op.
fn pair_module(a: DType, b: DType) -> Module {
    let (sa, sb) = (dtype_name(a), dtype_name(b));
    let mut source = format!(
        "// Generated: the {sa} and {sb} sections of kernels/dtypes.cu, the layout of \
         kernels/strided.cu, kernels/mixed.cu, and the binary ops of \
         labs/core/device/src/kernels/ops.rs.\n"
    );
    for s in [sa, sb] {
        source.push_str(&format!("namespace {s} {{\n{}}}\n", dtype_section(s)));
    }
    source.push_str(&format!("namespace A = {sa};\nnamespace B = {sb};\n"));
    source.push_str(layout_section());
    source.push_str(MIXED_CU);
    let mut functions = Vec::new();
    for op in BinaryOp::ALL {
        for (macro_name, form) in [
            ("MIXED", ""),
            ("MIXED_ROWS", "_rows"),
            ("MIXED_STRIDED", "_strided"),
        ] {
            let f = format!("{}{form}_{sa}_{sb}", op.name());
            source.push_str(&format!("DEFINE_{macro_name}({f}, ({}))\n", op.cuda()));
            functions.push(f);
        }
    }
    Module {
        name: format!("binary_mixed_{sa}_{sb}"),
        source,
        functions,
    }
}

/// The mixed-dtype modules, one per ordered pair of different float dtypes.
pub(super) fn modules() -> Vec<Module> {
    let mut modules = Vec::new();
    for a in FLOAT_DTYPES {
        for b in FLOAT_DTYPES {
            if a != b {
                modules.push(pair_module(a, b));
            }
        }
    }
    modules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Kernel;

    fn launch(a_dtype: DType, b_dtype: DType, form: MixedForm) -> MixedBinary {
        MixedBinary {
            op: BinaryOp::Add,
            a_dtype,
            b_dtype,
            a: 0,
            b: 0,
            out: 0,
            n: 8,
            alpha: 0.0,
            form,
        }
    }

    #[test]
    fn each_pair_has_a_module_reading_each_operand_in_its_dtype() {
        let k = launch(DType::F32, DType::BF16, MixedForm::Dense);
        let (m, f) = Kernel::MixedBinary(k).function().unwrap();
        assert_eq!(
            (m.name.as_str(), f),
            ("binary_mixed_f32_bf16", "add_f32_bf16")
        );
        assert!(m.source.contains("namespace A = f32;\nnamespace B = bf16;"));
        assert!(m.source.contains("namespace bf16 {\n"));
        assert!(
            !m.source.contains("cvt.f32.f16"),
            "only the two dtypes' sections"
        );
        assert!(m.source.contains("DEFINE_MIXED(add_f32_bf16, (a + b))"));
        assert!(m
            .source
            .contains("DEFINE_MIXED_ROWS(div_rows_f32_bf16, (a / b))"));
        assert!(m
            .source
            .contains("DEFINE_MIXED_STRIDED(mul_strided_f32_bf16, (a * b))"));
        let rows = launch(
            DType::BF16,
            DType::F32,
            MixedForm::Rows {
                cols: 4,
                row_first: true,
            },
        );
        let (m, f) = Kernel::MixedBinary(rows).function().unwrap();
        assert_eq!(
            (m.name.as_str(), f),
            ("binary_mixed_bf16_f32", "add_rows_bf16_f32")
        );
        assert_eq!(modules().len(), 6);
    }

    #[test]
    fn one_dtype_or_an_integer_operand_has_no_mixed_kernel() {
        for (a, b) in [
            (DType::F32, DType::F32),
            (DType::F32, DType::I32),
            (DType::U8, DType::F16),
        ] {
            let k = launch(a, b, MixedForm::Dense);
            let e = k.validate().unwrap_err().to_string();
            assert!(e.contains("no mixed-dtype kernel"), "{e}");
            assert!(Kernel::MixedBinary(k).function().is_err());
        }
        let bad_row = launch(
            DType::F32,
            DType::F16,
            MixedForm::Rows {
                cols: 3,
                row_first: false,
            },
        );
        assert!(bad_row.validate().is_err(), "8 elements are not rows of 3");
    }
}
