//! Where a block came from, in the two words a reader looks for in a leak report: the
//! op that allocated it (`Tensor::matmul`) and the line of the program that called that
//! op (`labs/lab-09-leaks/src/planted.rs:41`), read off the block's backtrace.
//!
//! Only names are matched here (the allocator knows nothing of tensors): the op is the
//! outermost frame of the runtime's tensor or autograd layers, the public function the
//! program called; the caller is the first frame outside the runtime and the standard
//! library.

use std::fmt;

use crate::snapshot::Frame;

/// The op and the program's line behind an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The runtime function the program called (`Tensor::matmul`), if the backtrace
    /// went through one.
    pub op: Option<String>,
    /// The program's frame that called it: `file:line`, or the function's name when
    /// the binary has no line tables.
    pub at: Option<String>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "op {}, at {}",
            self.op.as_deref().unwrap_or("(none)"),
            self.at.as_deref().unwrap_or("(unknown)")
        )
    }
}

/// Modules whose public functions count as ops, and their source folders (a release
/// build keeps line tables only, where an inlined frame has its bare name and a file).
const OP_LAYERS: [&str; 2] = ["labs_tensor::tensor::", "labs_tensor::autograd::"];
const OP_FILES: [&str; 2] = [
    "labs/core/tensor/src/tensor/",
    "labs/core/tensor/src/autograd/",
];

// ANCHOR: origin_of
/// The op and caller of a backtrace given innermost frame first (as
/// [`frames_of`](super::frames_of) returns it).
pub fn origin_of(frames: &[Frame]) -> Origin {
    let caller = frames.iter().position(|f| !is_runtime(f));
    let inside = &frames[..caller.unwrap_or(frames.len())];
    let op = inside.iter().rev().find(|f| is_op(f)).map(op_name);
    let at = caller.map(|i| {
        let f = &frames[i];
        if f.filename.is_empty() {
            short_name(&f.name)
        } else {
            format!("{}:{}", f.filename, f.line)
        }
    });
    Origin { op, at }
}
// ANCHOR_END: origin_of

fn is_op(f: &Frame) -> bool {
    OP_LAYERS.iter().any(|m| f.name.contains(m))
        || OP_FILES.iter().any(|d| f.filename.starts_with(d))
}

/// An op's name as a reader calls it. A bare name (line tables only) from the tensor
/// or autograd layers is a `Tensor` method: the functions there that allocate are.
fn op_name(f: &Frame) -> String {
    if f.name.contains("::") {
        return short_name(&f.name);
    }
    let bare = f.name.split('<').next().unwrap_or(&f.name);
    format!("Tensor::{bare}")
}

/// Frames of the runtime itself or of Rust's standard library, by name or by file.
fn is_runtime(f: &Frame) -> bool {
    let name = f.name.trim_start_matches('<');
    crate::runtime::is_runtime_symbol(name)
        || ["std::", "core::", "alloc::", "__rust"]
            .iter()
            .any(|p| name.starts_with(p))
        || crate::runtime::is_runtime_file(&f.filename)
        || f.filename.starts_with("/rustc/")
        || f.filename.contains("/library/")
}

