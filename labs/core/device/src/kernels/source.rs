//! The CUDA modules, as NVRTC compiles them. The elementwise families are generated:
//! for each dtype, the dtype's section of `kernels/dtypes.cu`, the layout part of
//! `kernels/strided.cu`, the family templates of `kernels/elementwise.cu`, then one
//! `DEFINE_*` line per op declared in [`super::ops`] that has an expression for the
//! dtype (float-only ops have none for the integer dtypes). Casts are one module of
//! every pair of dtypes; the mixed-dtype binary ops one module per pair of float dtypes
//! (`mixed.rs`). The other kernels are fixed sources.
//!
//! Functions are found by name (`add_f32`, `add_strided_i64`, `cast_f32_u8`): a launch
//! of an op with no kernel for its dtype is an error naming both.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::attention::{ATTENTION_FUNCTIONS, FLASH_FUNCTIONS};
use super::attention_chunk::ATTENTION_CHUNK_FUNCTIONS;
use super::rows::ROW_FUNCTIONS;
use super::{BinaryOp, CompareOp, Kernel, UnaryOp};
use crate::dtype::DType;
use crate::error::{Error, Result};

const DTYPES_CU: &str = include_str!("../../../../../kernels/dtypes.cu");
const ELEMENTWISE_CU: &str = include_str!("../../../../../kernels/elementwise.cu");
const CAST_CU: &str = include_str!("../../../../../kernels/cast.cu");
const RANDOM_CU: &str = include_str!("../../../../../kernels/random.cu");
const ARANGE_CU: &str = include_str!("../../../../../kernels/arange.cu");
const SPIN_CU: &str = include_str!("../../../../../kernels/spin.cu");
const STRIDED_CU: &str = include_str!("../../../../../kernels/strided.cu");
const REDUCE_CU: &str = include_str!("../../../../../kernels/reduce.cu");
const ROWS_CU: &str = include_str!("../../../../../kernels/rows.cu");
const ATTENTION_CU: &str = include_str!("../../../../../kernels/attention.cu");
const ATTENTION_CHUNK_CU: &str = include_str!("../../../../../kernels/attention_chunk.cu");
const ATTENTION_FLASH_CU: &str = include_str!("../../../../../kernels/attention_flash.cu");
const SCATTER_CU: &str = include_str!("../../../../../kernels/scatter.cu");
const OPTIM_CU: &str = include_str!("../../../../../kernels/optim.cu");
const AMP_CU: &str = include_str!("../../../../../kernels/amp.cu");
const AMP_UPDATE_CU: &str = include_str!("../../../../../kernels/amp_update.cu");

/// The float dtypes (every elementwise op and the reductions have kernels for them).
pub const FLOAT_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Every dtype, in module order: the integer ones have the ops with an integer
/// expression, comparisons, `where` and casts.
pub const ALL_DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::U8,
];

/// Element widths the strided copy has a kernel for, in function order.
const COPY_WIDTHS: [usize; 4] = [1, 2, 4, 8];

/// A CUDA C module: its full source and the functions it defines.
#[derive(Debug)]
pub struct Module {
    pub name: String,
    pub source: String,
    pub functions: Vec<String>,
}

/// The suffix of a dtype's kernels (`add_f16`, `add_i64`).
pub fn suffix(dtype: DType) -> Option<&'static str> {
    Some(name(dtype))
}

/// The dtype's name in kernel and module names (`f32`, `bf16`).
pub(super) fn dtype_name(dtype: DType) -> &'static str {
    name(dtype)
}

fn name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 => "u8",
    }
}

fn is_float(dtype: DType) -> bool {
    FLOAT_DTYPES.contains(&dtype)
}

/// The `// BEGIN name` .. `// END name` section of a source.
fn section(source: &'static str, name: &str) -> &'static str {
    let begin = format!("// BEGIN {name}");
    let end = format!("// END {name}\n");
    let start = source.find(&begin).expect("the source has the section");
    let start = start + source[start..].find('\n').expect("a marker line") + 1;
    let len = source[start..].find(&end).expect("each section is closed");
    &source[start..start + len]
}

/// A dtype's section of `kernels/dtypes.cu` (`f32`, `bf16`, ...).
pub(super) fn dtype_section(suffix: &str) -> &'static str {
    section(DTYPES_CU, suffix)
}

/// The layout part of `kernels/strided.cu` (`struct Strided`, `strided_offset`).
pub(super) fn layout_section() -> &'static str {
    section(STRIDED_CU, "layout")
}

