//! Saving and loading named tensors as safetensors files, the format of model weights
//! across the field (Hugging Face, PyTorch's `safetensors.torch`, candle): an 8-byte
//! little-endian header length, a JSON header naming each tensor's dtype, shape and
//! byte range, then the raw little-endian data. Reading one cannot run code (unlike a
//! pickle). The `safetensors` crate writes files and validates a header's byte ranges
//! against its shapes; loading checks them against the file's size and streams each
//! tensor's bytes onto the device, so that a large file never sits whole on the host.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, Metadata, TensorInfo, TensorView};

use crate::device::Device;
use crate::dtype::{as_bytes, DType};
use crate::error::{Error, Result};
use crate::format::quote_message;
use crate::input;
use crate::tensor::{no_grad, Tensor};

/// The little-endian `u64` that gives the header's length.
const HEADER_LEN: usize = 8;
/// The longest header the `safetensors` crate reads or writes (its `MAX_HEADER_SIZE`).
const MAX_HEADER: u64 = 100_000_000;
/// The most bytes of tensor data held on the host at once while loading.
const CHUNK: usize = 8 << 20;

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
/// (`safetensors.torch.load_file`). A path that is not a regular file, a file over the
/// weights limit ([`crate::input::WEIGHTS`], raised with `LABS_MAX_WEIGHTS_SIZE`), a
/// malformed or truncated file and a dtype we do not have are one-line errors that name
/// the file (and the tensor).
pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let limit = input::WEIGHTS
        .from_env(input::ENV_MAX_WEIGHTS_SIZE)
        .map_err(|e| Error::InvalidArgument(format!("load {}: {e}", path.display())))?;
    load_limited(path, device, limit.max_bytes)
}

/// [`load`] of a file of at most `max_bytes`.
///
/// The data is streamed: the header is read and checked against the file's size
/// first, then each tensor's bytes go from the file to its device memory a chunk at a
/// time, so the host holds one chunk, never the file.
pub fn load_limited(
    path: impl AsRef<Path>,
    device: &Device,
    max_bytes: u64,
) -> Result<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let fail = |m: String| Error::InvalidArgument(format!("load {}: {m}", path.display()));
    let invalid = |m: String| fail(format!("not a valid safetensors file: {m}"));
    let limit = input::Limit {
        max_bytes,
        ..input::WEIGHTS
    };
    let mut file = input::open(path, limit).map_err(|e| fail(e.to_string()))?;
    let size = file.len();
    let read_err = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => invalid(e.to_string()),
        _ => fail(e.to_string()),
    };

    // The header: its length, then that many bytes of JSON, both within the file.
    if size < HEADER_LEN as u64 {
        return Err(invalid(format!(
            "the file is {size} bytes, shorter than the {HEADER_LEN}-byte header length"
        )));
    }
    let mut len = [0u8; HEADER_LEN];
    file.read_exact_or(&mut len, "the header length")
        .map_err(read_err)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER {
        return Err(invalid(format!(
            "the header length is {n} bytes, more than the {MAX_HEADER} safetensors allows"
        )));
    }
    if n > size - HEADER_LEN as u64 {
        return Err(invalid(format!(
            "the header length is {n} bytes, past the end of the {size}-byte file"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact_or(&mut header, "the header")
        .map_err(read_err)?;
    let metadata: Metadata = serde_json::from_slice(&header)
        .map_err(|e| invalid(format!("the header: {}", quote_message(&e.to_string()))))?;
    drop(header);

    // The tensors: dtypes we have, data that fills the rest of the file exactly (the
    // metadata checked that the ranges follow each other and match the shapes).
    let mut tensors: Vec<(String, &TensorInfo)> = metadata.tensors().into_iter().collect();
    tensors.sort_by_key(|(_, info)| info.data_offsets);
    let data = size - HEADER_LEN as u64 - n;
    let described = tensors.last().map_or(0, |(_, info)| info.data_offsets.1) as u64;
    if described != data {
        return Err(invalid(format!(
            "the header describes {described} bytes of tensor data, the file holds {data} \
             after the header (truncated, or not one safetensors file)"
        )));
    }
    let mut dtypes = Vec::with_capacity(tensors.len());
    for (name, info) in &tensors {
        dtypes.push(from_safetensors(info.dtype).ok_or_else(|| {
            fail(format!(
                "tensor `{name}` has dtype {}, which the labs do not have \
                 (F32, F16, BF16, I32, I64, U8)",
                info.dtype
            ))
        })?);
    }

    let largest = tensors
        .iter()
        .map(|(_, i)| i.data_offsets.1 - i.data_offsets.0);
    let mut chunk = vec![0u8; largest.max().unwrap_or(0).min(CHUNK)];
    let mut out = Vec::with_capacity(tensors.len());
    for ((name, info), dtype) in tensors.iter().zip(dtypes) {
        let t = Tensor::empty(&info.shape, dtype, device)?;
        let (mut at, end) = (info.data_offsets.0, info.data_offsets.1);
        while at < end {
            let buf = &mut chunk[..(end - at).min(CHUNK)];
            file.read_exact_or(buf, &format!("the data of tensor `{name}`"))
                .map_err(read_err)?;
            let offset = at - info.data_offsets.0;
            t.write_bytes(offset, buf)?;
            at += buf.len();
        }
        out.push((name.clone(), t));
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
    let _off = no_grad();
    dst.copy_(&src)?;
    // `src` may be a temporary: its memory is freed into the cache for reuse by later
    // work on the same stream, which runs after the copy (stream order).
    Ok(())
}
