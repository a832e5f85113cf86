//! A collective of the device contract on tensors: the transport reads and writes the
//! tensors' memory, so that the layers above (DDP, ZeRO, process groups) run collectives
//! without holding a device pointer.

use super::Tensor;
use crate::device::{CollectiveCall, CollectiveKind, Stream, Transport};
use crate::error::{Error, Result};

/// Enqueues collective `kind` of `count` elements on `stream`: `send` is this rank's
/// input and `recv` its output (the same tensor for an in-place all-reduce or
/// broadcast). Both must be contiguous, of one dtype, on the stream's device, and hold
/// what the collective reads and writes (`count` elements, times the world size where
/// the collective gathers or scatters, which the caller checks).
pub fn run_collective(
    transport: &dyn Transport,
    kind: CollectiveKind,
    send: &Tensor,
    recv: &Tensor,
    count: usize,
    stream: &Stream,
) -> Result<()> {
    for (name, t) in [("input", send), ("output", recv)] {
        if !t.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "{kind}: the {name} is not contiguous (call .contiguous() first)"
            )));
        }
        stream.check_device(t.device().id())?;
    }
    if send.dtype() != recv.dtype() {
        return Err(Error::InvalidArgument(format!(
            "{kind}: input of {} and output of {}",
            send.dtype(),
            recv.dtype()
        )));
    }
    if count > send.numel().max(recv.numel()) {
        return Err(Error::InvalidArgument(format!(
            "{kind}: {count} elements, more than the {} of the input and {} of the output",
            send.numel(),
            recv.numel()
        )));
    }
    let call = CollectiveCall {
        kind,
        dtype: send.dtype(),
        send: send.ptr(),
        recv: recv.ptr(),
        count,
    };
    transport.run(&call, stream)
}
