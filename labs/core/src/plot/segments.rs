//! A map of the segments: one bar per segment, its length the segment's size, its
//! blocks coloured by state. Fragmentation shows as grey gaps between blue blocks.

use crate::format::bytes;
use crate::snapshot::{BlockState, Snapshot, Summary};
use plotters::prelude::*;

use super::style::{self, ALLOCATED, FONT, INACTIVE, PENDING};

pub const TITLE: &str = "Segments and their blocks";

/// Rows beyond this are left out (with a note in the title): a picture of thousands
/// of bars says no more than the summary.
const MAX_ROWS: usize = 120;

pub fn segments_svg(snapshot: &Snapshot, device: i64) -> anyhow::Result<String> {
    let mut segs: Vec<_> = snapshot
        .segments
        .iter()
        .filter(|g| g.device == device)
        .collect();
    segs.sort_by_key(|g| g.address);
    let shown = segs.len().min(MAX_ROWS);
    let rows = shown.max(1);
    let longest = segs.iter().map(|g| g.total_size).max().unwrap_or(0);
    let (unit, scale) = style::unit(longest);
    let summary = Summary::of(snapshot);
    let mut title = format!(
        "{TITLE} (device {device}): {} segments, {} reserved, {} allocated",
        segs.len(),
        bytes(summary.reserved_bytes),
        bytes(summary.allocated_bytes)
    );
    if shown < segs.len() {
        title.push_str(&format!(", first {shown} shown"));
    }

    let height = (160 + 26 * rows as u32).max(360);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (style::WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let plot = style::title(&root, &title)?;
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(45)
            .y_label_area_size(40)
            // Room right of the longest bar for its label.
            .build_cartesian_2d(
                0f64..(longest.max(1) as f64 / scale) * 1.7,
                0f64..rows as f64,
            )?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_desc(format!("offset in segment ({unit})"))
            .y_desc("segments, by address")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style((FONT, style::TEXT_SIZE))
            .draw()?;

        let colour = |s: BlockState| match s {
            BlockState::ActiveAllocated => ALLOCATED,
            BlockState::ActivePendingFree => PENDING,
            BlockState::Inactive => INACTIVE,
        };
        for (i, g) in segs[..shown].iter().enumerate() {
            // Row 0 at the top, as a listing reads.
            let y0 = (rows - 1 - i) as f64 + 0.15;
            let y1 = y0 + 0.7;
            let x = |addr: u64| addr.saturating_sub(g.address) as f64 / scale;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y0), (g.total_size as f64 / scale, y1)],
                INACTIVE.filled(),
            )))?;
            chart.draw_series(g.blocks.iter().map(|b| {
                Rectangle::new(
                    [(x(b.address), y0), (x(b.address + b.size), y1)],
                    colour(b.state).filled(),
                )
            }))?;
            let pool = format!("{:?}", g.segment_type).to_lowercase();
            let active = g
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::ActiveAllocated)
                .count();
            chart.draw_series(std::iter::once(Text::new(
                format!(
                    "#{i} {} {pool}, {} block{} ({active} active)",
                    bytes(g.total_size),
                    g.blocks.len(),
                    if g.blocks.len() == 1 { "" } else { "s" }
                ),
                (
                    g.total_size as f64 / scale + longest as f64 / scale * 0.01,
                    y1,
                ),
                (FONT, style::TEXT_SIZE),
            )))?;
            // Thin separators so neighbouring blocks of one state stay apart.
            chart.draw_series(g.blocks.iter().map(|b| {
                Rectangle::new(
                    [(x(b.address), y0), (x(b.address + b.size), y1)],
                    WHITE.stroke_width(1),
                )
            }))?;
        }
        for (state, label) in [
            (BlockState::ActiveAllocated, "active_allocated"),
            (BlockState::ActivePendingFree, "active_pending_free"),
            (BlockState::Inactive, "inactive (cached)"),
        ] {
            let c = colour(state);
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 18, y + 6)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FONT, style::TEXT_SIZE))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