/// `labs_tensor::tensor::matmul::<impl labs_tensor::tensor::Tensor>::matmul` as
/// `Tensor::matmul`: the type of an `impl` block (its last path segment) and the
/// function, closures left out; a free function by its name alone.
pub fn short_name(name: &str) -> String {
    let mut name = name;
    while let Some(outer) = name.strip_suffix("::{{closure}}") {
        name = outer;
    }
    let function = name.rsplit("::").next().unwrap_or(name);
    if let Some((ty, _)) = name.strip_prefix('<').and_then(|n| n.split_once(" as ")) {
        // `<labs_tensor::tensor::Tensor as core::clone::Clone>::clone`
        let ty = ty.rsplit("::").next().unwrap_or(ty);
        return format!("{ty}::{function}");
    }
    let Some(start) = name.rfind("<impl ") else {
        // `labs_tensor::tensor::Tensor::randn`: a type's path keeps the type.
        let mut segments = name.rsplit("::").skip(1);
        return match segments.next() {
            Some(ty) if ty.starts_with(char::is_uppercase) => format!("{ty}::{function}"),
            _ => function.to_string(),
        };
    };
    let ty = name[start + "<impl ".len()..]
        .split('>')
        .next()
        .unwrap_or_default();
    let ty = ty.rsplit(" for ").next().unwrap_or(ty);
    let ty = ty.rsplit("::").next().unwrap_or(ty);
    format!("{ty}::{function}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, file: &str, line: u64) -> Frame {
        Frame {
            name: name.into(),
            filename: file.into(),
            line,
        }
    }

    #[test]
    fn the_op_is_the_outermost_runtime_frame_and_the_caller_the_next() {
        let frames = [
            frame(
                "labs_tensor::tensor::<impl labs_tensor::tensor::Tensor>::empty",
                "labs/core/tensor/src/tensor/mod.rs",
                66,
            ),
            frame(
                "labs_tensor::tensor::matmul::<impl labs_tensor::tensor::Tensor>::matmul_with",
                "labs/core/tensor/src/tensor/matmul.rs",
                105,
            ),
            frame(
                "labs_tensor::tensor::matmul::<impl labs_tensor::tensor::Tensor>::matmul",
                "labs/core/tensor/src/tensor/matmul.rs",
                99,
            ),
            frame(
                "lab_09::planted::step::{{closure}}",
                "labs/lab-09-leaks/src/planted.rs",
                41,
            ),
            frame("core::ops::function::FnOnce::call_once", "", 0),
        ];
        let o = origin_of(&frames);
        assert_eq!(o.op.as_deref(), Some("Tensor::matmul"));
        assert_eq!(o.at.as_deref(), Some("labs/lab-09-leaks/src/planted.rs:41"));
        assert_eq!(
            o.to_string(),
            "op Tensor::matmul, at labs/lab-09-leaks/src/planted.rs:41"
        );
    }

    #[test]
    fn bare_names_of_a_release_build_are_placed_by_their_files() {
        let frames = [
            frame("empty", "labs/core/tensor/src/tensor/mod.rs", 69),
            frame("randn", "labs/core/tensor/src/tensor/mod.rs", 134),
            frame("main", "labs/lab-09-leaks/examples/x.rs", 5),
            frame(
                "call_once<fn(), ()>",
                "/rustc/abc/library/core/src/ops/function.rs",
                250,
            ),
        ];
        let o = origin_of(&frames);
        assert_eq!(o.op.as_deref(), Some("Tensor::randn"));
        assert_eq!(o.at.as_deref(), Some("labs/lab-09-leaks/examples/x.rs:5"));
    }

    #[test]
    fn without_line_tables_the_caller_is_named() {
        let frames = [
            frame(
                "labs_tensor::tensor::ops::<impl labs_tensor::tensor::Tensor>::relu",
                "",
                0,
            ),
            frame("lab_09::planted::step", "", 0),
        ];
        let o = origin_of(&frames);
        assert_eq!(o.op.as_deref(), Some("Tensor::relu"));
        assert_eq!(o.at.as_deref(), Some("step"));
    }

    #[test]
    fn a_block_allocated_by_the_allocator_s_caller_has_no_op() {
        let frames = [frame("history::a_test", "labs/core/tests/history.rs", 9)];
        let o = origin_of(&frames);
        assert_eq!(o.op, None);
        assert_eq!(o.at.as_deref(), Some("labs/core/tests/history.rs:9"));
    }

    #[test]
    fn short_names_keep_the_type_and_the_function() {
        assert_eq!(short_name("labs_tensor::tensor::graph::no_grad"), "no_grad");
        assert_eq!(
            short_name("labs_tensor::tensor::Tensor::randn"),
            "Tensor::randn"
        );
        assert_eq!(
            short_name("<labs_tensor::tensor::Tensor as core::clone::Clone>::clone"),
            "Tensor::clone"
        );
        assert_eq!(
            short_name(
                "labs_tensor::autograd::<impl labs_tensor::tensor::Tensor>::backward_with::{{closure}}"
            ),
            "Tensor::backward_with"
        );
    }
}