/// The generated lines of one dtype's module of a family: `(macro, function, expression)`.
fn generated(family: &str, suffix: &str, lines: &[(&str, String, String)]) -> Module {
    let mut source = format!(
        "// Generated: the {suffix} section of kernels/dtypes.cu, the layout of \
         kernels/strided.cu, kernels/elementwise.cu, and the {family} ops of \
         labs/core/device/src/kernels/ops.rs.\n"
    );
    source.push_str(dtype_section(suffix));
    source.push_str(section(STRIDED_CU, "layout"));
    source.push_str(ELEMENTWISE_CU);
    let mut functions = Vec::with_capacity(lines.len());
    for (macro_name, function, expression) in lines {
        if expression.is_empty() {
            source.push_str(&format!("DEFINE_{macro_name}({function})\n"));
        } else {
            source.push_str(&format!(
                "DEFINE_{macro_name}({function}, ({expression}))\n"
            ));
        }
        functions.push(function.clone());
    }
    Module {
        name: format!("{family}_{suffix}"),
        source,
        functions,
    }
}

/// The unary ops of one dtype.
fn unary_module(dtype: DType) -> Module {
    let s = name(dtype);
    let lines: Vec<_> = UnaryOp::ALL
        .iter()
        .filter_map(|op| {
            let e = if is_float(dtype) {
                Some(op.cuda())
            } else {
                op.int_cuda()
            };
            e.map(|e| ("UNARY", format!("{}_{s}", op.name()), e.to_string()))
        })
        .collect();
    generated("unary", s, &lines)
}

/// The binary ops of one dtype: dense, strided, and with a broadcast row.
fn binary_module(dtype: DType) -> Module {
    let s = name(dtype);
    let mut lines = Vec::new();
    for op in BinaryOp::ALL {
        let e = if is_float(dtype) {
            Some(op.cuda())
        } else {
            op.int_cuda()
        };
        if let Some(e) = e {
            lines.push(("BINARY", format!("{}_{s}", op.name()), e.to_string()));
            lines.push((
                "BINARY_STRIDED",
                format!("{}_strided_{s}", op.name()),
                e.to_string(),
            ));
            lines.push((
                "BINARY_ROWS",
                format!("{}_rows_{s}", op.name()),
                e.to_string(),
            ));
        }
    }
    generated("binary", s, &lines)
}

/// Comparisons and `where` of one dtype.
fn compare_module(dtype: DType) -> Module {
    let s = name(dtype);
    let mut lines: Vec<_> = CompareOp::ALL
        .iter()
        .map(|op| {
            (
                "COMPARE",
                format!("{}_{s}", op.name()),
                op.cuda().to_string(),
            )
        })
        .collect();
    lines.push(("WHERE", format!("where_{s}"), String::new()));
    generated("compare", s, &lines)
}

/// Casts between every pair of distinct dtypes: every dtype section in a namespace of
/// its name, then `kernels/cast.cu` and a `DEFINE_CAST` line per pair.
fn cast_module() -> Module {
    let mut source = String::from(
        "// Generated: every section of kernels/dtypes.cu in a namespace of its name, then \
         kernels/cast.cu.\n",
    );
    for dtype in ALL_DTYPES {
        let s = name(dtype);
        source.push_str(&format!("namespace {s} {{\n{}}}\n", dtype_section(s)));
    }
    source.push_str(CAST_CU);
    let mut functions = Vec::new();
    for from in ALL_DTYPES {
        for to in ALL_DTYPES {
            if from != to {
                let f = cast_name(from, to);
                source.push_str(&format!("DEFINE_CAST({f}, {}, {})\n", name(from), name(to)));
                functions.push(f);
            }
        }
    }
    Module {
        name: "cast".into(),
        source,
        functions,
    }
}

