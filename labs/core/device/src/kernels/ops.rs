//! The op declarations: one entry per op, naming it, giving its CUDA C expression and
//! its CPU twin. Everything else (the CUDA source of every dtype, the launch arguments,
//! the simulator's loop) is derived from these tables, so a new elementwise op is one
//! line here.
//!
//! Float expressions compute in `float` whatever the float dtype (as PyTorch's "opmath"
//! does for half types): a `float16` element is widened, the expression runs, and the
//! result is rounded back to nearest-even, on the GPU and in the twin alike. Integer
//! expressions compute in the integer (`int` for uint8) and wrap, as C on the GPU does.

/// Declares one op family: an enum of its ops with, for each, the kernel name, the
/// CUDA C expression (over the family's argument names) and the CPU twin, and for the
/// ops PyTorch also runs on integers, `int` and the CUDA expression and twin in the
/// integer math type (the twin computes in `i64` with wrapping arithmetic, which gives
/// the bits of 32- and 8-bit wrapping arithmetic once narrowed).
macro_rules! op_family {
    (
        $(#[$doc:meta])*
        $family:ident, twin $twin:ty, int twin $int_twin:ty {
            $( $(#[$op_doc:meta])* $op:ident: $name:literal, $cuda:literal, $cpu:expr
               $(, int $int_cuda:literal, $int_cpu:expr)?; )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $family {
            $( $(#[$op_doc])* $op, )*
        }

        impl $family {
            /// Every op of the family, in declaration order.
            pub const ALL: &'static [$family] = &[$($family::$op),*];

            /// The kernel's base name; the CUDA function is `{name}_{dtype}`.
            pub fn name(self) -> &'static str {
                match self { $($family::$op => $name,)* }
            }

            /// The CUDA C expression computing one element in `float`.
            pub fn cuda(self) -> &'static str {
                match self { $($family::$op => $cuda,)* }
            }

            /// The CPU twin computing one element in `f32`.
            pub fn cpu(self) -> $twin {
                match self { $($family::$op => $cpu,)* }
            }

            /// The CUDA C expression in an integer math type; `None` for float-only
            /// ops (an integer tensor is promoted to float32 before them).
            pub fn int_cuda(self) -> Option<&'static str> {
                match self { $($family::$op => op_family!(@maybe $($int_cuda)?),)* }
            }

            /// The integer twin, in `i64` with wrapping arithmetic; `None` for
            /// float-only ops.
            pub fn int_cpu(self) -> Option<$int_twin> {
                match self { $($family::$op => op_family!(@maybe $(($int_cpu) as $int_twin)?),)* }
            }

            /// Position in [`Self::ALL`].
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
    (@maybe) => { None };
    (@maybe $e:expr) => { Some($e) };
}

op_family! {
    /// `out[i] = f(x[i])`, with the launch's scalar `alpha` available to the expression.
    UnaryOp, twin fn(f32, f32) -> f32, int twin fn(i64, f32) -> i64 {
        Neg: "neg", "-x", |x, _| -x, int "-x", |x, _| x.wrapping_neg();
        Exp: "exp", "expf(x)", |x, _| x.exp();
        Log: "log", "logf(x)", |x, _| x.ln();
        Sqrt: "sqrt", "sqrtf(x)", |x, _| x.sqrt();
        Tanh: "tanh", "tanhf(x)", |x, _| x.tanh();
        Sigmoid: "sigmoid", "1.0f / (1.0f + expf(-x))", |x, _| 1.0 / (1.0 + (-x).exp());
        /// `max(x, 0)`; as with `fmaxf`, a NaN input gives 0.
        Relu: "relu", "fmaxf(x, 0.0f)", |x, _| x.max(0.0), int "(x > 0 ? x : 0)", |x, _| x.max(0);
        /// 1 where `x > 0`, else 0 (a NaN gives 0): the derivative of `relu`.
        Step: "step", "(x > 0.0f ? 1.0f : 0.0f)", |x, _| if x > 0.0 { 1.0 } else { 0.0 };
        /// `alpha * x`.
        Scale: "scale", "alpha * x", |x, alpha| alpha * x;
        /// `1 / sqrt(x)` (the GPU's `rsqrtf` is within 2 ulp of it).
        Rsqrt: "rsqrt", "rsqrtf(x)", |x, _| 1.0 / x.sqrt();
        /// `|x|` (on integers the most negative value stays itself, as it wraps).
        Abs: "abs", "fabsf(x)", |x, _| x.abs(), int "(x < 0 ? -x : x)", |x, _| x.wrapping_abs();
        /// `x ^ alpha` (`pow` with a scalar exponent).
        PowScalar: "pow_scalar", "powf(x, alpha)", |x, alpha| x.powf(alpha);
        /// `x * Φ(x)` with the exact normal CDF (`gelu(approximate="none")`).
        Gelu: "gelu", "0.5f * x * (1.0f + erff(x * 0.70710678118654752f))",
            |x, _| (0.5 * x as f64 * (1.0 + super::special::erf(x as f64 * std::f64::consts::FRAC_1_SQRT_2))) as f32;
        /// `gelu(approximate="tanh")`: `x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
        GeluTanh: "gelu_tanh",
            "0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)))",
            |x, _| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh());
        /// The derivative of `gelu`: `Φ(x) + x φ(x)`.
        GeluGrad: "gelu_grad",
            "0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x)",
            |x, _| {
                let x = x as f64;
                (0.5 * (1.0 + super::special::erf(x * std::f64::consts::FRAC_1_SQRT_2))
                    + x * 0.398_942_280_401_432_7 * (-0.5 * x * x).exp()) as f32
            };
        /// The derivative of `gelu_tanh`.
        GeluTanhGrad: "gelu_tanh_grad",
            "0.5f * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))) + 0.5f * x * (1.0f - tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)) * tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))) * 0.79788456080286536f * (1.0f + 0.134145f * x * x)",
            |x, _| {
                let t = (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.797_884_6 * (1.0 + 0.134145 * x * x)
            };
        /// `max(x, alpha)` (`clamp(min=alpha)`); a NaN stays NaN, as in PyTorch.
        ClampMin: "clamp_min", "(x < (MATH)alpha ? (MATH)alpha : x)",
            |x, alpha| if x < alpha { alpha } else { x },
            int "(x < (MATH)alpha ? (MATH)alpha : x)", |x, alpha| x.max(alpha as i64);
        /// `min(x, alpha)` (`clamp(max=alpha)`).
        ClampMax: "clamp_max", "(x > (MATH)alpha ? (MATH)alpha : x)",
            |x, alpha| if x > alpha { alpha } else { x },
            int "(x > (MATH)alpha ? (MATH)alpha : x)", |x, alpha| x.min(alpha as i64);
        /// 1 where `x >= alpha`, else 0: the derivative of `clamp_min`.
        StepGe: "step_ge", "(x >= alpha ? 1.0f : 0.0f)", |x, alpha| if x >= alpha { 1.0 } else { 0.0 };
        /// 1 where `x <= alpha`, else 0: the derivative of `clamp_max`.
        StepLe: "step_le", "(x <= alpha ? 1.0f : 0.0f)", |x, alpha| if x <= alpha { 1.0 } else { 0.0 };
    }
}

// ANCHOR: binary_ops
op_family! {
    /// `out[i] = f(a[i], b[i])`, with the launch's scalar `alpha` available.
    BinaryOp, twin fn(f32, f32, f32) -> f32, int twin fn(i64, i64, f32) -> i64 {
        Add: "add", "a + b", |a, b, _| a + b, int "a + b", |a: i64, b, _| a.wrapping_add(b);
        Sub: "sub", "a - b", |a, b, _| a - b, int "a - b", |a: i64, b, _| a.wrapping_sub(b);
        Mul: "mul", "a * b", |a, b, _| a * b, int "a * b", |a: i64, b, _| a.wrapping_mul(b);
        /// True division: integers are promoted to float32 first, as in PyTorch.
        Div: "div", "a / b", |a, b, _| a / b;
        /// The larger element; a NaN on either side gives NaN, as `torch.maximum` does
        /// (unlike C's `fmaxf`, which returns the other side).
        Maximum: "maximum", "((a != a || a > b) ? a : b)",
            |a, b, _| if a.is_nan() || a > b { a } else { b },
            int "(a > b ? a : b)", |a: i64, b, _| a.max(b);
        /// The smaller element; NaN propagates as in `maximum`.
        Minimum: "minimum", "((a != a || a < b) ? a : b)",
            |a, b, _| if a.is_nan() || a < b { a } else { b },
            int "(a < b ? a : b)", |a: i64, b, _| a.min(b);
        /// `alpha * a + b`: the BLAS axpy when `out` is `b`. The explicit roundings keep
        /// the compiler from fusing it into one `fma`, so the GPU gives the twin's bits.
        Axpy: "axpy", "__fadd_rn(__fmul_rn(alpha, a), b)", |a, b, alpha| alpha * a + b;
        /// `a ^ b`, elementwise; on integers by squaring, wrapping (a negative exponent
        /// gives 0, or +-1 for a base of +-1, as PyTorch's integer pow).
        Pow: "pow", "powf(a, b)", |a, b, _| a.powf(b),
            int "int_pow(a, b)", |a: i64, b, _| int_pow(a, b);
        /// `a` where `b > 0`, else 0: `relu`'s backward from the gradient `a` and the
        /// saved output `b` in one pass and one output, as PyTorch's
        /// `threshold_backward` (a NaN output passes its gradient, as there).
        ThresholdBackward: "threshold_backward", "(b <= 0.0f ? 0.0f : a)",
            |a, b, _| if b <= 0.0 { 0.0 } else { a };
        /// `(a - b)^2` in one pass and one output: `mse_loss`'s unreduced loss, as
        /// PyTorch's `mse_kernel` (a forward-only op: `mse_loss` records its own
        /// derivative).
        SquaredDifference: "squared_difference", "((a - b) * (a - b))",
            |a, b, _| (a - b) * (a - b);
    }
}
// ANCHOR_END: binary_ops

/// The twin of `int_pow` in `kernels/elementwise.cu`.
fn int_pow(mut base: i64, mut exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 if exp & 1 == 1 => -1,
            -1 => 1,
            _ => 0,
        };
    }
    let mut result = 1i64;
    while exp != 0 {
        if exp & 1 == 1 {
            result = result.wrapping_mul(base);
        }
        exp >>= 1;
        base = base.wrapping_mul(base);
    }
    result
}

/// A comparison: `out[i] = op(a[i], b[i])` as a uint8 mask of 0 and 1 (the labs' stand-in
/// for PyTorch's bool), computed in the operands' math type (a NaN compares unequal to
/// everything, itself included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub const ALL: &'static [CompareOp] = &[
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];

    /// The kernel's base name (PyTorch's: `torch.eq`, `torch.lt`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }

    /// The CUDA C condition over `a` and `b`.
    pub fn cuda(self) -> &'static str {
        match self {
            CompareOp::Eq => "a == b",
            CompareOp::Ne => "a != b",
            CompareOp::Lt => "a < b",
            CompareOp::Le => "a <= b",
            CompareOp::Gt => "a > b",
            CompareOp::Ge => "a >= b",
        }
    }

    /// The twin, from how `a` compares to `b` (`None`: a NaN is involved).
    pub fn holds(self, order: Option<std::cmp::Ordering>) -> bool {
        use std::cmp::Ordering::*;
        match self {
            CompareOp::Eq => order == Some(Equal),
            CompareOp::Ne => order != Some(Equal),
            CompareOp::Lt => order == Some(Less),
            CompareOp::Le => matches!(order, Some(Less | Equal)),
            CompareOp::Gt => order == Some(Greater),
            CompareOp::Ge => matches!(order, Some(Greater | Equal)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_within_and_across_families() {
        let mut names: Vec<&str> = UnaryOp::ALL.iter().map(|o| o.name()).collect();
        names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
        names.extend(CompareOp::ALL.iter().map(|o| o.name()));
        names.extend(["where", "cast"]);
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
