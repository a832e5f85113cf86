//! Two snapshots of the same configuration side by side (`lab-03 compare A B`): ours
//! and PyTorch's, or a dry run and the GPU's, in either format. Three views, each read
//! off the traces:
//!
//! - the totals: peaks of requested, allocated and reserved bytes, segments, counts;
//! - the blocks live at each one's allocated peak, grouped by size, with the
//!   difference: which tensors one keeps that the other does not;
//! - where the two allocators first decide differently: the first segment event
//!   (a segment from or to the driver, pages mapped or unmapped) that differs while
//!   the allocation sequences are still the same, with the events around it.
//!
//! [`tables`] prints them.

pub mod tables;
pub mod trace;

use std::collections::BTreeMap;

use crate::snapshot::Snapshot;
use serde::Serialize;

pub use trace::{SegmentEvent, Step, Totals, Trace};

/// One snapshot of a comparison.
pub struct Side<'a> {
    /// How the tables name it (its file name).
    pub name: String,
    pub snapshot: &'a Snapshot,
    pub device: i64,
}

/// The blocks of one request size live at the peak, on both sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SizeGroup {
    /// The requested size.
    pub size: u64,
    pub count_a: usize,
    pub count_b: usize,
    /// B's bytes less A's, each block rounded as the allocator rounds it.
    pub difference: i64,
    /// What the blocks are on each side, most common first (`activation x12`).
    pub labels_a: Vec<(String, usize)>,
    pub labels_b: Vec<(String, usize)>,
}

/// A trace's event shown around a divergence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventLine {
    pub event: usize,
    pub action: String,
    pub size: u64,
    pub label: Option<String>,
}

/// The first segment event at which the two traces differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentDivergence {
    /// Segment events that matched before it.
    pub matched: usize,
    /// Each side's differing event (none: that side has no more segment events
    /// before the allocation sequences part).
    pub a: Option<SegmentEvent>,
    pub b: Option<SegmentEvent>,
    /// The events around it on each side.
    pub context_a: Vec<EventLine>,
    pub context_b: Vec<EventLine>,
}

/// The two snapshots compared.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub totals_a: Totals,
    pub totals_b: Totals,
    /// Every request size live at either peak, largest difference first.
    pub at_peak: Vec<SizeGroup>,
    /// Steps of the two allocation sequences that agree from the start.
    pub same_steps: usize,
    /// Whether the allocation sequences are the same throughout.
    pub same_sequence: bool,
    /// The first step that differs, on each side (`None`: the sequence ended).
    pub first_step_a: Option<Step>,
    pub first_step_b: Option<Step>,
    /// The first differing segment event within the common allocation sequence;
    /// `None` when the segment events agree there.
    pub segment_divergence: Option<SegmentDivergence>,
}

/// Compares `a` and `b`, with `context` events either side of a divergence.
pub fn compare(a: &Side, b: &Side, context: usize) -> Comparison {
    let ta = Trace::read(a.snapshot, a.device);
    let tb = Trace::read(b.snapshot, b.device);
    let same_steps = (ta.steps.iter().zip(&tb.steps))
        .take_while(|((_, x), (_, y))| x == y)
        .count();
    let same_sequence = same_steps == ta.steps.len() && same_steps == tb.steps.len();
    Comparison {
        a: a.name.clone(),
        b: b.name.clone(),
        totals_a: ta.totals.clone(),
        totals_b: tb.totals.clone(),
        at_peak: size_groups(&ta, &tb),
        same_steps,
        same_sequence,
        first_step_a: ta.steps.get(same_steps).map(|s| s.1),
        first_step_b: tb.steps.get(same_steps).map(|s| s.1),
        segment_divergence: segment_divergence(&ta, &tb, same_steps, context),
    }
}

type Groups = BTreeMap<u64, (usize, BTreeMap<String, usize>)>;

fn groups(t: &Trace) -> Groups {
    let mut g: Groups = BTreeMap::new();
    for b in t.live_at_peak() {
        let (count, labels) = g.entry(b.requested).or_default();
        *count += 1;
        let label = b.label.unwrap_or_else(|| "(unknown)".to_string());
        *labels.entry(label).or_default() += 1;
    }
    g
}

fn ranked(labels: Option<&BTreeMap<String, usize>>) -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = labels
        .into_iter()
        .flatten()
        .map(|(l, c)| (l.clone(), *c))
        .collect();
    v.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    v
}

fn size_groups(a: &Trace, b: &Trace) -> Vec<SizeGroup> {
    let (ga, gb) = (groups(a), groups(b));
    let mut sizes: Vec<u64> = ga.keys().chain(gb.keys()).copied().collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out: Vec<SizeGroup> = sizes
        .into_iter()
        .map(|size| {
            let (ca, la) = ga.get(&size).map_or((0, None), |(c, l)| (*c, Some(l)));
            let (cb, lb) = gb.get(&size).map_or((0, None), |(c, l)| (*c, Some(l)));
            let block = trace::rounded(size) as i128;
            let difference = (cb as i128 - ca as i128) * block;
            SizeGroup {
                size,
                count_a: ca,
                count_b: cb,
                difference: difference.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                labels_a: ranked(la),
                labels_b: ranked(lb),
            }
        })
        .collect();
    // Largest difference first; among equal ones, the most bytes.
    out.sort_by_key(|g| {
        let most = g.count_a.max(g.count_b) as u128 * trace::rounded(g.size) as u128;
        (
            std::cmp::Reverse(g.difference.unsigned_abs()),
            std::cmp::Reverse(most),
        )
    });
    out
}

/// The first segment event, among those placed within the first `same` steps of the
/// allocation sequence, that is not the same (position, action and size) on both sides.
fn segment_divergence(
    a: &Trace,
    b: &Trace,
    same: usize,
    context: usize,
) -> Option<SegmentDivergence> {
    let within = |t: &Trace| -> Vec<SegmentEvent> {
        (t.segments.iter())
            .filter(|s| s.position <= same)
            .cloned()
            .collect()
    };
    let (sa, sb) = (within(a), within(b));
    let key = |s: &SegmentEvent| (s.position, s.action.clone(), s.size);
    let matched = (sa.iter().zip(&sb))
        .take_while(|(x, y)| key(x) == key(y))
        .count();
    if matched == sa.len() && matched == sb.len() {
        return None;
    }
    let (ea, eb) = (sa.get(matched).cloned(), sb.get(matched).cloned());
    // Where to look on a side without the event: the other side's place in the
    // allocation sequence.
    let position = ea.iter().chain(&eb).map(|s| s.position).min().unwrap_or(0);
    let centre = |t: &Trace, e: &Option<SegmentEvent>| match e {
        Some(s) => s.event,
        None => (t.steps.get(position)).map_or(t.events.len().saturating_sub(1), |s| s.0),
    };
    let (ca, cb) = (centre(a, &ea), centre(b, &eb));
    Some(SegmentDivergence {
        matched,
        context_a: around(a, ca, context),
        context_b: around(b, cb, context),
        a: ea,
        b: eb,
    })
}

fn around(t: &Trace, centre: usize, context: usize) -> Vec<EventLine> {
    let lo = centre.saturating_sub(context);
    let hi = (centre + context + 1).min(t.events.len());
    (lo..hi)
        .map(|i| EventLine {
            event: i,
            action: t.events[i].action.as_str().to_string(),
            size: t.events[i].size,
            label: t.label_of(i),
        })
        .collect()
}
