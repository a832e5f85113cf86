//! A seeded host random generator for parameter initialisation: the same seed gives the
//! same parameters on every device and every run, so tests are reproducible. (PyTorch
//! draws from its global generator; the bounds are its, the bits are not.)

/// SplitMix64: small, fast, and good enough for initial weights.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 24 random bits (every value exact in `f32`).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// `n` samples uniform in `[-bound, bound)` (`nn.init.uniform_(-bound, bound)`).
    pub fn uniform(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n)
            .map(|_| -bound + 2.0 * bound * self.next_f32())
            .collect()
    }

    /// `n` standard-normal samples (Box-Muller; `nn.init.normal_`).
    pub fn normal(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                // u1 in (0, 1]: its logarithm is finite.
                let u1 = 1.0 - self.next_f32() as f64;
                let u2 = self.next_f32() as f64;
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
            })
            .collect()
    }
}

/// A float32 parameter of `shape` on `device`, its initial values drawn on the host by
/// `draw` (given the count) only once the size is known to fit: a shape whose elements
/// or bytes overflow is an invalid argument, and a parameter of more bytes than the
/// device's memory is the out-of-memory error that allocating it gives, so that the
/// host never holds values for a tensor the device cannot hold. A dry-run device holds
/// no values: there the tensor is allocated and nothing is drawn.
pub(crate) fn parameter(
    shape: &[usize],
    device: &crate::device::Device,
    draw: impl FnOnce(usize) -> Vec<f32>,
) -> crate::error::Result<crate::tensor::Tensor> {
    let n = parameter_numel(shape, device)?;
    if device.is_dry() {
        return crate::tensor::Tensor::empty(shape, crate::tensor::DType::F32, device);
    }
    crate::tensor::Tensor::from_slice(&draw(n), shape, device)
}

/// The elements of a float32 parameter of `shape` on `device`, checked as
/// [`parameter`] says.
fn parameter_numel(shape: &[usize], device: &crate::device::Device) -> crate::error::Result<usize> {
    let too_large = || {
        crate::error::Error::InvalidArgument(format!("a parameter of shape {shape:?} is too large"))
    };
    let numel = (shape.iter())
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    let bytes = (numel as u64).checked_mul(4).ok_or_else(too_large)?;
    let info = device.mem_info()?;
    if bytes > info.total {
        return Err(crate::error::Error::OutOfMemory {
            device: device.id(),
            requested: bytes,
            free: info.free,
            total: info.total,
            report: None,
        });
    }
    Ok(numel)
}
