//! Checks on a loaded snapshot's sizes, so that every sum a view takes of them fits 64
//! bits and means something: a block lies inside its segment, a segment's blocks add up
//! to at most its size, and all segments together to at most 2^64 - 1 bytes. A file
//! that breaks them is damaged or forged, and is refused at load.

use super::model::Snapshot;
use super::SnapshotError;

pub(crate) fn sizes(s: &Snapshot) -> Result<(), SnapshotError> {
    let mut reserved = 0u64;
    for (i, seg) in s.segments.iter().enumerate() {
        let at = format!("segments[{i}]");
        reserved = reserved.checked_add(seg.total_size).ok_or_else(|| {
            SnapshotError::shape(
                format!("{at}.total_size"),
                "the segments' sizes add up to more than 2^64 - 1 bytes",
            )
        })?;
        let end = seg.address.checked_add(seg.total_size).ok_or_else(|| {
            SnapshotError::shape(&at, "the segment runs past the end of the address space")
        })?;
        let mut in_blocks = 0u64;
        for (j, b) in seg.blocks.iter().enumerate() {
            let at = format!("{at}.blocks[{j}]");
            let fits =
                b.address >= seg.address && b.address.checked_add(b.size).is_some_and(|e| e <= end);
            if !fits {
                return Err(SnapshotError::shape(
                    at,
                    format!(
                        "the block ({} bytes at {:#x}) does not lie inside its segment \
                         ({} bytes at {:#x})",
                        b.size, b.address, seg.total_size, seg.address
                    ),
                ));
            }
            in_blocks = in_blocks
                .checked_add(b.size)
                .filter(|&n| n <= seg.total_size)
                .ok_or_else(|| {
                    SnapshotError::shape(
                        at,
                        format!(
                            "the segment's blocks add up to more than its {} bytes",
                            seg.total_size
                        ),
                    )
                })?;
        }
    }
    Ok(())
}
