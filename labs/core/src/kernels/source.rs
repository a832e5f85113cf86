//! The CUDA modules, as NVRTC compiles them. The elementwise families are generated:
//! for each float dtype, the dtype's section of `kernels/dtypes.cu`, then the family
//! templates of `kernels/elementwise.cu`, then one `DEFINE_*` line per op declared in
//! [`super::ops`]. The other kernels are fixed sources.

use std::sync::OnceLock;

use super::{BinaryOp, Kernel, UnaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};

const DTYPES_CU: &str = include_str!("../../../../kernels/dtypes.cu");
const ELEMENTWISE_CU: &str = include_str!("../../../../kernels/elementwise.cu");
const RANDOM_CU: &str = include_str!("../../../../kernels/random.cu");
const SPIN_CU: &str = include_str!("../../../../kernels/spin.cu");
const STRIDED_CU: &str = include_str!("../../../../kernels/strided.cu");
const REDUCE_CU: &str = include_str!("../../../../kernels/reduce.cu");
const OPTIM_CU: &str = include_str!("../../../../kernels/optim.cu");

/// The dtypes the elementwise families are generated for, in module order.
pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Element widths the strided copy has a kernel for, in function order.
const COPY_WIDTHS: [usize; 4] = [1, 2, 4, 8];

/// A CUDA C module: its full source and the functions it defines.
#[derive(Debug)]
pub struct Module {
    pub name: String,
    pub source: String,
    pub functions: Vec<String>,
}

/// The suffix of a dtype's kernels (`add_f16`), for the dtypes with generated kernels.
pub fn suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        DType::I32 | DType::I64 | DType::U8 => None,
    }
}

/// The `// BEGIN name` .. `// END name` section of `kernels/dtypes.cu`.
fn dtype_section(suffix: &str) -> &'static str {
    let begin = format!("// BEGIN {suffix}\n");
    let end = format!("// END {suffix}\n");
    let start = DTYPES_CU
        .find(&begin)
        .expect("kernels/dtypes.cu has every dtype")
        + begin.len();
    let len = DTYPES_CU[start..]
        .find(&end)
        .expect("each section is closed");
    &DTYPES_CU[start..start + len]
}

/// A module of one elementwise family for one dtype: `(op name, CUDA expression)`
/// pairs become `DEFINE_<macro>(name_dtype, (expression))` lines.
fn family_module(family: &str, suffix: &str, ops: &[(&str, &str)]) -> Module {
    let macro_name = family.to_uppercase();
    let mut source = format!(
        "// Generated: the {suffix} section of kernels/dtypes.cu, kernels/elementwise.cu, \
         and the {family} ops of labs/core/src/kernels/ops.rs.\n"
    );
    source.push_str(dtype_section(suffix));
    source.push_str(ELEMENTWISE_CU);
    let mut functions = Vec::with_capacity(ops.len());
    for (name, expression) in ops {
        let function = format!("{name}_{suffix}");
        source.push_str(&format!(
            "DEFINE_{macro_name}({function}, ({expression}))\n"
        ));
        functions.push(function);
    }
    Module {
        name: format!("{family}_{suffix}"),
        source,
        functions,
    }
}

/// The reductions for one float dtype: the dtype's section of `kernels/dtypes.cu`, then
/// `kernels/reduce.cu` with each function renamed `{name}_{dtype}`.
fn reduce_module(suffix: &str) -> Module {
    let mut source = format!(
        "// Generated: the {suffix} section of kernels/dtypes.cu, then kernels/reduce.cu.\n"
    );
    source.push_str(dtype_section(suffix));
    source.push_str(&REDUCE_CU.replace("void sum_rows(", &format!("void sum_rows_{suffix}(")));
    Module {
        name: format!("reduce_{suffix}"),
        source,
        functions: vec![format!("sum_rows_{suffix}")],
    }
}

