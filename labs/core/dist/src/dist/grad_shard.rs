//! A rank's shard of the averaged gradients under ZeRO-2 and ZeRO-3: the chunks of
//! every bucket (or unit) that the rank owns, end to end, as the inner optimizer's
//! leaves see them. It is made by the first reduce-scatter after
//! `zero_grad(set_to_none)` and dropped by the next, as PyTorch's FSDP makes and drops
//! its sharded gradients: no gradient memory lives through the forward pass.
//!
//! Its reduce-scatters run on the communication stream while backward goes on: one is
//! waited for when the one after the next starts (two in flight, so that each
//! bucket's input is held no longer than the next bucket takes to fill, as FSDP's
//! reduce-scatter stream does), and the last ones by [`GradientShard::finish`], before
//! the optimizer reads the shard.

use std::collections::VecDeque;

use super::communicator::{Communicator, ReduceOp, Work};
use crate::alloc::Category;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

pub(super) struct GradientShard {
    dtype: DType,
    len: usize,
    /// The optimizer's leaves, each with where its gradient lies in the shard:
    /// (leaf, offset, length).
    leaves: Vec<(Tensor, usize, usize)>,
    shard: Option<Tensor>,
    /// Reduce-scatters not yet waited for, each (for a later micro-batch of a step) with
    /// its result and the place in the shard it adds into.
    in_flight: VecDeque<(Work, Option<(Tensor, Tensor)>)>,
}

/// Reduce-scatters a rank lets run at once before waiting for the oldest.
const IN_FLIGHT: usize = 2;

impl GradientShard {
    pub(super) fn new(dtype: DType, len: usize, leaves: Vec<(Tensor, usize, usize)>) -> Self {
        GradientShard {
            dtype,
            len,
            leaves,
            shard: None,
            in_flight: VecDeque::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Reduce-scatters `input` (a whole bucket or unit) with an average into this rank's
    /// chunk of it, at `offset` in the shard: written there, or added to what is there
    /// when `add` (a later micro-batch of the same step). The shard is made, and handed
    /// to the leaves as their gradients, if it is not there.
    pub(super) fn reduce_scatter(
        &mut self,
        comm: &Communicator,
        input: &Tensor,
        offset: usize,
        add: bool,
    ) -> Result<()> {
        let device = comm.device();
        let shard = match &self.shard {
            Some(g) => g.clone(),
            None => {
                let g = {
                    let _g = Category::Gradient.scope();
                    Tensor::zeros(&[self.len], self.dtype, device)?
                };
                for (leaf, at, n) in &self.leaves {
                    *leaf.grad_slot().expect("a leaf").lock().unwrap() =
                        Some(g.narrow(0, *at, *n)?);
                }
                self.shard = Some(g.clone());
                g
            }
        };
        let chunk = input.numel() / comm.world_size();
        let mine = shard.narrow(0, offset, chunk)?;
        let started = if add {
            let part = {
                let _g = Category::Gradient.scope();
                Tensor::zeros(&[chunk], self.dtype, device)?
            };
            let work = comm.reduce_scatter(input, &part, ReduceOp::Avg)?;
            (work, Some((part, mine)))
        } else {
            (comm.reduce_scatter(input, &mine, ReduceOp::Avg)?, None)
        };
        self.in_flight.push_back(started);
        while self.in_flight.len() > IN_FLIGHT {
            self.complete_oldest()?;
        }
        Ok(())
    }

    /// Waits for every reduce-scatter in flight: the shard holds this step's averaged
    /// gradients afterwards.
    pub(super) fn finish(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.complete_oldest()?;
        }
        Ok(())
    }

    /// The default stream waits for the oldest reduce-scatter, then adds its result in
    /// where a later micro-batch's goes.
    fn complete_oldest(&mut self) -> Result<()> {
        let Some((work, add)) = self.in_flight.pop_front() else {
            return Ok(());
        };
        work.wait()?;
        if let Some((part, mine)) = add {
            mine.copy_(&mine.add(&part)?)?;
        }
        Ok(())
    }

    /// `zero_grad`: drops the shard and the leaves' gradients (`set_to_none`), or zeroes
    /// the shard.
    pub(super) fn zero_grad(&mut self, set_to_none: bool) -> Result<()> {
        self.finish()?;
        if set_to_none {
            self.shard = None;
            for (leaf, _, _) in &self.leaves {
                *leaf.grad_slot().expect("a leaf").lock().unwrap() = None;
            }
            Ok(())
        } else {
            self.shard.as_ref().map_or(Ok(()), Tensor::zero_)
        }
    }
}