fn cast_name(from: DType, to: DType) -> String {
    format!("cast_{}_{}", name(from), name(to))
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

/// The row kernels (softmax, layer norm, dropout, ...) for one float dtype: the dtype's
/// section of `kernels/dtypes.cu`, then `kernels/rows.cu` with every `NAME_DT` renamed
/// `NAME_{dtype}`.
fn rows_module(suffix: &str) -> Module {
    let mut source =
        format!("// Generated: the {suffix} section of kernels/dtypes.cu, then kernels/rows.cu.\n");
    source.push_str(dtype_section(suffix));
    source.push_str(&ROWS_CU.replace("_DT(", &format!("_{suffix}(")));
    Module {
        name: format!("rows_{suffix}"),
        source,
        functions: ROW_FUNCTIONS
            .iter()
            .map(|f| format!("{f}_{suffix}"))
            .collect(),
    }
}

/// The attention kernels for one float dtype: the dtype's section of
/// `kernels/dtypes.cu`, then `kernels/attention.cu` (the fused kernels) and
/// `kernels/attention_chunk.cu` (the row kernels of chunked attention, which use the
/// first file's helpers) with every `NAME_DT` renamed `NAME_{dtype}`.
fn attention_module(suffix: &str) -> Module {
    let mut source = format!(
        "// Generated: the {suffix} section of kernels/dtypes.cu, then kernels/attention.cu \
         and kernels/attention_chunk.cu.\n"
    );
    source.push_str(dtype_section(suffix));
    let rename = format!("_{suffix}(");
    source.push_str(&ATTENTION_CU.replace("_DT(", &rename));
    source.push_str(&ATTENTION_CHUNK_CU.replace("_DT(", &rename));
    Module {
        name: format!("attention_{suffix}"),
        source,
        functions: ATTENTION_FUNCTIONS
            .iter()
            .chain(&ATTENTION_CHUNK_FUNCTIONS)
            .map(|f| format!("{f}_{suffix}"))
            .collect(),
    }
}

/// The tensor-core attention kernels for one float dtype: the `common` section of
/// `kernels/attention_flash.cu`, its `half` section (with `FL_TYPE` defined as the
/// dtype's PTX name) or its `tf32` section for float32, then its `kernels` section,
/// every `NAME_DT` renamed `NAME_{dtype}`. Their own module, compiled only when a call
/// uses them (they need sm_80).
fn attention_flash_module(dtype: DType) -> Module {
    let suffix = name(dtype);
    let mut source = format!("// Generated: kernels/attention_flash.cu for {suffix}.\n");
    source.push_str(section(ATTENTION_FLASH_CU, "common"));
    if dtype == DType::F32 {
        source.push_str(section(ATTENTION_FLASH_CU, "tf32"));
    } else {
        source.push_str(&format!("#define FL_TYPE {suffix}\n"));
        source.push_str(section(ATTENTION_FLASH_CU, "half"));
    }
    source
        .push_str(&section(ATTENTION_FLASH_CU, "kernels").replace("_DT(", &format!("_{suffix}(")));
    Module {
        name: format!("attention_flash_{suffix}"),
        source,
        functions: FLASH_FUNCTIONS
            .iter()
            .flatten()
            .map(|f| format!("{f}_{suffix}"))
            .collect(),
    }
}

/// The functions of the strided copy (`kind` "copy") or scatter: the element kernel of
/// each width, then the tiled transpose of each width.
fn strided_functions(kind: &str) -> Vec<String> {
    let plain = COPY_WIDTHS.iter().map(|w| format!("strided_{kind}_b{w}"));
    let tiled = COPY_WIDTHS
        .iter()
        .map(|w| format!("strided_{kind}_tiled_b{w}"));
    plain.chain(tiled).collect()
}

fn fixed_module(name: &str, source: &str, functions: &[&str]) -> Module {
    Module {
        name: name.into(),
        source: source.into(),
        functions: functions.iter().map(|f| f.to_string()).collect(),
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

/// The gradient scaler's check for one gradient dtype: the dtype's section of
/// `kernels/dtypes.cu`, then `kernels/amp.cu` with the function renamed
/// `non_finite_check_and_unscale_{dtype}`.
fn amp_module(suffix: &str) -> Module {
    let mut source =
        format!("// Generated: the {suffix} section of kernels/dtypes.cu, then kernels/amp.cu.\n");
    source.push_str(dtype_section(suffix));
    source.push_str(&AMP_CU.replace(
        "void non_finite_check_and_unscale(",
        &format!("void non_finite_check_and_unscale_{suffix}("),
    ));
    Module {
        name: format!("amp_{suffix}"),
        source,
        functions: vec![format!("non_finite_check_and_unscale_{suffix}")],
    }
}

struct Registry {
    modules: Vec<Module>,
    /// Function name -> (module index, function index).
    by_name: HashMap<String, (usize, usize)>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut modules = Vec::new();
        for dtype in ALL_DTYPES {
            modules.push(unary_module(dtype));
        }
        for dtype in ALL_DTYPES {
            modules.push(binary_module(dtype));
        }
        modules.extend(super::mixed::modules());
        for dtype in ALL_DTYPES {
            modules.push(compare_module(dtype));
        }
        modules.push(cast_module());
        modules.push(fixed_module("random", RANDOM_CU, &["randn_f32"]));
        modules.push(fixed_module("arange", ARANGE_CU, &["arange_i64"]));
        modules.push(fixed_module("spin", SPIN_CU, &["spin_f32"]));
        let copies = strided_functions("copy");
        let copies: Vec<&str> = copies.iter().map(String::as_str).collect();
        modules.push(fixed_module("strided", STRIDED_CU, &copies));
        for dtype in FLOAT_DTYPES {
            modules.push(reduce_module(name(dtype)));
        }
        for dtype in FLOAT_DTYPES {
            modules.push(rows_module(name(dtype)));
        }
        let scatters = strided_functions("scatter");
        let scatters: Vec<&str> = scatters.iter().map(String::as_str).collect();
        modules.push(fixed_module(
            "scatter",
            &format!(
                "// Generated: the layout and moves parts of kernels/strided.cu, then \
                 kernels/scatter.cu.\n{}{}{SCATTER_CU}",
                section(STRIDED_CU, "layout"),
                section(STRIDED_CU, "moves")
            ),
            &scatters,
        ));
        for dtype in FLOAT_DTYPES {
            modules.push(optim_module(name(dtype)));
        }
        for dtype in FLOAT_DTYPES {
            modules.push(attention_module(name(dtype)));
            modules.push(amp_module(name(dtype)));
        }
        for dtype in FLOAT_DTYPES {
            modules.push(attention_flash_module(dtype));
        }
        modules.push(fixed_module(
            "amp_update",
            AMP_UPDATE_CU,
            &["amp_update_scale"],
        ));
        let mut by_name = HashMap::new();
        for (m, module) in modules.iter().enumerate() {
            for (f, function) in module.functions.iter().enumerate() {
                by_name.insert(function.clone(), (m, f));
            }
        }
        Registry { modules, by_name }
    })
}

/// Every module, built once.
pub fn modules() -> &'static [Module] {
    &registry().modules
}

