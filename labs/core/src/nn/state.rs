//! Saving and loading named tensors as safetensors files, the format of model weights
//! across the field (Hugging Face, PyTorch's `safetensors.torch`, candle): an 8-byte
//! little-endian header length, a JSON header naming each tensor's dtype, shape and
//! byte range, then the raw little-endian data. Reading one cannot run code (unlike a
//! pickle), and the `safetensors` crate validates the header against the file's size.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::device::Device;
use crate::dtype::{as_bytes, from_bytes, DType};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The safetensors dtype of ours.
fn to_safetensors(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
    }
}

/// Ours of a safetensors dtype, if we have it.
fn from_safetensors(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        _ => return None,
    })
}

/// A tensor's elements as little-endian bytes on the host.
fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.detach();
    Ok(match t.dtype() {
        DType::F32 => as_bytes(&t.to_vec::<f32>()?).to_vec(),
        DType::F16 => as_bytes(&t.to_vec::<f16>()?).to_vec(),
        DType::BF16 => as_bytes(&t.to_vec::<bf16>()?).to_vec(),
        DType::I32 => as_bytes(&t.to_vec::<i32>()?).to_vec(),
        DType::I64 => as_bytes(&t.to_vec::<i64>()?).to_vec(),
        DType::U8 => t.to_vec::<u8>()?,
    })
}

/// A tensor on `device` holding `bytes` (little-endian elements of `dtype`).
fn from_host_bytes(bytes: &[u8], dtype: DType, shape: &[usize], device: &Device) -> Result<Tensor> {
    match dtype {
        DType::F32 => Tensor::from_slice(&from_bytes::<f32>(bytes), shape, device),
        DType::F16 => Tensor::from_slice(&from_bytes::<f16>(bytes), shape, device),
        DType::BF16 => Tensor::from_slice(&from_bytes::<bf16>(bytes), shape, device),
        DType::I32 => Tensor::from_slice(&from_bytes::<i32>(bytes), shape, device),
        DType::I64 => Tensor::from_slice(&from_bytes::<i64>(bytes), shape, device),
        DType::U8 => Tensor::from_slice(bytes, shape, device),
    }
}

/// Writes `tensors` to a safetensors file at `path` (`safetensors.torch.save_file`).
/// Names must be distinct.
pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mut seen = HashSet::new();
    let mut host = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "save {}: the name `{name}` is given twice",
                path.display()
            )));
        }
        host.push((name.clone(), t.dtype(), t.shape().to_vec(), host_bytes(t)?));
    }
    let views = host
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(to_safetensors(*dtype), shape.clone(), bytes).map(|v| (name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::InvalidArgument(format!("save {}: {e}", path.display())))?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| Error::InvalidArgument(format!("save {}: {e}", path.display())))
}

/// Reads every tensor of the safetensors file at `path` onto `device`, sorted by name
/// (`safetensors.torch.load_file`). A missing file, a malformed header and a dtype we
/// do not have are errors that name the file (and the tensor).
pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path)
        .map_err(|e| Error::InvalidArgument(format!("load {}: {e}", path.display())))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| {
        Error::InvalidArgument(format!(
            "load {}: not a valid safetensors file: {e}",
            path.display()
        ))
    })?;
    let mut out = Vec::new();
    for (name, view) in file.tensors() {
        let dtype = from_safetensors(view.dtype()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "load {}: tensor `{name}` has dtype {}, which the labs do not have \
                 (F32, F16, BF16, I32, I64, U8)",
                path.display(),
                view.dtype()
            ))
        })?;
        let t = from_host_bytes(view.data(), dtype, view.shape(), device)?;
        out.push((name, t));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// `load_state_dict(state, strict=True)` over a module's named parameters: checks every
/// key, shape and dtype first, then copies each tensor into its parameter in place.
pub(super) fn load_into(params: &[(String, Tensor)], state: &[(String, Tensor)]) -> Result<()> {
    let given: HashMap<&str, &Tensor> = state.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let wanted: HashSet<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
    let missing: Vec<&str> = params
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !given.contains_key(k))
        .collect();
    let mut unexpected: Vec<&str> = state
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !wanted.contains(k))
        .collect();
    unexpected.sort();
    if !missing.is_empty() || !unexpected.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "load_state_dict: missing key(s) {missing:?}, unexpected key(s) {unexpected:?}"
        )));
    }
    for (key, param) in params {
        let src = given[key.as_str()];
        if src.shape() != param.shape() {
            return Err(Error::InvalidArgument(format!(
                "load_state_dict: size mismatch for {key}: copying a param with shape {:?} \
                 from checkpoint, the shape in current model is {:?}",
                src.shape(),
                param.shape()
            )));
        }
        if src.dtype() != param.dtype() {
            return Err(Error::InvalidArgument(format!(
                "load_state_dict: dtype mismatch for {key}: the checkpoint has {}, \
                 the model {}",
                src.dtype(),
                param.dtype()
            )));
        }
        if !param.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "load_state_dict: parameter {key} is not contiguous"
            )));
        }
    }
    for (key, param) in params {
        copy_into(param, given[key.as_str()])?;
    }
    Ok(())
}

/// Copies `src`'s elements into the dense tensor `dst` (same shape and dtype), in place
/// on `dst`'s device (PyTorch's `dst.copy_(src)` under `no_grad`).
fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    let src = src.detach().to(dst.device())?.contiguous()?;
    let device = dst.device();
    let stream = device.default_stream()?;
    device
        .backend()
        .copy_dtod(dst.ptr(), src.ptr(), dst.nbytes(), &stream)?;
    // `src` may be a temporary: its memory is freed into the cache for reuse by later
    // work on the same stream, which runs after the copy (stream order).
    Ok(())
}