/// The optimizer steps for one parameter dtype: the dtype's section of
/// `kernels/dtypes.cu`, then `kernels/optim.cu` with each function renamed
/// `{name}_{dtype}`.
fn optim_module(suffix: &str) -> Module {
    let mut source = format!(
        "// Generated: the {suffix} section of kernels/dtypes.cu, then kernels/optim.cu.\n"
    );
    source.push_str(dtype_section(suffix));
    source.push_str(
        &OPTIM_CU
            .replace("void sgd_step(", &format!("void sgd_step_{suffix}("))
            .replace("void adam_step(", &format!("void adam_step_{suffix}(")),
    );
    Module {
        name: format!("optim_{suffix}"),
        source,
        functions: vec![format!("sgd_step_{suffix}"), format!("adam_step_{suffix}")],
    }
}

fn fixed_module(name: &str, source: &str, functions: &[&str]) -> Module {
    Module {
        name: name.into(),
        source: source.into(),
        functions: functions.iter().map(|f| f.to_string()).collect(),
    }
}

/// Every module, built once. Order: unary per float dtype, binary per float dtype,
/// the fixed modules, reductions per float dtype, optimizer steps per float dtype (see
/// [`function`]).
pub fn modules() -> &'static [Module] {
    static MODULES: OnceLock<Vec<Module>> = OnceLock::new();
    MODULES.get_or_init(|| {
        let unary: Vec<(&str, &str)> = UnaryOp::ALL.iter().map(|o| (o.name(), o.cuda())).collect();
        let binary: Vec<(&str, &str)> =
            BinaryOp::ALL.iter().map(|o| (o.name(), o.cuda())).collect();
        let mut modules = Vec::new();
        for dtype in FLOAT_DTYPES {
            modules.push(family_module("unary", suffix(dtype).unwrap(), &unary));
        }
        for dtype in FLOAT_DTYPES {
            modules.push(family_module("binary", suffix(dtype).unwrap(), &binary));
        }
        modules.push(fixed_module("random", RANDOM_CU, &["randn_f32"]));
        modules.push(fixed_module("spin", SPIN_CU, &["spin_f32"]));
        let copies: Vec<String> = COPY_WIDTHS
            .iter()
            .map(|w| format!("strided_copy_b{w}"))
            .collect();
        let copies: Vec<&str> = copies.iter().map(String::as_str).collect();
        modules.push(fixed_module("strided", STRIDED_CU, &copies));
        for dtype in FLOAT_DTYPES {
            modules.push(reduce_module(suffix(dtype).unwrap()));
        }
        for dtype in FLOAT_DTYPES {
            modules.push(optim_module(suffix(dtype).unwrap()));
        }
        modules
    })
}

fn float_index(dtype: DType, what: &str) -> Result<usize> {
    FLOAT_DTYPES
        .iter()
        .position(|&d| d == dtype)
        .ok_or_else(|| Error::InvalidArgument(format!("{what} has no kernel for dtype {dtype}")))
}

fn entry(module: usize, function: usize) -> (&'static Module, &'static str) {
    let m = &modules()[module];
    (m, m.functions[function].as_str())
}