/// The module and function of a launch.
pub fn function(kernel: &Kernel) -> Result<(&'static Module, &'static str)> {
    lookup(kernel, false)
}

/// The tiled-transpose kernel of a strided copy or scatter (`strided_copy_tiled_b4`,
/// in the module of `strided_copy_b4`); an error for any other kernel.
pub fn tiled_function(kernel: &Kernel) -> Result<(&'static Module, &'static str)> {
    match kernel {
        Kernel::StridedCopy { .. } | Kernel::StridedScatter { .. } => lookup(kernel, true),
        _ => Err(Error::InvalidArgument(
            "only strided copies and scatters have a tiled kernel".into(),
        )),
    }
}

/// The function of a launch, or of its tiled transpose when `tiled`.
fn lookup(kernel: &Kernel, tiled: bool) -> Result<(&'static Module, &'static str)> {
    let (wanted, what, dtype) = match *kernel {
        Kernel::Unary { op, dtype, .. } => {
            (format!("{}_{}", op.name(), name(dtype)), op.name(), dtype)
        }
        Kernel::Binary { op, dtype, .. } => {
            (format!("{}_{}", op.name(), name(dtype)), op.name(), dtype)
        }
        Kernel::BinaryStrided { op, dtype, .. } => (
            format!("{}_strided_{}", op.name(), name(dtype)),
            op.name(),
            dtype,
        ),
        Kernel::BinaryRows { op, dtype, .. } => (
            format!("{}_rows_{}", op.name(), name(dtype)),
            op.name(),
            dtype,
        ),
        Kernel::MixedBinary(ref m) => {
            m.validate()?;
            (m.function_name(), m.op.name(), m.a_dtype)
        }
        Kernel::Compare { op, dtype, .. } => {
            (format!("{}_{}", op.name(), name(dtype)), op.name(), dtype)
        }
        Kernel::Where { dtype, .. } => (format!("where_{}", name(dtype)), "where", dtype),
        Kernel::Cast { from, to, .. } => (cast_name(from, to), "cast", from),
        Kernel::Randn { .. } => ("randn_f32".into(), "randn", DType::F32),
        Kernel::Arange { .. } => ("arange_i64".into(), "arange", DType::I64),
        Kernel::Spin { .. } => ("spin_f32".into(), "spin", DType::F32),
        Kernel::StridedCopy { width, .. } => {
            if !COPY_WIDTHS.contains(&width) {
                return Err(Error::InvalidArgument(format!(
                    "no strided copy for {width}-byte elements"
                )));
            }
            let tiled = if tiled { "tiled_" } else { "" };
            (
                format!("strided_copy_{tiled}b{width}"),
                "strided copy",
                DType::U8,
            )
        }
        Kernel::SumRows { dtype, .. } => (format!("sum_rows_{}", name(dtype)), "sum", dtype),
        Kernel::StridedScatter { width, .. } => {
            if !COPY_WIDTHS.contains(&width) {
                return Err(Error::InvalidArgument(format!(
                    "no strided scatter for {width}-byte elements"
                )));
            }
            let tiled = if tiled { "tiled_" } else { "" };
            (
                format!("strided_scatter_{tiled}b{width}"),
                "strided scatter",
                DType::U8,
            )
        }
        Kernel::Rows(ref k) => {
            k.check_dtypes()?;
            (
                format!("{}_{}", k.name(), name(k.dtype())),
                k.name(),
                k.dtype(),
            )
        }
        Kernel::Attention(ref k) => (
            format!("{}_{}", k.name(), name(k.dtype())),
            k.name(),
            k.dtype(),
        ),
        Kernel::AttentionChunk(ref k) => (
            format!("{}_{}", k.name(), name(k.dtype())),
            k.name(),
            k.dtype(),
        ),
        Kernel::SgdStep(s) => (format!("sgd_step_{}", name(s.dtype)), "sgd_step", s.dtype),
        Kernel::AdamStep(s) => (format!("adam_step_{}", name(s.dtype)), "adam_step", s.dtype),
        Kernel::UnscaleGrad(u) => (
            format!("non_finite_check_and_unscale_{}", name(u.dtype)),
            "non_finite_check_and_unscale",
            u.dtype,
        ),
        Kernel::UpdateScale(_) => ("amp_update_scale".into(), "amp_update_scale", DType::F32),
        Kernel::Gemm(_) => {
            return Err(Error::InvalidArgument(
                "gemm has no generated CUDA module: the cuda backend runs it through cuBLAS".into(),
            ))
        }
    };
    let registry = registry();
    match registry.by_name.get(&wanted) {
        Some(&(m, f)) => {
            let module = &registry.modules[m];
            Ok((module, module.functions[f].as_str()))
        }
        None => Err(match *kernel {
            Kernel::Cast { from, to, .. } => {
                Error::InvalidArgument(format!("cast has no kernel from {from} to {to}"))
            }
            _ => Error::InvalidArgument(format!("{what} has no kernel for dtype {dtype}")),
        }),
    }
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
                    || m.source.contains(&format!("DEFINE_BINARY_STRIDED({f}, "))
                    || m.source.contains(&format!("DEFINE_BINARY_ROWS({f}, "))
                    || m.source.contains(&format!("DEFINE_COMPARE({f}, "))
                    || m.source.contains(&format!("DEFINE_WHERE({f})"))
                    || m.source.contains(&format!("DEFINE_CAST({f}, "))
                    || m.source.contains(&format!("DEFINE_MIXED({f}, "))
                    || m.source.contains(&format!("DEFINE_MIXED_ROWS({f}, "))
                    || m.source.contains(&format!("DEFINE_MIXED_STRIDED({f}, "))
                    || m.source.contains(&format!("DEFINE_STRIDED_COPY({f}, "))
                    || m.source.contains(&format!("DEFINE_STRIDED_SCATTER({f}, "))
                    || m.source
                        .contains(&format!("DEFINE_STRIDED_COPY_TILED({f}, "))
                    || m.source
                        .contains(&format!("DEFINE_STRIDED_SCATTER_TILED({f}, "))
                    || flash_defined(&m.source, f);
                assert!(defined, "module {} does not define {f}", m.name);
            }
        }
    }

    /// Whether `function` (`flash_attention_forward_d64_bf16`) comes from an
    /// `FL_DEFINE(64)` line of a tensor-core module whose stem it names.
    fn flash_defined(source: &str, function: &str) -> bool {
        let Some(rest) = function.strip_prefix("flash_attention_") else {
            return false;
        };
        let Some((stem, tail)) = rest.rsplit_once("_d") else {
            return false;
        };
        let dim: String = tail.chars().take_while(char::is_ascii_digit).collect();
        source.contains(&format!("FL_DEFINE({dim})\n"))
            && source.contains(&format!("flash_attention_{stem}_d##D##_"))
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
            .contains("DEFINE_BINARY(maximum_bf16, (((a != a || a > b) ? a : b)))"));
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
        let (m, f) = tiled_function(&copy(8)).unwrap();
        assert_eq!((m.name.as_str(), f), ("strided", "strided_copy_tiled_b8"));
        let scatter = Kernel::StridedScatter {
            width: 1,
            src: 0,
            dst: 0,
            layout: Strided::new(&[1], &[1]).unwrap(),
            n: 1,
        };
        let (m, f) = tiled_function(&scatter).unwrap();
        assert_eq!(
            (m.name.as_str(), f),
            ("scatter", "strided_scatter_tiled_b1")
        );
        // The scatter module takes the shared parts of strided.cu, not its copies.
        assert!(m.source.contains("void tiled_move("));
        assert!(!m.source.contains("DEFINE_STRIDED_COPY("));
        assert!(tiled_function(&spin).is_err());
        // The record's size is the same on both sides of the launch.
        let max_dims = format!("#define STRIDED_MAX_DIMS {}\n", crate::kernels::MAX_DIMS);
        assert!(STRIDED_CU.contains(&max_dims));
        let int_exp = Kernel::Unary {
            op: UnaryOp::Exp,
            dtype: DType::I32,
            x: 0,
            out: 0,
            n: 1,
            alpha: 0.0,
        };
        assert!(function(&int_exp).is_err(), "exp is float-only");
        let int_neg = Kernel::Unary {
            op: UnaryOp::Neg,
            dtype: DType::I64,
            x: 0,
            out: 0,
            n: 1,
            alpha: 0.0,
        };
        let (m, f) = function(&int_neg).unwrap();
        assert_eq!((m.name.as_str(), f), ("unary_i64", "neg_i64"));
        assert!(m.source.contains("typedef long long MATH;"));
        let cast = Kernel::Cast {
            from: DType::F32,
            to: DType::U8,
            x: 0,
            out: 0,
            n: 1,
        };
        let (m, f) = function(&cast).unwrap();
        assert_eq!((m.name.as_str(), f), ("cast", "cast_f32_u8"));
        assert!(m.source.contains("namespace bf16 {"));
        assert!(m.source.contains("DEFINE_CAST(cast_f32_u8, f32, u8)"));
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
            step: 0,
            lr: 1e-3,
        });
        let (m, f) = function(&adam).unwrap();
        assert_eq!((m.name.as_str(), f), ("optim_bf16", "adam_step_bf16"));
        assert!(m.source.contains("void sgd_step_bf16("));
        let int_adam = Kernel::AdamStep(match adam {
            Kernel::AdamStep(a) => crate::kernels::AdamStep {
                dtype: DType::I32,
                ..a
            },
            _ => unreachable!(),
        });
        assert!(function(&int_adam).is_err());
        let gemm = Kernel::Gemm(crate::kernels::Gemm::dense(DType::F32, 1, 1, 1, [0, 0, 0]));
        assert!(function(&gemm).is_err());
    }

    #[test]
    fn the_scaler_check_has_a_module_per_float_dtype_and_none_for_integers() {
        let unscale = |dtype| {
            Kernel::UnscaleGrad(crate::kernels::UnscaleGrad {
                dtype,
                grad: 0,
                found_inf: 0,
                scale: 0,
                n: 1,
            })
        };
        let (m, f) = function(&unscale(DType::F16)).unwrap();
        assert_eq!(
            (m.name.as_str(), f),
            ("amp_f16", "non_finite_check_and_unscale_f16")
        );
        assert!(m.source.contains("void non_finite_check_and_unscale_f16("));
        assert!(m.source.contains("typedef unsigned short ELEM;"));
        assert!(function(&unscale(DType::I32)).is_err());
        // The check reads the scale from device memory: no host value in its signature.
        assert!(m.source.contains("const float* scale"));
    }

    #[test]
    fn the_scaler_update_is_one_fixed_module() {
        let update = Kernel::UpdateScale(crate::kernels::UpdateScale {
            scale: 0,
            growth_tracker: 0,
            found_inf: 0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        });
        let (m, f) = function(&update).unwrap();
        assert_eq!((m.name.as_str(), f), ("amp_update", "amp_update_scale"));
        assert!(m
            .source
            .contains("void amp_update_scale(float* scale, int* growth_tracker,"));
        assert_eq!(update.elements(), 1, "one thread");
    }
}
