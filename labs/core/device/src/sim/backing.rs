//! The host bytes behind one simulated allocation. Device memory is backed in chunks
//! of [`CHUNK`] bytes, each allocated zeroed when a kernel first touches it, so that
//! touching a few bytes of a gigabyte segment costs one chunk of host memory and
//! never the segment's whole size in address space.
//!
//! Kernels get one contiguous host pointer per range. A range inside one chunk (every
//! range of an allocation smaller than a chunk) points into the chunk itself. Ranges
//! that overlap or touch are taken together, so that pointers which alias on the device
//! alias on the host: a group that spans chunks is gathered into one temporary buffer
//! before the kernel runs and scattered back after, and every range of the group
//! points into that buffer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::dtype::FillPattern;
use crate::kernels::cpu;

/// The size of a chunk of host backing: the mapping granularity of reserved ranges, so
/// that unmapping whole pages drops whole chunks.
pub(crate) const CHUNK: usize = super::memory::PAGE as usize;

/// An allocation's host bytes.
pub(crate) enum Backing {
    /// Device memory: chunk `i` holds bytes `i * CHUNK..` of the allocation, present
    /// once touched. The last chunk is as long as what is left (at least one byte).
    Chunks(BTreeMap<usize, HostBytes>),
    /// Mapped host memory: one buffer, allocated whole, because the host writes it
    /// through its own pointer.
    Whole(Box<[u8]>),
}

/// A group of ranges gathered into one buffer, to be written back after the kernel.
pub(crate) struct Staged {
    /// Which of the locked allocations it belongs to.
    pub alloc: usize,
    /// Its offset in the allocation.
    start: usize,
    buffer: HostBytes,
}

/// Host bytes behind simulated device memory, counted against [`budget`] while they
/// live.
pub(crate) struct HostBytes(Box<[u8]>);

/// Host bytes behind the simulated devices of this process, chunks and temporary
/// buffers.
static BACKED: AtomicU64 = AtomicU64::new(0);

/// The most host memory the simulated devices of this process back: three quarters of
/// its address-space limit (`ulimit -v`, `RLIMIT_AS`), so that a run too large for the
/// host ends in an error while the rest of the process can still allocate; no bound
/// without a limit.
pub(crate) fn budget() -> u64 {
    static BUDGET: OnceLock<u64> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|limits| {
                let line = limits
                    .lines()
                    .find(|l| l.starts_with("Max address space"))?;
                line.split_whitespace().nth(3)?.parse::<u64>().ok()
            })
            .map_or(u64::MAX, |limit| limit / 4 * 3)
    })
}

impl HostBytes {
    /// `len` (at least 1) zeroed bytes; `Err(len)` when the budget or the host has no
    /// room for them: the simulated device reports that as an error rather than
    /// aborting the process.
    fn zeroed(len: usize) -> Result<Self, usize> {
        let len = len.max(1);
        let before = BACKED.fetch_add(len as u64, Ordering::Relaxed);
        if before.saturating_add(len as u64) > budget() {
            BACKED.fetch_sub(len as u64, Ordering::Relaxed);
            return Err(len);
        }
        let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| len)?;
        // SAFETY: the layout is not empty.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            BACKED.fetch_sub(len as u64, Ordering::Relaxed);
            return Err(len);
        }
        // SAFETY: `p` holds `len` bytes from the global allocator, as a boxed slice of
        // that length does.
        Ok(HostBytes(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, len))
        }))
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        BACKED.fetch_sub(self.0.len() as u64, Ordering::Relaxed);
    }
}

impl std::ops::Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for HostBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// The chunk `index` of an allocation of `size` bytes, allocated zeroed if absent;
/// `Err` with its length when the host has no memory for it.
fn chunk_at(
    chunks: &mut BTreeMap<usize, HostBytes>,
    size: usize,
    index: usize,
) -> Result<&mut HostBytes, usize> {
    use std::collections::btree_map::Entry;
    match chunks.entry(index) {
        Entry::Occupied(e) => Ok(e.into_mut()),
        Entry::Vacant(e) => Ok(e.insert(HostBytes::zeroed(chunk_len(size, index))?)),
    }
}

/// The length of chunk `index` of an allocation of `size` bytes.
fn chunk_len(size: usize, index: usize) -> usize {
    CHUNK.min(size.saturating_sub(index * CHUNK)).max(1)
}

impl Backing {
    pub fn chunked() -> Self {
        Backing::Chunks(BTreeMap::new())
    }

    /// Host bytes allocated so far.
    pub fn bytes(&self) -> u64 {
        match self {
            Backing::Chunks(chunks) => chunks.values().map(|c| c.len() as u64).sum(),
            Backing::Whole(buffer) => buffer.len() as u64,
        }
    }

    /// Drops the chunks of bytes `offset..offset + len` (whole chunks: unmapped pages),
    /// whose contents are gone as a GPU's are after an unmap.
    pub fn drop_chunks(&mut self, offset: usize, len: usize) {
        if let Backing::Chunks(chunks) = self {
            let (first, end) = (offset / CHUNK, (offset + len).div_ceil(CHUNK));
            let doomed: Vec<usize> = chunks.range(first..end).map(|(&i, _)| i).collect();
            for i in doomed {
                chunks.remove(&i);
            }
        }
    }