/// The module and function of a launch (indices follow the order of [`modules`]).
pub fn function(kernel: &Kernel) -> Result<(&'static Module, &'static str)> {
    let families = FLOAT_DTYPES.len();
    Ok(match *kernel {
        Kernel::Unary { op, dtype, .. } => entry(float_index(dtype, op.name())?, op.index()),
        Kernel::Binary { op, dtype, .. } => {
            entry(families + float_index(dtype, op.name())?, op.index())
        }
        Kernel::Randn { .. } => entry(2 * families, 0),
        Kernel::Spin { .. } => entry(2 * families + 1, 0),
        Kernel::StridedCopy { width, .. } => {
            let i = COPY_WIDTHS
                .iter()
                .position(|&w| w == width)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("no strided copy for {width}-byte elements"))
                })?;
            entry(2 * families + 2, i)
        }
        Kernel::SumRows { dtype, .. } => entry(2 * families + 3 + float_index(dtype, "sum")?, 0),
        Kernel::SgdStep(s) => entry(3 * families + 3 + float_index(s.dtype, "sgd_step")?, 0),
        Kernel::AdamStep(s) => entry(3 * families + 3 + float_index(s.dtype, "adam_step")?, 1),
        Kernel::Gemm(_) => {
            return Err(Error::InvalidArgument(
                "gemm has no generated CUDA module: the cuda backend runs it through cuBLAS".into(),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Strided;

    #[test]
    fn every_module_defines_the_functions_it_lists() {
        for m in modules() {
            for f in &m.functions {
                let defined = m.source.contains(&format!("void {f}("))
                    || m.source.contains(&format!("DEFINE_UNARY({f}, "))
                    || m.source.contains(&format!("DEFINE_BINARY({f}, "))
                    || m.source.contains(&format!("DEFINE_STRIDED_COPY({f}, "));
                assert!(defined, "module {} does not define {f}", m.name);
            }
        }
    }

    #[test]
    fn function_names_are_unique_across_modules() {
        // The CUDA backend caches loaded functions by name.
        let mut names: Vec<&str> = modules()
            .iter()
            .flat_map(|m| m.functions.iter().map(String::as_str))
            .collect();
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count);
    }

    #[test]
    fn generated_modules_carry_their_dtype_and_each_op_expression() {
        let (m, f) = function(&Kernel::Binary {
            op: BinaryOp::Maximum,
            dtype: DType::BF16,
            a: 0,
            b: 0,
            out: 0,
            n: 1,
            alpha: 0.0,
        })
        .unwrap();
        assert_eq!((m.name.as_str(), f), ("binary_bf16", "maximum_bf16"));
        assert!(m
            .source
            .contains("DEFINE_BINARY(maximum_bf16, (fmaxf(a, b)))"));
        assert!(m.source.contains("typedef unsigned short ELEM;"));
        assert!(!m.source.contains("cvt.f32.f16"), "only the bf16 section");
        let (m, f) = function(&Kernel::scale(0, 2.0, 0, 1)).unwrap();
        assert_eq!((m.name.as_str(), f), ("unary_f32", "scale_f32"));
        assert!(m.source.contains("typedef float ELEM;"));
        for op in UnaryOp::ALL {
            assert!(m.source.contains(&format!("({})", op.cuda())));
        }
    }

    #[test]
    fn fixed_kernels_map_to_their_modules_and_bad_dtypes_are_errors() {
        let spin = Kernel::Spin {
            x: 0,
            n: 1,
            iterations: 1,
        };
        assert_eq!(function(&spin).unwrap().1, "spin_f32");
        let copy = |width| Kernel::StridedCopy {
            width,
            src: 0,
            dst: 0,
            layout: Strided::new(&[1], &[1]).unwrap(),
            n: 1,
        };
        assert_eq!(function(&copy(2)).unwrap().1, "strided_copy_b2");
        assert!(function(&copy(3)).is_err());
        let int_neg = Kernel::Unary {
            op: UnaryOp::Neg,
            dtype: DType::I32,
            x: 0,
            out: 0,
            n: 1,
            alpha: 0.0,
        };
        assert!(function(&int_neg).is_err());
        let adam = Kernel::AdamStep(crate::kernels::AdamStep {
            dtype: DType::BF16,
            param: 0,
            grad: 0,
            exp_avg: 0,
            exp_avg_sq: 0,
            n: 1,
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            step_size: 1.0,
            bias_correction2_sqrt: 1.0,
            eps: 1e-8,
            weight_decay: 0.0,
            param_decay: 1.0,
        });
        let (m, f) = function(&adam).unwrap();
        assert_eq!((m.name.as_str(), f), ("optim_bf16", "adam_step_bf16"));
        assert!(m.source.contains("void sgd_step_bf16("));
        let gemm = Kernel::Gemm(crate::kernels::Gemm::dense(DType::F32, 1, 1, 1, [0, 0, 0]));
        assert!(function(&gemm).is_err());
    }
}
