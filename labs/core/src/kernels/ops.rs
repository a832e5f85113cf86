//! The op declarations: one entry per op, naming it, giving its CUDA C expression and
//! its CPU twin. Everything else (the CUDA source of every dtype, the launch arguments,
//! the simulator's loop) is derived from these tables, so a new elementwise op is one
//! line here.
//!
//! Expressions compute in `float` whatever the tensor's dtype (as PyTorch's "opmath"
//! does for half types): a `float16` element is widened, the expression runs, and the
//! result is rounded back to nearest-even, on the GPU and in the twin alike.

/// Declares one op family: an enum of its ops with, for each, the kernel name, the
/// CUDA C expression (over the family's argument names) and the CPU twin.
macro_rules! op_family {
    (
        $(#[$doc:meta])*
        $family:ident, twin $twin:ty {
            $( $(#[$op_doc:meta])* $op:ident: $name:literal, $cuda:literal, $cpu:expr; )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $family {
            $( $(#[$op_doc])* $op, )*
        }

        impl $family {
            /// Every op of the family, in declaration order (the order of the functions
            /// in its generated CUDA module).
            pub const ALL: &'static [$family] = &[$($family::$op),*];

            /// The kernel's base name; the CUDA function is `{name}_{dtype}`.
            pub fn name(self) -> &'static str {
                match self { $($family::$op => $name,)* }
            }

            /// The CUDA C expression computing one element.
            pub fn cuda(self) -> &'static str {
                match self { $($family::$op => $cuda,)* }
            }

            /// The CPU twin computing one element.
            pub fn cpu(self) -> $twin {
                match self { $($family::$op => $cpu,)* }
            }

            /// Position in [`Self::ALL`].
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
}

op_family! {
    /// `out[i] = f(x[i])`, with the launch's scalar `alpha` available to the expression.
    UnaryOp, twin fn(f32, f32) -> f32 {
        Neg: "neg", "-x", |x, _| -x;
        Exp: "exp", "expf(x)", |x, _| x.exp();
        Log: "log", "logf(x)", |x, _| x.ln();
        Sqrt: "sqrt", "sqrtf(x)", |x, _| x.sqrt();
        Tanh: "tanh", "tanhf(x)", |x, _| x.tanh();
        Sigmoid: "sigmoid", "1.0f / (1.0f + expf(-x))", |x, _| 1.0 / (1.0 + (-x).exp());
        /// `max(x, 0)`; as with `fmaxf`, a NaN input gives 0.
        Relu: "relu", "fmaxf(x, 0.0f)", |x, _| x.max(0.0);
        /// 1 where `x > 0`, else 0 (a NaN gives 0): the derivative of `relu`.
        Step: "step", "(x > 0.0f ? 1.0f : 0.0f)", |x, _| if x > 0.0 { 1.0 } else { 0.0 };
        /// `alpha * x`.
        Scale: "scale", "alpha * x", |x, alpha| alpha * x;
    }
}

// ANCHOR: binary_ops
op_family! {
    /// `out[i] = f(a[i], b[i])`, with the launch's scalar `alpha` available.
    BinaryOp, twin fn(f32, f32, f32) -> f32 {
        Add: "add", "a + b", |a, b, _| a + b;
        Sub: "sub", "a - b", |a, b, _| a - b;
        Mul: "mul", "a * b", |a, b, _| a * b;
        Div: "div", "a / b", |a, b, _| a / b;
        /// As with `fmaxf`, a NaN on one side gives the other side.
        Maximum: "maximum", "fmaxf(a, b)", |a, b, _| a.max(b);
        Minimum: "minimum", "fminf(a, b)", |a, b, _| a.min(b);
        /// `alpha * a + b`: the BLAS axpy when `out` is `b`. The explicit roundings keep
        /// the compiler from fusing it into one `fma`, so the GPU gives the twin's bits.
        Axpy: "axpy", "__fadd_rn(__fmul_rn(alpha, a), b)", |a, b, alpha| alpha * a + b;
    }
}
// ANCHOR_END: binary_ops

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_within_and_across_families() {
        let mut names: Vec<&str> = UnaryOp::ALL.iter().map(|o| o.name()).collect();
        names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "a kernel name is declared twice");
    }

    #[test]
    fn index_is_the_position_in_all() {
        for (i, op) in UnaryOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
        for (i, op) in BinaryOp::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
    }
}
