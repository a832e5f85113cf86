//! `view`: one self-contained HTML page to explore a snapshot in a browser: the
//! active-memory timeline (stacked by category where the snapshot records them), zoom
//! and pan over the events, the allocations live at any moment, largest first, with
//! the stream and the whole stack of each, the segments and their blocks at a pinned
//! moment, and markers for out-of-memory events and segments handed back to the driver.
//!
//! The snapshot is digested here, not in the page: the timeline comes from
//! [`memory_timeline`] and the allocations from [`live_intervals`] (the same logic as
//! `plot`), thinned into levels of detail with max-preserving buckets so that no peak
//! vanishes, and embedded as JSON in a `<script type="application/json">` tag. The
//! page's CSS and JavaScript are inline: it opens without a network.

use std::collections::{BTreeMap, HashMap};

use labs_core::snapshot::{
    live_intervals, memory_timeline, BlockState, Frames, Snapshot, TimelinePoint, TraceAction,
};
use serde_json::{json, Value};

/// The most points one level of detail draws across the window: the page picks the
/// finest level with at most this many points in view.
pub const MAX_POINTS_IN_VIEW: usize = 2048;

/// Finer levels than this many points are left out of the page, to bound its size; the
/// finest level kept still has every peak.
pub const MAX_POINTS_PER_LEVEL: usize = 65_536;

/// Each coarser level's buckets are this many times wider.
const LEVEL_FACTOR: usize = 4;

/// The name of the one band of a snapshot without categories.
pub const UNCATEGORISED: &str = "allocated";

/// The version of the embedded JSON's layout.
pub const FORMAT_VERSION: u64 = 2;

/// The most frames of one stack the page keeps (innermost first).
pub const MAX_STACK_FRAMES: usize = 64;

/// The page's template: `__VIEW_TITLE__` and `__VIEW_DATA__` are filled in.
const TEMPLATE: &str = include_str!("view.html");

/// One allocation of the digest: live at points `start..end` (`end` `None`: still live
/// where the snapshot was taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub addr: u64,
    pub size: u64,
    pub start: usize,
    pub end: Option<usize>,
    /// Index into the digest's categories (the bands).
    pub band: usize,
    /// The innermost frame of the allocation's stack, as `plot` labels it.
    pub frame: Option<String>,
    /// The stream and the whole stack of the `alloc` event (none for a block allocated
    /// before the trace began).
    pub stream: Option<u64>,
    pub stack: Option<Frames>,
    /// The autograd op that saved the block for backward (the labs' snapshots).
    pub op: Option<String>,
}

/// A segment (or an expandable segment's mapped range) and the points it existed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSpan {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// Points `start..end` (`end` `None`: still there when the snapshot was taken).
    pub start: usize,
    pub end: Option<usize>,
    /// A mapped range of an expandable segment (`segment_map`), not a whole segment.
    pub mapped: bool,
}

/// A trace event the page marks on the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The point after the event.
    pub event: usize,
    /// `oom`, `segment_free`, `segment_unmap`, or the name of an action this library
    /// does not know (PyTorch's newer ones, kept by name).
    pub kind: String,
    pub bytes: u64,
}

/// What the page shows of one device's trace.
#[derive(Debug, Clone)]
pub struct Digest {
    pub device: i64,
    /// Points of the timeline: events + 1.
    pub points: usize,
    /// The band names, bottom up.
    pub bands: Vec<String>,
    /// Allocated bytes of every band at every point (`per_band[point][band]`).
    pub per_band: Vec<Vec<u64>>,
    pub timeline: Vec<TimelinePoint>,
    /// Allocations in order of their first point.
    pub allocations: Vec<Allocation>,
    /// Segments in order of their first point.
    pub segments: Vec<SegmentSpan>,
    pub markers: Vec<Marker>,
}

