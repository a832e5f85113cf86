//! The PyTorch parity fixtures (`data/parity`), for the test suites.

use labs_base::testing::data_dir;

use crate::device::Device;

/// The command that writes the PyTorch parity fixtures (on a machine with PyTorch).
pub const PARITY_COMMAND: &str = "python3 ci/pytorch-fixtures.py";

/// One PyTorch parity case of `data/parity/manifest.json` (written by
/// `ci/pytorch-fixtures.py`, whose docstring describes the tensors of a case file).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ParityCase {
    pub name: String,
    /// What PyTorch ran: `add`, `softmax`, `linear`, `adam`, ...
    pub op: String,
    /// The case's safetensors file, in the manifest's folder.
    pub file: String,
    /// The op's arguments (`dim`, `keepdim`, `lr`, ...), as PyTorch was called.
    #[serde(default)]
    pub args: serde_json::Value,
    /// The dtype the case computes in (`float32`, `float16`, `bfloat16`).
    pub dtype: String,
    /// Tolerances: `|got - want| <= atol + rtol * |want|`.
    pub atol: f64,
    pub rtol: f64,
    /// Optimizer cases: the number of steps recorded.
    #[serde(default)]
    pub steps: usize,
    /// The folder of the manifest (and of `file`).
    #[serde(skip)]
    pub dir: std::path::PathBuf,
}

/// `data/parity/manifest.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ParityManifest {
    /// The PyTorch version that wrote it.
    pub torch: String,
    pub cases: Vec<ParityCase>,
}

/// The folder of the parity fixtures (`data/parity` under [`data_dir`]).
pub fn parity_dir() -> std::path::PathBuf {
    data_dir().join("parity")
}

/// The parity manifest of `data/parity`; an error that says which command writes it
/// when it is missing.
pub fn parity_manifest() -> Result<ParityManifest, String> {
    ParityManifest::read(&parity_dir())
}

impl ParityManifest {
    /// `dir/manifest.json`, its cases pointing at their files in `dir`.
    pub fn read(dir: &std::path::Path) -> Result<ParityManifest, String> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "{}: {e}. The PyTorch parity fixtures are written by `{PARITY_COMMAND}` on a \
                 machine with PyTorch 2.11 (it writes data/parity/; commit its output)",
                path.display()
            )
        })?;
        let mut manifest: ParityManifest =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for case in &mut manifest.cases {
            case.dir = dir.to_path_buf();
        }
        Ok(manifest)
    }
}

impl ParityCase {
    /// Every tensor of the case's file, on `device`, by name.
    pub fn tensors(
        &self,
        device: &Device,
    ) -> crate::error::Result<std::collections::HashMap<String, crate::tensor::Tensor>> {
        Ok(crate::nn::load(self.dir.join(&self.file), device)?
            .into_iter()
            .collect())
    }

    /// A float argument (`lr`), if given.
    pub fn arg_f64(&self, key: &str) -> Option<f64> {
        self.args.get(key)?.as_f64()
    }
}
