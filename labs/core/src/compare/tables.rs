//! A [`Comparison`] as tables, and as one JSON object.

use crate::format::bytes;
use crate::table::Table;

use super::{Comparison, EventLine, SegmentEvent, SizeGroup, Step};

/// The comparison as one JSON object (every size group, not only the table's).
pub fn json(c: &Comparison) -> serde_json::Value {
    serde_json::to_value(c).expect("a comparison always serialises")
}

fn signed(n: i64) -> String {
    match n {
        0 => "0 B".to_string(),
        n if n > 0 => format!("+{}", bytes(n.unsigned_abs())),
        n => format!("-{}", bytes(n.unsigned_abs())),
    }
}

fn difference(a: u64, b: u64) -> String {
    let d = b as i128 - a as i128;
    signed(d.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

fn step(s: Option<Step>) -> String {
    match s {
        Some(Step::Alloc(n)) => format!("alloc {}", bytes(n)),
        Some(Step::Free(n)) => format!("free {}", bytes(n)),
        None => "(end of the trace)".to_string(),
    }
}

/// The totals, the blocks at the peaks (the `rows` largest differences) and the first
/// divergence of the segment events.
pub fn tables(c: &Comparison, rows: usize) -> Vec<Table> {
    let mut out = vec![totals(c), at_peak(c, rows)];
    out.push(sequences(c));
    if let Some(d) = &c.segment_divergence {
        for (name, e, lines) in [(&c.a, &d.a, &d.context_a), (&c.b, &d.b, &d.context_b)] {
            out.push(context(name, e, lines));
        }
    }
    out
}

fn totals(c: &Comparison) -> Table {
    let (a, b) = (&c.totals_a, &c.totals_b);
    let mut t = Table::new(
        "Totals over each trace",
        &["", &format!("A: {}", c.a), &format!("B: {}", c.b), "B - A"],
    );
    let mut money = |name: &str, x: u64, y: u64| {
        t.row([name.to_string(), bytes(x), bytes(y), difference(x, y)]);
    };
    money("peak requested", a.peak_requested, b.peak_requested);
    money(
        "peak allocated (requests rounded to 512 B)",
        a.peak_allocated,
        b.peak_allocated,
    );
    money("peak reserved", a.peak_reserved, b.peak_reserved);
    money(
        "reserved when the trace began",
        a.reserved_at_start,
        b.reserved_at_start,
    );
    money("reserved at the end", a.final_reserved, b.final_reserved);
    let mut count = |name: &str, x: usize, y: usize| {
        t.row([
            name.to_string(),
            x.to_string(),
            y.to_string(),
            format!("{:+}", y as i64 - x as i64),
        ]);
    };
    count("segments at the end", a.final_segments, b.final_segments);
    count("trace events", a.trace_events, b.trace_events);
    count("allocs", a.allocs, b.allocs);
    count("frees", a.frees, b.frees);
    let mut actions: Vec<&String> = (a.segment_events.iter())
        .chain(&b.segment_events)
        .map(|(n, _)| n)
        .collect();
    actions.sort();
    actions.dedup();
    let of = |v: &[(String, usize)], n: &str| v.iter().find(|(m, _)| m == n).map_or(0, |x| x.1);
    for n in actions {
        count(
            &format!("{n} events"),
            of(&a.segment_events, n),
            of(&b.segment_events, n),
        );
    }
    t
}

fn labels(v: &[(String, usize)]) -> String {
    let mut parts: Vec<String> = (v.iter().take(2))
        .map(|(l, n)| format!("{l} x{n}"))
        .collect();
    if v.len() > 2 {
        parts.push(format!("{} more", v.len() - 2));
    }
    parts.join(", ")
}

fn at_peak(c: &Comparison, rows: usize) -> Table {
    let mut t = Table::new(
        "Blocks live at each one's allocated peak, by requested size (largest difference first)",
        &["size", "A", "B", "B - A", "A holds", "B holds"],
    );
    let row = |t: &mut Table, g: &SizeGroup| {
        t.row([
            bytes(g.size),
            g.count_a.to_string(),
            g.count_b.to_string(),
            signed(g.difference),
            labels(&g.labels_a),
            labels(&g.labels_b),
        ]);
    };
    for g in c.at_peak.iter().take(rows) {
        row(&mut t, g);
    }
    let rest = &c.at_peak[rows.min(c.at_peak.len())..];
    if !rest.is_empty() {
        let (na, nb): (usize, usize) = (
            rest.iter().map(|g| g.count_a).sum(),
            rest.iter().map(|g| g.count_b).sum(),
        );
        t.row([
            format!("{} other sizes", rest.len()),
            na.to_string(),
            nb.to_string(),
            signed(rest.iter().map(|g| g.difference).sum()),
            String::new(),
            String::new(),
        ]);
    }
    t
}

fn sequences(c: &Comparison) -> Table {
    let mut t = Table::new(
        "Allocation sequences (allocs and frees, by size) and segment events",
        &["", "value"],
    );
    t.row([
        "steps the same from the start".to_string(),
        c.same_steps.to_string(),
    ]);
    if c.same_sequence {
        t.row(["allocation sequences", "the same throughout"]);
    } else {
        t.row([
            "first different step".to_string(),
            format!("A: {}; B: {}", step(c.first_step_a), step(c.first_step_b)),
        ]);
    }
    match &c.segment_divergence {
        None => {
            t.row([
                "segment events".to_string(),
                "the same while the allocation sequences are".to_string(),
            ]);
        }
        Some(d) => {
            let side = |e: &Option<SegmentEvent>| match e {
                Some(e) => format!(
                    "{} {} after step {} (event {})",
                    e.action,
                    bytes(e.size),
                    e.position,
                    e.event
                ),
                None => "none".to_string(),
            };
            t.row([
                "segment events the same before the first difference".to_string(),
                d.matched.to_string(),
            ]);
            t.row(["first different segment event, A".to_string(), side(&d.a)]);
            t.row(["first different segment event, B".to_string(), side(&d.b)]);
        }
    }
    t
}

fn context(name: &str, e: &Option<SegmentEvent>, lines: &[EventLine]) -> Table {
    let mut t = Table::new(
        format!("Around the first different segment event: {name}"),
        &["", "event", "action", "size", "block"],
    );
    for l in lines {
        let here = e.as_ref().is_some_and(|e| e.event == l.event);
        t.row([
            if here { ">" } else { "" }.to_string(),
            l.event.to_string(),
            l.action.clone(),
            bytes(l.size),
            l.label.clone().unwrap_or_default(),
        ]);
    }
    t
}
