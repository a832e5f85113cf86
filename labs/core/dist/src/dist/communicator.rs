//! The communicator: one rank's handle on a group, the checks every collective makes,
//! and the stream ordering around it. The transport, which the rank's device makes
//! (NCCL, or the simulator's exchange), only moves the data of one checked call on one
//! stream.

use std::fmt;
use std::sync::Mutex;

pub use crate::device::ReduceOp;
use crate::device::{CollectiveKind, Device, Event, Stream, Transport};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{run_collective, Tensor};

/// A collective in flight (PyTorch's `Work`, what `async_op=True` returns).
#[must_use = "a collective's Work must be waited on (`wait`) before its result is used"]
pub struct Work {
    device: Device,
    stream: Stream,
    done: Event,
    /// The collective's tensors, held until the default stream has waited for it (as
    /// PyTorch's `TORCH_NCCL_AVOID_RECORD_STREAMS`): freed by their owner meanwhile,
    /// their blocks go back to the cache at `wait`, a point of the program, rather than
    /// whenever the allocator next finds the stream's event passed, which depends on
    /// timing and would make two runs of one program reserve differently.
    held: Mutex<Vec<Tensor>>,
}

impl Work {
    /// Makes the default stream wait for the collective: work enqueued there afterwards
    /// sees its result. The host does not wait (as with NCCL in PyTorch).
    pub fn wait(&self) -> Result<()> {
        self.device.current_stream()?.wait(&self.done)?;
        self.release();
        Ok(())
    }

    /// Blocks the host until the collective has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.done.synchronize()?;
        self.release();
        Ok(())
    }

    fn release(&self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Whether the collective has finished (`is_completed`).
    pub fn is_completed(&self) -> Result<bool> {
        self.done.query()
    }

    /// The event recorded after the collective on its stream.
    pub fn event(&self) -> &Event {
        &self.done
    }
}

impl Drop for Work {
    /// Dropped before `wait`: the tensors' blocks are reused only after the
    /// collective's stream has passed this point (`record_stream`).
    fn drop(&mut self) {
        let held = std::mem::take(self.held.get_mut().unwrap_or_else(|e| e.into_inner()));
        for t in held {
            // A tensor whose storage was freed meanwhile has no block left to guard.
            if t.is_storage_allocated() {
                let _ = t.record_stream(&self.stream);
            }
        }
    }
}

/// One rank of a group: its rank, the group's size, its device, and its transport.
pub struct Communicator {
    rank: usize,
    world_size: usize,
    device: Device,
    /// The communication stream collectives run on unless [`Communicator::set_stream`]
    /// names another.
    comm_stream: Stream,
    stream: Option<Stream>,
    transport: Box<dyn Transport>,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {} on {})",
            self.rank, self.world_size, self.device
        )
    }
}

