//! Where the memory goes over a training step: the bytes of each allocation category
//! stacked, with the cache (reserved but free) on top, from the allocator's category
//! timeline (PyTorch's memory profiler draws the same picture from a profile).

use crate::alloc::{Category, CategorySample};
use crate::format::bytes;
use plotters::prelude::*;

use super::style::{self, FONT};

/// The bands from the bottom up: what lives all step first, then what comes and goes,
/// then the cache.
pub const BANDS: [(Option<Category>, &str, RGBColor); 9] = [
    (
        Some(Category::Parameter),
        "parameters",
        RGBColor(31, 119, 180),
    ),
    (
        Some(Category::OptimizerState),
        "optimizer state",
        RGBColor(148, 103, 189),
    ),
    (Some(Category::Gradient), "gradients", RGBColor(44, 160, 44)),
    (Some(Category::Input), "inputs", RGBColor(140, 86, 75)),
    (
        Some(Category::Activation),
        "activations (saved for backward)",
        RGBColor(255, 127, 14),
    ),
    (
        Some(Category::AutocastCache),
        "autocast cache",
        RGBColor(227, 119, 194),
    ),
    (
        Some(Category::Temporary),
        "temporaries",
        RGBColor(188, 189, 34),
    ),
    (Some(Category::Other), "other", RGBColor(127, 127, 127)),
    (
        None,
        "cached, free (reserved − allocated)",
        RGBColor(220, 220, 220),
    ),
];

/// The value of band `band` in `sample`.
fn band_bytes(sample: &CategorySample, band: usize) -> u64 {
    match BANDS[band].0 {
        Some(c) => sample.of(c),
        None => sample.cached(),
    }
}

/// The stacked-area picture of `samples`, titled `title`, its memory axis up to the
/// run's own peak.
pub fn category_area_svg(samples: &[CategorySample], title: &str) -> anyhow::Result<String> {
    category_area_svg_to(samples, title, 0)
}

/// The most memory (reserved or allocated) any sample of `samples` holds: for pictures
/// meant to be compared, the largest over all of them is the memory axis of each
/// ([`category_area_svg_to`]).
pub fn category_peak(samples: &[CategorySample]) -> u64 {
    (samples.iter())
        .map(|s| s.reserved.max(s.allocated()))
        .max()
        .unwrap_or(0)
}

/// [`category_area_svg`] with the memory axis reaching at least `axis_max` bytes, so
/// that pictures drawn with the same `axis_max` share a scale and read side by side.
pub fn category_area_svg_to(
    samples: &[CategorySample],
    title: &str,
    axis_max: u64,
) -> anyhow::Result<String> {
    anyhow::ensure!(
        !samples.is_empty(),
        "no samples to draw: was the timeline recorded?"
    );
    let allocated: Vec<u64> = samples.iter().map(|s| s.allocated()).collect();
    // Thinned by allocated bytes, whose peaks matter most.
    let keep = style::sample(&allocated);
    let max = category_peak(samples).max(axis_max);
    let (unit, scale) = style::unit(max);
    let last = samples.len().saturating_sub(1).max(1) as f64;
    // Peak bytes per band, for the legend.
    let peaks: Vec<u64> = (0..BANDS.len())
        .map(|b| samples.iter().map(|s| band_bytes(s, b)).max().unwrap_or(0))
        .collect();

    let entries: Vec<(String, RGBColor)> = BANDS
        .iter()
        .zip(&peaks)
        .rev()
        .filter(|(_, &peak)| peak > 0)
        .map(|((_, name, colour), &peak)| (format!("{name} (max {})", bytes(peak)), *colour))
        .collect();

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(
            &mut svg,
            (
                style::WIDTH,
                style::HEIGHT + style::legend_height(entries.len()),
            ),
        )
        .into_drawing_area();
        root.fill(&WHITE)?;
        let (top, legend) = root.split_vertically(style::HEIGHT);
        let plot = style::title(&top, &style::plain(title))?;
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d(0f64..last, 0f64..style::top(max as f64 / scale))?;
        chart
            .configure_mesh()
            .x_desc("allocator event")
            .y_desc(format!("memory ({unit})"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style((FONT, style::TEXT_SIZE))
            .draw()?;
        // Each band is the area under the running sum up to it, drawn from the top band
        // down so that each lower one covers the part of the previous that is not its.
        for band in (0..BANDS.len()).rev() {
            let cumulative = |j: usize| {
                let s = &samples[keep[j]];
                (0..=band).map(|b| band_bytes(s, b)).sum::<u64>() as f64 / scale
            };
            let colour = BANDS[band].2;
            chart.draw_series(
                AreaSeries::new(style::steps(&keep, cumulative), 0.0, colour.filled())
                    .border_style(colour.stroke_width(1)),
            )?;
        }
        style::legend_below(&legend, "top to bottom", &entries)?;
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(param: u64, act: u64, reserved: u64) -> CategorySample {
        let mut bytes = [0; Category::COUNT];
        bytes[Category::Parameter.index()] = param;
        bytes[Category::Activation.index()] = act;
        CategorySample {
            time_us: 0,
            bytes,
            reserved,
        }
    }

    #[test]
    fn draws_every_band_that_holds_memory_and_names_its_maximum() {
        let samples = [
            sample(4 << 20, 0, 8 << 20),
            sample(4 << 20, 3 << 20, 8 << 20),
            sample(4 << 20, 0, 8 << 20),
        ];
        let svg = category_area_svg(&samples, "one step").unwrap();
        assert!(svg.contains("parameters (max 4.00 MiB)"), "{svg}");
        assert!(svg.contains("activations (saved for backward) (max 3.00 MiB)"));
        assert!(svg.contains("cached, free"));
        // Bands that never hold a byte stay out of the legend.
        assert!(!svg.contains("autocast cache"));
        assert!(category_area_svg(&[], "none").is_err());
    }
}