impl Digest {
    /// Digests `device`'s trace of `snapshot`.
    pub fn of(snapshot: &Snapshot, device: i64) -> Digest {
        let timeline = memory_timeline(snapshot, device);
        let points = timeline.len();
        let events: Vec<_> = snapshot
            .trace
            .iter()
            .filter(|e| e.device == device)
            .collect();
        // Categories: of the alloc event that opened an interval, else (for blocks
        // allocated before the trace began) of the block in the final state.
        let block_category: HashMap<u64, &str> = snapshot
            .segments
            .iter()
            .filter(|s| s.device == device)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state != BlockState::Inactive)
            .filter_map(|b| Some((b.address, b.category.as_deref()?)))
            .collect();
        let intervals = live_intervals(snapshot, device);
        let category = |start: usize, addr: u64| -> Option<&str> {
            match start {
                0 => block_category.get(&addr).copied(),
                k => events
                    .get(k - 1)
                    .filter(|e| e.action == TraceAction::Alloc && e.addr == addr)
                    .and_then(|e| e.category.as_deref()),
            }
        };
        let names: Vec<Option<&str>> = intervals
            .iter()
            .map(|iv| category(iv.start, iv.addr))
            .collect();
        let mut bands: Vec<String> = names.iter().flatten().map(|s| s.to_string()).collect();
        bands.sort();
        bands.dedup();
        let uncategorised = names.iter().any(Option::is_none);
        if uncategorised && !bands.is_empty() {
            bands.push("uncategorised".into());
        } else if bands.is_empty() {
            bands.push(UNCATEGORISED.into());
        }
        let index: BTreeMap<&str, usize> = bands
            .iter()
            .enumerate()
            .map(|(i, b)| (b.as_str(), i))
            .collect();
        let last_band = bands.len() - 1;

        // Bytes per band at every point, by differences over the intervals (what
        // `memory_timeline` sums over all of them).
        let mut delta = vec![vec![0i128; bands.len()]; points + 1];
        let mut allocations = Vec::with_capacity(intervals.len());
        for (iv, name) in intervals.iter().zip(&names) {
            let band = name.map_or(last_band, |n| index[n]);
            delta[iv.start.min(points)][band] += iv.size as i128;
            delta[iv.end.min(points)][band] -= iv.size as i128;
            let made = iv
                .start
                .checked_sub(1)
                .and_then(|k| events.get(k))
                .filter(|e| e.action == TraceAction::Alloc && e.addr == iv.addr);
            allocations.push(Allocation {
                addr: iv.addr,
                size: iv.size,
                start: iv.start,
                end: (iv.end < points).then_some(iv.end),
                band,
                frame: iv.origin.clone(),
                stream: made.map(|e| e.stream),
                stack: made
                    .filter(|e| !e.frames.is_empty())
                    .map(|e| e.frames.clone()),
                op: made.and_then(|e| e.saved_by.clone()),
            });
        }
        let mut acc = vec![0i128; bands.len()];
        let per_band = delta[..points]
            .iter()
            .map(|d| {
                acc.iter_mut()
                    .zip(d)
                    .map(|(a, d)| {
                        *a += d;
                        (*a).max(0) as u64
                    })
                    .collect()
            })
            .collect();

