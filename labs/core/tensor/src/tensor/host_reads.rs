//! A count of the host's reads of device tensors (`item`, `to_vec`), per thread. Each
//! one waits for the device to finish the work that produces the tensor: a
//! synchronisation, the thing a training step wants as few of as it can (PyTorch's
//! `GradScaler.step` makes one, `found_inf.item()`). Counting per thread lets a test
//! count one step's reads while other tests run beside it.

use std::cell::Cell;

thread_local! {
    static HOST_READS: Cell<u64> = const { Cell::new(0) };
}

/// Reads of device (not host) tensors this thread has made since it started.
pub fn host_reads() -> u64 {
    HOST_READS.with(Cell::get)
}

/// Counts one read.
pub(super) fn count_host_read() {
    HOST_READS.with(|c| c.set(c.get() + 1));
}