    /// Points `pointers[i]` at the bytes of each `(offset, len, i)` range of this
    /// allocation of `size` bytes, allocating the chunks the ranges touch. Groups that
    /// span chunks are gathered into buffers, returned tagged with `alloc` for
    /// [`Backing::scatter`] once the kernel is done. `Err`: the bytes the host could
    /// not give.
    pub fn resolve(
        &mut self,
        size: usize,
        alloc: usize,
        mut ranges: Vec<(usize, usize, usize)>,
        pointers: &mut [*mut u8],
        staged: &mut Vec<Staged>,
    ) -> Result<(), usize> {
        let chunks = match self {
            Backing::Whole(buffer) => {
                for (offset, _, i) in ranges {
                    // SAFETY: the range was checked to lie inside the allocation.
                    pointers[i] = unsafe { buffer.as_mut_ptr().add(offset) };
                }
                return Ok(());
            }
            Backing::Chunks(chunks) => chunks,
        };
        ranges.sort_unstable();
        let last_chunk = size.max(1).div_ceil(CHUNK) - 1;
        let mut j = 0;
        while j < ranges.len() {
            // The group: ranges that overlap or touch the ones before them.
            let start = ranges[j].0;
            let mut end = start + ranges[j].1;
            let mut k = j + 1;
            while k < ranges.len() && ranges[k].0 <= end {
                end = end.max(ranges[k].0 + ranges[k].1);
                k += 1;
            }
            let group = &ranges[j..k];
            let first = (start / CHUNK).min(last_chunk);
            let last = if end > start {
                (end - 1) / CHUNK
            } else {
                first
            };
            if first == last {
                let chunk = chunk_at(chunks, size, first)?;
                for &(offset, _, i) in group {
                    // SAFETY: the range lies inside this chunk (or, empty, at its end).
                    pointers[i] = unsafe { chunk.as_mut_ptr().add(offset - first * CHUNK) };
                }
            } else {
                let mut buffer = HostBytes::zeroed(end - start)?;
                // Chunks never touched read as zeros, which the buffer already holds.
                for (&c, chunk) in chunks.range(first..=last) {
                    let (from, to) = overlap(c, start, end);
                    buffer[from - start..to - start]
                        .copy_from_slice(&chunk[from - c * CHUNK..to - c * CHUNK]);
                }
                for &(offset, _, i) in group {
                    // SAFETY: the buffer covers the whole group.
                    pointers[i] = unsafe { buffer.as_mut_ptr().add(offset - start) };
                }
                staged.push(Staged {
                    alloc,
                    start,
                    buffer,
                });
            }
            j = k;
        }
        Ok(())
    }

    /// Writes a gathered group back into the chunks of an allocation of `size` bytes.
    /// A chunk never touched stays untouched if the kernel left its part zero. `Err`:
    /// the bytes of a chunk the host could not give.
    pub fn scatter(&mut self, size: usize, staged: &Staged) -> Result<(), usize> {
        let Backing::Chunks(chunks) = self else {
            return Ok(());
        };
        let (start, end) = (staged.start, staged.start + staged.buffer.len());
        for c in start / CHUNK..end.div_ceil(CHUNK) {
            let (from, to) = overlap(c, start, end);
            let part = &staged.buffer[from - start..to - start];
            if !chunks.contains_key(&c) && part.iter().all(|&b| b == 0) {
                continue;
            }
            let chunk = chunk_at(chunks, size, c)?;
            chunk[from - c * CHUNK..to - c * CHUNK].copy_from_slice(part);
        }
        Ok(())
    }

    /// Writes `pattern` over bytes `offset..offset + len` of an allocation of `size`
    /// bytes (`len` a whole number of elements), one chunk at a time. Zeros leave
    /// chunks never touched as they are: they read as zeros already. `Err`: the bytes
    /// of a chunk the host could not give.
    pub fn fill(
        &mut self,
        size: usize,
        offset: usize,
        len: usize,
        pattern: FillPattern,
    ) -> Result<(), usize> {
        let width = pattern.width();
        let bytes = pattern_bytes(pattern);
        let zero = bytes.iter().all(|&b| b == 0);
        let chunks = match self {
            Backing::Whole(buffer) => {
                // SAFETY: the range was checked to lie inside the allocation.
                unsafe { cpu::fill(buffer.as_mut_ptr().add(offset), pattern, len / width) };
                return Ok(());
            }
            Backing::Chunks(chunks) => chunks,
        };
        let (start, end) = (offset, offset + len);
        if len == 0 {
            return Ok(());
        }
        for c in start / CHUNK..end.div_ceil(CHUNK) {
            let (from, to) = overlap(c, start, end);
            if zero && !chunks.contains_key(&c) {
                continue;
            }
            let chunk = chunk_at(chunks, size, c)?;
            let part = &mut chunk[from - c * CHUNK..to - c * CHUNK];
            // Where in the pattern this part begins: an element may straddle chunks.
            let phase = (from - start) % width;
            let head = ((width - phase) % width).min(part.len());
            for (k, b) in part[..head].iter_mut().enumerate() {
                *b = bytes[phase + k];
            }
            let whole = (part.len() - head) / width;
            // SAFETY: `whole` elements fit in the part after its head.
            unsafe { cpu::fill(part.as_mut_ptr().add(head), pattern, whole) };
            let tail = head + whole * width;
            for (k, b) in part[tail..].iter_mut().enumerate() {
                *b = bytes[k];
            }
        }
        Ok(())
    }
}

/// The bytes of one element of `pattern`, in memory order.
fn pattern_bytes(pattern: FillPattern) -> Vec<u8> {
    match pattern {
        FillPattern::U8(v) => vec![v],
        FillPattern::U16(v) => v.to_ne_bytes().to_vec(),
        FillPattern::U32(v) => v.to_ne_bytes().to_vec(),
        FillPattern::U64(v) => v.to_ne_bytes().to_vec(),
    }
}

/// The part of `start..end` inside chunk `c`.
fn overlap(c: usize, start: usize, end: usize) -> (usize, usize) {
    (start.max(c * CHUNK), end.min((c + 1) * CHUNK))
}