        let markers = events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                matches!(
                    e.action,
                    TraceAction::Oom
                        | TraceAction::SegmentFree
                        | TraceAction::SegmentUnmap
                        | TraceAction::Other(_)
                )
            })
            .map(|(i, e)| Marker {
                event: i + 1,
                kind: e.action.as_str().to_string(),
                bytes: e.size,
            })
            .collect();

        Digest {
            device,
            points,
            bands,
            per_band,
            timeline,
            allocations,
            segments: segment_spans(snapshot, device, &events, points),
            markers,
        }
    }

    /// The largest allocated total and the first point that reaches it.
    pub fn peak(&self) -> (usize, u64) {
        self.timeline
            .iter()
            .map(|p| (p.event, p.allocated))
            .fold((0, 0), |best, p| if p.1 > best.1 { p } else { best })
    }

    /// The levels of detail: bucket widths (in points) with the points each keeps,
    /// finest first. The finest has at most [`MAX_POINTS_PER_LEVEL`] points, the
    /// coarsest at most [`MAX_POINTS_IN_VIEW`].
    pub fn levels(&self) -> Vec<(usize, Vec<usize>)> {
        let totals: Vec<u64> = self.timeline.iter().map(|p| p.allocated).collect();
        let mut levels = Vec::new();
        let mut width = 1;
        loop {
            let kept = thin(&totals, width);
            let done = kept.len() <= MAX_POINTS_IN_VIEW;
            if kept.len() <= MAX_POINTS_PER_LEVEL {
                levels.push((width, kept));
            }
            if done {
                return levels;
            }
            width *= LEVEL_FACTOR;
        }
    }

    /// The digest as the JSON the page reads. Arrays of columns, not of objects, to
    /// keep the page small.
    pub fn to_json(&self, title: &str) -> Value {
        let point = |k: usize| -> Value {
            let p = &self.timeline[k];
            let mut row = vec![json!(p.event), json!(p.time_us), json!(p.reserved)];
            row.extend(self.per_band[k].iter().map(|b| json!(b)));
            Value::Array(row)
        };
        let levels: Vec<Value> = self
            .levels()
            .into_iter()
            .map(|(width, kept)| {
                json!({
                    "bucket": width,
                    "points": kept.into_iter().map(point).collect::<Vec<_>>(),
                })
            })
            .collect();
        // Frames, stacks and ops are shared by many allocations: tables of distinct
        // ones, and an index into them per allocation.
        let mut frames = Distinct::default();
        let frame_of: Vec<Value> = (self.allocations.iter())
            .map(|a| {
                a.frame
                    .as_deref()
                    .map_or(Value::Null, |f| json!(frames.id(f)))
            })
            .collect();
        // Whole stacks, each a list of indices into a table of frames.
        let mut stack_frames = Distinct::default();
        let mut stacks = Distinct::default();
        let stack_of: Vec<Value> = (self.allocations.iter())
            .map(|a| {
                a.stack.as_ref().map_or(Value::Null, |stack| {
                    let ids: Vec<usize> = (stack.iter().take(MAX_STACK_FRAMES))
                        .map(|f| stack_frames.id((f.name.as_str(), f.filename.as_str(), f.line)))
                        .collect();
                    json!(stacks.id(ids))
                })
            })
            .collect();
        let texts: Vec<String> = (stack_frames.values.iter())
            .map(|&(name, file, line)| match (file, line) {
                ("" | "??", _) => name.to_string(),
                (file, 0) => format!("{name} ({file})"),
                (file, line) => format!("{name} ({file}:{line})"),
            })
            .collect();
        // The ops that saved blocks for backward.
        let mut ops = Distinct::default();
        let op_of: Vec<Value> = (self.allocations.iter())
            .map(|a| a.op.as_deref().map_or(Value::Null, |o| json!(ops.id(o))))
            .collect();
        let column = |f: &dyn Fn(&Allocation) -> Value| -> Vec<Value> {
            self.allocations.iter().map(f).collect()
        };
        let segment_column = |f: &dyn Fn(&SegmentSpan) -> Value| -> Vec<Value> {
            self.segments.iter().map(f).collect()
        };
        let (peak_event, peak_bytes) = self.peak();
        json!({
            "format": "lab-03-view",
            "version": FORMAT_VERSION,
            "title": title,
            "device": self.device,
            "points": self.points,
            "max_points_in_view": MAX_POINTS_IN_VIEW,
            "peak": { "event": peak_event, "allocated": peak_bytes },
            "peak_reserved": self.timeline.iter().map(|p| p.reserved).max().unwrap_or(0),
            "bands": self.bands,
            "columns": ["event", "time_us", "reserved"],
            "levels": levels,
            "allocations": {
                "addr": column(&|a| json!(a.addr)),
                "size": column(&|a| json!(a.size)),
                "start": column(&|a| json!(a.start)),
                "end": column(&|a| json!(a.end)),
                "band": column(&|a| json!(a.band)),
                "frame": frame_of,
                "stream": column(&|a| json!(a.stream)),
                "stack": stack_of,
                "op": op_of,
            },
            "ops": ops.values,
            "frames": frames.values,
            "stacks": stacks.values,
            "stack_frames": texts,
            "segments": {
                "addr": segment_column(&|g| json!(g.addr)),
                "size": segment_column(&|g| json!(g.size)),
                "stream": segment_column(&|g| json!(g.stream)),
                "start": segment_column(&|g| json!(g.start)),
                "end": segment_column(&|g| json!(g.end)),
                "mapped": segment_column(&|g| json!(g.mapped)),
            },
            "markers": self.markers.iter().map(|m| json!({
                "event": m.event,
                "kind": m.kind,
                "bytes": m.bytes,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Distinct values in the order first seen, each with its index in that order.
struct Distinct<K> {
    values: Vec<K>,
    index: HashMap<K, usize>,
}

impl<K> Default for Distinct<K> {
    fn default() -> Self {
        Distinct {
            values: Vec::new(),
            index: HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Distinct<K> {
    /// The index of `k`, added at the end if new.
    fn id(&mut self, k: K) -> usize {
        if let Some(&i) = self.index.get(&k) {
            return i;
        }
        self.values.push(k.clone());
        self.index.insert(k, self.values.len() - 1);
        self.values.len() - 1
    }
}

/// The segments of `device` over the trace: from `segment_alloc` to `segment_free`
/// (and each mapped range of an expandable segment, from `segment_map` to
/// `segment_unmap`); those of the final state that no event made were there from the
/// start.
fn segment_spans(
    snapshot: &Snapshot,
    device: i64,
    events: &[&labs_core::snapshot::TraceEvent],
    points: usize,
) -> Vec<SegmentSpan> {
    let mut open: HashMap<(u64, bool), SegmentSpan> = HashMap::new();
    let mut spans = Vec::new();
    let mut made_in_trace = std::collections::HashSet::new();
    for (i, e) in events.iter().enumerate() {
        let k = i + 1;
        let (mapped, opens) = match e.action {
            TraceAction::SegmentAlloc => (false, true),
            TraceAction::SegmentMap => (true, true),
            TraceAction::SegmentFree => (false, false),
            TraceAction::SegmentUnmap => (true, false),
            _ => continue,
        };
        if opens {
            made_in_trace.insert(e.addr);
            let span = SegmentSpan {
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                start: k,
                end: None,
                mapped,
            };
            if let Some(mut old) = open.insert((e.addr, mapped), span) {
                old.end = Some(k);
                spans.push(old);
            }
        } else {
            let mut span = open.remove(&(e.addr, mapped)).unwrap_or(SegmentSpan {
                addr: e.addr,
                size: e.size,
                stream: e.stream,
                start: 0,
                end: None,
                mapped,
            });
            span.end = Some(k);
            spans.push(span);
        }
    }
    spans.extend(open.into_values());
    for g in snapshot.segments.iter().filter(|g| g.device == device) {
        let covered = made_in_trace.contains(&g.address)
            || spans
                .iter()
                .any(|s| s.start == 0 && s.addr == g.address && !s.mapped);
        if !covered && !g.is_expandable {
            spans.push(SegmentSpan {
                addr: g.address,
                size: g.total_size,
                stream: g.stream,
                start: 0,
                end: None,
                mapped: false,
            });
        }
    }
    for s in &mut spans {
        s.end = s.end.filter(|&e| e < points);
    }
    spans.sort_by_key(|s| (s.start, s.addr));
    spans
}

/// The points of `totals` to keep with buckets of `width` points: in each bucket the
/// highest and the lowest (in order), so that neither peaks nor troughs vanish; the
/// first and last points always.
pub fn thin(totals: &[u64], width: usize) -> Vec<usize> {
    if width <= 1 {
        return (0..totals.len()).collect();
    }
    let mut kept = Vec::new();
    for start in (0..totals.len()).step_by(width) {
        let bucket = start..(start + width).min(totals.len());
        let max = bucket
            .clone()
            .max_by_key(|&k| (totals[k], std::cmp::Reverse(k)))
            .expect("a bucket is never empty");
        let min = bucket
            .min_by_key(|&k| (totals[k], k))
            .expect("a bucket is never empty");
        kept.push(max.min(min));
        if max != min {
            kept.push(max.max(min));
        }
    }
    if let Some(last) = totals.len().checked_sub(1) {
        if kept.last() != Some(&last) {
            kept.push(last);
        }
    }
    if kept.first() != Some(&0) && !totals.is_empty() {
        kept.insert(0, 0);
    }
    kept
}

/// The page for device `gpu` (or the snapshot's one device) of `snapshot`, titled
/// `title` (the snapshot's file name): what `lab-03 view` writes, and what the book's
/// viewer makes of a file dropped on it. Its digest comes back too.
pub fn page_of(
    snapshot: &Snapshot,
    title: &str,
    gpu: Option<i64>,
) -> Result<(String, Digest), labs_core::snapshot::SnapshotError> {
    let device = snapshot.pick_device(gpu)?;
    let digest = Digest::of(snapshot, device);
    Ok((page(&digest, title), digest))
}

/// The page for `digest`, titled `title` (the snapshot's file name).
pub fn page(digest: &Digest, title: &str) -> String {
    let data = digest.to_json(title).to_string();
    // `<` only occurs inside JSON strings, where `\u003c` means the same; the script
    // element then cannot be closed by the data (`</script>`).
    let data = data.replace('<', "\\u003c");
    TEMPLATE
        .replace("__VIEW_TITLE__", &escape_html(title))
        .replace("__VIEW_DATA__", &data)
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use labs_core::snapshot::TraceEvent;

    fn event(action: TraceAction, addr: u64, size: u64, category: Option<&str>) -> TraceEvent {
        TraceEvent {
            device: 0,
            action,
            addr,
            size,
            stream: 0,
            time_us: 0,
            frames: Vec::new().into(),
            category: category.map(String::from),
            saved_by: None,
        }
    }

    #[test]
    fn thinning_keeps_every_bucket_peak_and_the_ends() {
        let totals: Vec<u64> = (0..1000u64).map(|k| (k * 7919) % 1009).collect();
        for width in [1, 4, 16, 64] {
            let kept = thin(&totals, width);
            assert!(kept.windows(2).all(|w| w[0] < w[1]), "in order: {width}");
            assert_eq!(kept.first(), Some(&0));
            assert_eq!(kept.last(), Some(&999));
            for bucket in totals.chunks(width) {
                let start = bucket.as_ptr() as usize - totals.as_ptr() as usize;
                let start = start / std::mem::size_of::<u64>();
                let max = *bucket.iter().max().unwrap();
                assert!(
                    kept.iter()
                        .any(|&k| (start..start + bucket.len()).contains(&k) && totals[k] == max),
                    "width {width}: the peak of the bucket at {start} is kept"
                );
            }
            assert!(kept.len() <= 2 * totals.len().div_ceil(width) + 2);
        }
    }

    #[test]
    fn a_long_trace_has_coarse_levels_that_keep_its_peak() {
        // 20,000 alloc/free pairs growing and shrinking, one spike in the middle.
        let mut trace = Vec::new();
        for i in 0..20_000u64 {
            let size = if i == 12_345 {
                1 << 30
            } else {
                512 * (i % 97 + 1)
            };
            trace.push(event(TraceAction::Alloc, 4096 * (i + 1), size, None));
            trace.push(event(
                TraceAction::FreeCompleted,
                4096 * (i + 1),
                size,
                None,
            ));
        }
        let snap = Snapshot {
            trace,
            ..Snapshot::default()
        };
        let d = Digest::of(&snap, 0);
        assert_eq!(d.points, 40_001);
        assert_eq!(d.peak(), (2 * 12_345 + 1, 1 << 30));
        let levels = d.levels();
        assert!(levels.len() >= 2, "{}", levels.len());
        assert!(levels.last().unwrap().1.len() <= MAX_POINTS_IN_VIEW);
        for (width, kept) in &levels {
            assert!(kept.len() <= MAX_POINTS_PER_LEVEL, "{width}");
            assert!(kept.contains(&d.peak().0), "level {width} keeps the peak");
        }
        assert_eq!(d.bands, [UNCATEGORISED]);
        assert_eq!(d.markers, []);
    }

    #[test]
    fn categories_become_bands_and_markers_name_their_events() {
        let trace = vec![
            event(TraceAction::Alloc, 0x100, 1000, Some("parameter")),
            event(TraceAction::Alloc, 0x200, 300, Some("activation")),
            event(TraceAction::Alloc, 0x300, 20, None),
            event(TraceAction::FreeCompleted, 0x200, 300, None),
            event(TraceAction::SegmentFree, 0x1000, 2 << 20, None),
            event(TraceAction::Oom, 0, 1 << 30, None),
        ];
        let snap = Snapshot {
            trace,
            ..Snapshot::default()
        };
        let d = Digest::of(&snap, 0);
        assert_eq!(d.bands, ["activation", "parameter", "uncategorised"]);
        assert_eq!(d.per_band[3], [300, 1000, 20]);
        assert_eq!(d.per_band[4], [0, 1000, 20]);
        assert_eq!(d.peak(), (3, 1320));
        let kinds: Vec<(usize, &str)> = d
            .markers
            .iter()
            .map(|m| (m.event, m.kind.as_str()))
            .collect();
        assert_eq!(kinds, [(5, "segment_free"), (6, "oom")]);
        let act = &d.allocations[1];
        assert_eq!((act.start, act.end, act.band), (2, Some(4), 0));
        assert_eq!(d.allocations[0].end, None, "live at the end");
    }

    #[test]
    fn an_allocation_keeps_its_stream_and_the_op_that_saved_it() {
        let mut saved = event(TraceAction::Alloc, 0x100, 1000, Some("activation"));
        saved.stream = 7;
        saved.saved_by = Some("MmBackward".into());
        let trace = vec![
            saved,
            event(TraceAction::Alloc, 0x200, 300, Some("temporary")),
        ];
        let snap = Snapshot {
            trace,
            ..Snapshot::default()
        };
        let d = Digest::of(&snap, 0);
        assert_eq!(d.allocations[0].stream, Some(7));
        assert_eq!(d.allocations[0].op.as_deref(), Some("MmBackward"));
        assert_eq!(d.allocations[1].op, None);
        let json = d.to_json("t");
        assert_eq!(json["ops"], serde_json::json!(["MmBackward"]));
        assert_eq!(json["allocations"]["op"], serde_json::json!([0, null]));
        assert_eq!(json["allocations"]["stream"], serde_json::json!([7, 0]));
    }

    #[test]
    fn the_data_cannot_close_its_script_element() {
        let snap = Snapshot::default();
        let html = page(&Digest::of(&snap, 0), "</script><b>x</b>");
        assert_eq!(
            html.matches("</script>").count(),
            2,
            "the data's and the code's"
        );
        assert!(html.contains("&lt;/script&gt;"));
    }
}
