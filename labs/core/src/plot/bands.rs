//! The largest allocations as stacked bands over the trace, earliest at the bottom,
//! everything else summed on top: where the memory went at every moment.

use crate::format::bytes;
use crate::snapshot::{stacked_bands, Snapshot};
use plotters::prelude::*;

use super::style::{self, FONT, OTHERS, PALETTE};

pub const TITLE: &str = "Active memory: the largest allocations over the trace";

pub fn active_memory_svg(snapshot: &Snapshot, device: i64, top: usize) -> anyhow::Result<String> {
    let b = stacked_bands(snapshot, device, top);
    let keep = style::sample(&b.total);
    let max = b.total.iter().copied().max().unwrap_or(0);
    let (unit, scale) = style::unit(max);
    let last = b.points.saturating_sub(1).max(1) as f64;

    // Cumulative lower edge of each band at every kept point.
    let mut floor = vec![0u64; keep.len()];
    let mut layers = Vec::new();
    for i in 0..b.bands.len() {
        let values = b.values(i);
        let lower = floor.clone();
        for (j, &k) in keep.iter().enumerate() {
            floor[j] += values[k];
        }
        layers.push((lower, floor.clone()));
    }
    let others_upper: Vec<u64> = keep
        .iter()
        .enumerate()
        .map(|(j, &k)| floor[j] + b.others[k])
        .collect();

    let others = b.others.iter().any(|&o| o > 0);
    let entries = b.bands.len() + usize::from(others);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(
            &mut svg,
            (style::WIDTH, style::HEIGHT + style::legend_height(entries)),
        )
        .into_drawing_area();
        root.fill(&WHITE)?;
        let (top, below) = root.split_vertically(style::HEIGHT);
        let plot = style::title(&top, &format!("{TITLE} (device {device})"))?;
        let mut legend = Vec::new();
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d(0f64..last, 0f64..style::top(max as f64 / scale))?;
        chart
            .configure_mesh()
            .x_desc("trace event")
            .y_desc(format!("memory ({unit})"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, style::TEXT_SIZE))
            .draw()?;
        let polygon = |lower: &[u64], upper: &[u64]| -> Vec<(f64, f64)> {
            let mut pts = style::steps(&keep, |j| upper[j] as f64 / scale);
            let mut below = style::steps(&keep, |j| lower[j] as f64 / scale);
            below.reverse();
            pts.extend(below);
            pts
        };
        for (i, (lower, upper)) in layers.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let band = &b.bands[i];
            let mut label = format!("{}, event {}", bytes(band.size), band.start);
            if let Some(o) = &band.origin {
                label = format!("{label}: {}", style::plain(o));
            }
            chart.draw_series(std::iter::once(Polygon::new(
                polygon(lower, upper),
                colour.mix(0.85).filled(),
            )))?;
            legend.push((label, colour));
        }
        if others {
            chart.draw_series(std::iter::once(Polygon::new(
                polygon(&floor, &others_upper),
                OTHERS.filled(),
            )))?;
            legend.push(("all other allocations".to_string(), OTHERS));
        }
        legend.reverse(); // top band first, as stacked
        style::legend_below(
            &below,
            &format!("The {} largest allocations", b.bands.len()),
            &legend,
        )?;
        root.present()?;
    }
    Ok(svg)
}