impl Communicator {
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        device: Device,
        transport: Box<dyn Transport>,
    ) -> Result<Communicator> {
        Ok(Communicator {
            rank,
            world_size,
            comm_stream: device.new_stream()?,
            device,
            stream: None,
            transport,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stream collectives are enqueued on: the communicator's own, unless
    /// [`set_stream`](Self::set_stream) named another.
    pub fn stream(&self) -> &Stream {
        self.stream.as_ref().unwrap_or(&self.comm_stream)
    }

    /// Runs later collectives on `stream` (a stream of this device), or on the
    /// communicator's own stream again with `None`.
    pub fn set_stream(&mut self, stream: Option<Stream>) -> Result<()> {
        if let Some(s) = &stream {
            s.check_device(self.device.id())?;
        }
        self.stream = stream;
        Ok(())
    }

    // ANCHOR: all_reduce
    /// Reduces `tensor` across ranks in place: afterwards every rank holds `op` of all
    /// ranks' values.
    pub fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work> {
        let what = "all_reduce";
        self.check(what, tensor)?;
        check_op(what, op, tensor.dtype())?;
        self.enqueue(
            CollectiveKind::AllReduce(op),
            tensor,
            tensor,
            tensor.numel(),
        )
    }
    // ANCHOR_END: all_reduce

    /// Copies `root`'s `tensor` into every other rank's `tensor`.
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work> {
        self.check("broadcast", tensor)?;
        if root >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "broadcast: root {root} is not a rank of a group of {}",
                self.world_size
            )));
        }
        self.enqueue(
            CollectiveKind::Broadcast { root },
            tensor,
            tensor,
            tensor.numel(),
        )
    }

    /// Every rank's `input` into `output`, rank after rank: `output` holds
    /// `world_size × input.numel()` elements (PyTorch's `all_gather_into_tensor`).
    pub fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work> {
        let what = "all_gather";
        self.check_pair(what, input, output)?;
        self.check_sizes(what, output, "output", input.numel() * self.world_size)?;
        self.enqueue(CollectiveKind::AllGather, input, output, input.numel())
    }

    /// Reduces `input` (`world_size × output.numel()` elements) across ranks and leaves
    /// rank `r` the `r`-th part of the result in `output` (`reduce_scatter_tensor`).
    pub fn reduce_scatter(&self, input: &Tensor, output: &Tensor, op: ReduceOp) -> Result<Work> {
        let what = "reduce_scatter";
        self.check_pair(what, input, output)?;
        check_op(what, op, input.dtype())?;
        self.check_sizes(what, input, "input", output.numel() * self.world_size)?;
        self.enqueue(
            CollectiveKind::ReduceScatter(op),
            input,
            output,
            output.numel(),
        )
    }

    /// Returns once every rank has called `barrier` and all collectives enqueued before
    /// it have finished: as PyTorch's NCCL barrier does, an all-reduce of one element
    /// that the host then waits for.
    pub fn barrier(&self) -> Result<()> {
        let one = Tensor::zeros(&[1], DType::F32, &self.device)?;
        self.all_reduce(&one, ReduceOp::Sum)?.synchronize()
    }

    // ANCHOR: enqueue
    /// Orders the collective after the default stream's work, runs it on the chosen
    /// stream, marks its end, and holds the tensors until the default stream waits.
    fn enqueue(
        &self,
        kind: CollectiveKind,
        send: &Tensor,
        recv: &Tensor,
        count: usize,
    ) -> Result<Work> {
        let stream = self.stream();
        let producer = self.device.current_stream()?;
        if stream.handle() != producer.handle() {
            let ready = self.device.new_event()?;
            producer.record(&ready)?;
            stream.wait(&ready)?;
        }
        run_collective(&*self.transport, kind, send, recv, count, stream)?;
        let done = self.device.new_event()?;
        stream.record(&done)?;
        let held = if stream.handle() == producer.handle() {
            Vec::new()
        } else {
            vec![send.clone(), recv.clone()]
        };
        Ok(Work {
            device: self.device.clone(),
            stream: stream.clone(),
            done,
            held: Mutex::new(held),
        })
    }
    // ANCHOR_END: enqueue

    /// A tensor a collective can use: on this rank's device, contiguous, of a dtype the
    /// transports have.
    fn check(&self, what: &str, t: &Tensor) -> Result<()> {
        if t.device().id() != self.device.id() {
            return Err(Error::InvalidArgument(format!(
                "{what}: the tensor is on {} but rank {} of this group drives {}",
                t.device().id(),
                self.rank,
                self.device.id()
            )));
        }
        if !t.is_contiguous() {
            return Err(Error::InvalidArgument(format!(
                "{what}: the tensor must be contiguous (shape {:?}, strides {:?}); call \
                 .contiguous() first",
                t.shape(),
                t.strides()
            )));
        }
        Ok(())
    }

    fn check_pair(&self, what: &'static str, input: &Tensor, output: &Tensor) -> Result<()> {
        self.check(what, input)?;
        self.check(what, output)?;
        if input.dtype() != output.dtype() {
            return Err(Error::DTypeMismatch {
                op: what,
                a: input.dtype(),
                b: output.dtype(),
            });
        }
        Ok(())
    }

    fn check_sizes(&self, what: &str, t: &Tensor, name: &str, expected: usize) -> Result<()> {
        if t.numel() != expected {
            return Err(Error::InvalidArgument(format!(
                "{what}: {name} has {} elements (shape {:?}) but a group of {} needs {expected}",
                t.numel(),
                t.shape(),
                self.world_size
            )));
        }
        Ok(())
    }
}

/// Averages of integers would truncate differently on each transport: refused.
fn check_op(what: &'static str, op: ReduceOp, dtype: DType) -> Result<()> {
    if op == ReduceOp::Avg && !crate::tensor::is_floating_point(dtype) {
        return Err(Error::DType {
            op: what,
            found: dtype,
            supported: "float32, float16, bfloat16 (ReduceOp::Avg)",
        });
    }
    Ok(())
}
