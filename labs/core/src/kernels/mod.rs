//! The kernels every backend runs. On `cuda` they are the CUDA C sources in the
//! workspace's `kernels/` folder, compiled at run time by NVRTC and cached per device;
//! on `sim` and `cpu` they are their CPU twins in [`cpu`].

pub mod cpu;

use crate::device_id::DevicePtr;

/// One kernel launch with its arguments. Pointers are device addresses; `n` counts
/// elements.
#[derive(Debug, Clone, PartialEq)]
pub enum Kernel {
    /// `out = a + b`
    Add {
        a: DevicePtr,
        b: DevicePtr,
        out: DevicePtr,
        n: usize,
    },
    /// `out = a * b`
    Mul {
        a: DevicePtr,
        b: DevicePtr,
        out: DevicePtr,
        n: usize,
    },
    /// `out = alpha * x`
    Scale {
        x: DevicePtr,
        alpha: f32,
        out: DevicePtr,
        n: usize,
    },
    /// `y = alpha * x + y`
    Axpy {
        alpha: f32,
        x: DevicePtr,
        y: DevicePtr,
        n: usize,
    },
    /// Standard-normal samples; element `i` depends only on `(seed, offset + i)`.
    Randn {
        out: DevicePtr,
        n: usize,
        seed: u64,
        offset: u64,
    },
    /// `iterations` dependent multiply-adds on each element: busy work of a chosen length.
    Spin {
        x: DevicePtr,
        n: usize,
        iterations: u32,
    },
}

/// A CUDA C source file of `kernels/`, with the functions it defines.
pub struct Module {
    pub name: &'static str,
    pub source: &'static str,
    pub functions: &'static [&'static str],
}

pub const ELEMENTWISE: Module = Module {
    name: "elementwise",
    source: include_str!("../../../../kernels/elementwise.cu"),
    functions: &["add_f32", "mul_f32", "scale_f32", "axpy_f32", "spin_f32"],
};

pub const RANDOM: Module = Module {
    name: "random",
    source: include_str!("../../../../kernels/random.cu"),
    functions: &["randn_f32"],
};

pub const MODULES: &[Module] = &[ELEMENTWISE, RANDOM];

impl Kernel {
    /// The module and function that implement this kernel on the GPU.
    pub fn function(&self) -> (&'static Module, &'static str) {
        match self {
            Kernel::Add { .. } => (&ELEMENTWISE, "add_f32"),
            Kernel::Mul { .. } => (&ELEMENTWISE, "mul_f32"),
            Kernel::Scale { .. } => (&ELEMENTWISE, "scale_f32"),
            Kernel::Axpy { .. } => (&ELEMENTWISE, "axpy_f32"),
            Kernel::Spin { .. } => (&ELEMENTWISE, "spin_f32"),
            Kernel::Randn { .. } => (&RANDOM, "randn_f32"),
        }
    }

    /// Number of elements the launch covers (sets the grid size).
    pub fn elements(&self) -> usize {
        match *self {
            Kernel::Add { n, .. }
            | Kernel::Mul { n, .. }
            | Kernel::Scale { n, .. }
            | Kernel::Axpy { n, .. }
            | Kernel::Randn { n, .. }
            | Kernel::Spin { n, .. } => n,
        }
    }
}
