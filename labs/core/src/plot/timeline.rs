//! Allocated and reserved bytes after each event of the trace.

use crate::format::bytes;
use crate::snapshot::{memory_timeline, Snapshot};
use plotters::prelude::*;

use super::style::{self, ALLOCATED, FONT, RESERVED};

pub const TITLE: &str = "Allocated and reserved memory over the trace";

pub fn timeline_svg(snapshot: &Snapshot, device: i64) -> anyhow::Result<String> {
    let points = memory_timeline(snapshot, device);
    let reserved: Vec<u64> = points.iter().map(|p| p.reserved).collect();
    // Thinned by allocated bytes, the curve with the sharp peaks; reserved memory
    // changes rarely and survives any thinning.
    let allocated: Vec<u64> = points.iter().map(|p| p.allocated).collect();
    let keep = style::sample(&allocated);
    let max = points
        .iter()
        .map(|p| p.reserved.max(p.allocated))
        .max()
        .unwrap_or(0);
    let peak_alloc = points.iter().map(|p| p.allocated).max().unwrap_or(0);
    let (unit, scale) = style::unit(max);
    let last = points.len().saturating_sub(1).max(1) as f64;

    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (style::WIDTH, style::HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let plot = style::title(&root, &format!("{TITLE} (device {device})"))?;
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(45)
            .y_label_area_size(75)
            // Headroom so that the legend sits above the data.
            .build_cartesian_2d(0f64..last, 0f64..style::top(max as f64 / scale) * 1.15)?;
        chart
            .configure_mesh()
            .x_desc("trace event")
            .y_desc(format!("memory ({unit})"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, style::TEXT_SIZE))
            .draw()?;
        let series = |f: fn(&crate::snapshot::TimelinePoint) -> u64| {
            style::steps(&keep, |j| f(&points[keep[j]]) as f64 / scale)
        };
        chart
            .draw_series(
                AreaSeries::new(series(|p| p.reserved), 0.0, RESERVED.mix(0.15))
                    .border_style(RESERVED.stroke_width(2)),
            )?
            .label(format!(
                "reserved (peak {})",
                bytes(max_reserved(&reserved))
            ))
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 18, y + 6)], RESERVED.filled()));
        chart
            .draw_series(
                AreaSeries::new(series(|p| p.allocated), 0.0, ALLOCATED.mix(0.3))
                    .border_style(ALLOCATED.stroke_width(2)),
            )?
            .label(format!(
                "allocated, as requested (peak {})",
                bytes(peak_alloc)
            ))
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 18, y + 6)], ALLOCATED.filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, style::TEXT_SIZE))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

fn max_reserved(reserved: &[u64]) -> u64 {
    reserved.iter().copied().max().unwrap_or(0)
}
