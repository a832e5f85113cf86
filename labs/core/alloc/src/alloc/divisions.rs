//! `roundup_power2_divisions`: how finely requests of each size are rounded, as PyTorch
//! parses and keeps the knob.

use crate::format::quote;

// ANCHOR: divisions
/// `roundup_power2_divisions`, as PyTorch keeps it: one number of divisions for each
/// power-of-two interval of request sizes from 1 MiB to 32 GiB (`[1 MiB, 2 MiB)`,
/// `[2 MiB, 4 MiB)`, ...); smaller requests use the first, larger ones the last.
/// `4` sets every interval; `[256:1,512:2,>:8]` sets sizes below 512 MiB to 1 (plain
/// rounding), `[512 MiB, 1 GiB)` to 2 and everything above to 8. An interval skipped
/// between two entries keeps plain rounding, as in PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Divisions([u32; INTERVALS]);

const INTERVALS: usize = 16;

impl Divisions {
    /// The same number of divisions for every size (0 or 1: plain rounding).
    pub fn uniform(n: u32) -> Divisions {
        Divisions([if n == 1 { 0 } else { n }; INTERVALS])
    }

    /// The divisions for a request of `size` bytes.
    #[inline]
    pub fn for_size(&self, size: u64) -> u32 {
        let log2 = 63 - (size | 1).leading_zeros() as usize;
        self.0[log2.saturating_sub(20).min(INTERVALS - 1)]
    }

    pub fn is_off(&self) -> bool {
        self.0.iter().all(|&d| d == 0)
    }

    /// PyTorch's two forms: one power of two, or `[MB:N,MB:N,...,>:N]` with MB powers of
    /// two in increasing order and N powers of two or 0.
    pub(super) fn parse(value: &str) -> std::result::Result<Divisions, String> {
        let check = |n: &str| -> std::result::Result<u32, String> {
            let d: u32 = n
                .trim()
                .parse()
                .map_err(|_| format!("{} is not a whole number", quote(n)))?;
            if d != 0 && !d.is_power_of_two() {
                return Err(format!("{d} divisions: must be a power of two or 0"));
            }
            Ok(if d == 1 { 0 } else { d })
        };
        let Some(list) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
            return Ok(Divisions::uniform(check(value)?));
        };
        let mut table = [0u32; INTERVALS];
        // Entries are compared by size, not by table slot: sizes of 32 GiB and beyond
        // share the last slot, and a list that goes on increasing past it is valid.
        let mut last: Option<usize> = None;
        let mut last_mb: Option<u64> = None;
        for entry in list.split(',').map(str::trim) {
            let (key, n) = entry
                .split_once(':')
                .ok_or_else(|| format!("{} is not `MB:divisions`", quote(entry)))?;
            let n = check(n)?;
            if key.trim() == ">" {
                let from = last.map_or(0, |i| i + 1);
                table[from..].iter_mut().for_each(|d| *d = n);
                continue;
            }
            let mb: u64 = key
                .trim()
                .parse()
                .map_err(|_| format!("{} is not a size in MB", quote(key)))?;
            if !mb.is_power_of_two() {
                return Err(format!("interval {mb} MB: must be a power of two"));
            }
            let index = (mb.trailing_zeros() as usize).min(INTERVALS - 1);
            if last_mb.is_some_and(|l| mb <= l) {
                return Err(format!("interval {mb} MB: intervals must increase"));
            }
            last_mb = Some(mb);
            // As in PyTorch: the first entry also covers every smaller size; a later one
            // covers its own interval only, so intervals skipped between two entries
            // keep plain rounding.
            let from = if last.is_none() { 0 } else { index };
            table[from..=index].iter_mut().for_each(|d| *d = n);
            last = Some(index);
        }
        Ok(Divisions(table))
    }
}

impl std::fmt::Display for Divisions {
    /// The form `parse` reads: one number when every interval agrees, else the list.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.iter().all(|&d| d == self.0[0]) {
            return write!(f, "{}", self.0[0]);
        }
        let entries: Vec<String> = (0..INTERVALS)
            .filter(|&i| i + 1 == INTERVALS || self.0[i] != self.0[i + 1])
            .map(|i| {
                if i + 1 == INTERVALS {
                    format!(">:{}", self.0[i])
                } else {
                    format!("{}:{}", 1u64 << i, self.0[i])
                }
            })
            .collect();
        write!(f, "[{}]", entries.join(","))
    }
}
// ANCHOR_END: divisions
