//! What the pictures share: sizes, units, colours, and thinning long traces.

use plotters::style::RGBColor;

/// The book draws a picture no wider than its column, 750 CSS pixels: a picture this wide
/// is drawn there at its own size, so that every text below reads at 12 px or more.
pub const WIDTH: u32 = 750;
/// The height of a chart (a legend below it adds its own).
pub const HEIGHT: u32 = 460;
pub const FONT: &str = "sans-serif";
/// Text sizes in plotters' units; its SVG font-size is the size / 1.24, so TEXT_SIZE, the
/// smallest any picture uses, is 12.1 px.
pub const TITLE_SIZE: u32 = 19;
pub const TEXT_SIZE: u32 = 15;
/// The height of one entry of a legend.
const LEGEND_ROW: u32 = 22;

/// The unit the y axis is labelled in: MiB up to a few GiB, then GiB.
pub fn unit(max_bytes: u64) -> (&'static str, f64) {
    if max_bytes >= 4 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    }
}

/// An axis range that leaves headroom above the highest value and is never empty.
pub fn top(max: f64) -> f64 {
    if max > 0.0 {
        max * 1.08
    } else {
        1.0
    }
}

/// Distinct colours for bands (Tableau 10 and lighter variants).
pub const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
];

pub const OTHERS: RGBColor = RGBColor(190, 190, 190);
pub const ALLOCATED: RGBColor = RGBColor(31, 119, 180);
pub const RESERVED: RGBColor = RGBColor(214, 39, 40);
pub const PENDING: RGBColor = RGBColor(255, 127, 14);
pub const INACTIVE: RGBColor = RGBColor(220, 220, 220);

/// Points beyond this are thinned: an SVG of every event of a long training trace
/// would be tens of megabytes and no sharper.
pub const MAX_POINTS: usize = 2000;

/// Which points to draw: all of them, or for long traces the highest point of each
/// stretch, so that peaks survive the thinning.
pub fn sample(totals: &[u64]) -> Vec<usize> {
    if totals.len() <= MAX_POINTS {
        return (0..totals.len()).collect();
    }
    let step = totals.len().div_ceil(MAX_POINTS);
    let mut picked: Vec<usize> = (0..totals.len())
        .step_by(step)
        .map(|start| {
            let end = (start + step).min(totals.len());
            (start..end).max_by_key(|&i| totals[i]).expect("non-empty")
        })
        .collect();
    picked.push(totals.len() - 1);
    picked.dedup();
    picked
}

/// SVG text must not carry markup characters from frame names such as `<module>`.
pub fn plain(text: &str) -> String {
    text.replace('<', "‹").replace('>', "›").replace('&', "+")
}

/// A step line through the kept points: each value holds until the next event, as
/// memory does between allocator calls.
pub fn steps(keep: &[usize], value: impl Fn(usize) -> f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(keep.len() * 2);
    for (j, &k) in keep.iter().enumerate() {
        let v = value(j);
        out.push((k as f64, v));
        if let Some(&next) = keep.get(j + 1) {
            out.push((next as f64, v));
        }
    }
    out
}

/// About how wide `text` is drawn at plotters size `size` in a sans-serif font (an average
/// glyph is a little over half the font's size).
fn text_width(text: &str, size: u32) -> f64 {
    text.chars().count() as f64 * 0.58 * f64::from(size) / 1.24
}

/// The lines a title is drawn on within `width` pixels, and their size: one line at
/// TITLE_SIZE, or at TEXT_SIZE, or two lines at TEXT_SIZE split at the comma (or else the
/// space) nearest the middle.
pub fn title_lines(title: &str, width: u32) -> (u32, Vec<String>) {
    let room = f64::from(width) - 24.0;
    for size in [TITLE_SIZE, TEXT_SIZE] {
        if text_width(title, size) <= room {
            return (size, vec![title.to_string()]);
        }
    }
    let middle = title.len() / 2;
    let nearest = |pattern: &str| {
        title
            .match_indices(pattern)
            .map(|(i, _)| i + pattern.len())
            .min_by_key(|&i| i.abs_diff(middle))
    };
    match nearest(", ").or_else(|| nearest(" ")) {
        Some(at) => (
            TEXT_SIZE,
            vec![
                title[..at].trim_end().to_string(),
                title[at..].trim_start().to_string(),
            ],
        ),
        None => (TEXT_SIZE, vec![title.to_string()]),
    }
}

/// Draws `title` centred at the top of `area` and returns the area below it.
pub fn title<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
) -> Result<
    plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>,
> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let (width, _) = area.dim_in_pixel();
    let (size, lines) = title_lines(title, width);
    let line_height = size as i32 + 6;
    let mut y = 12;
    for line in &lines {
        let style = TextStyle::from((FONT, size)).pos(Pos::new(HPos::Center, VPos::Top));
        area.draw(&Text::new(line.clone(), (width as i32 / 2, y), style))?;
        y += line_height;
    }
    Ok(area.split_vertically(y + 4).1)
}

/// The height of a legend of `entries` entries drawn by `legend_below`.
pub fn legend_height(entries: usize) -> u32 {
    48 + LEGEND_ROW * entries as u32
}

/// A legend drawn in its own area below the chart, so that it never hides data and the
/// picture stays as wide as the column.
pub fn legend_below<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    heading: &str,
    entries: &[(String, RGBColor)],
) -> Result<(), plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>> {
    use plotters::prelude::*;
    let x = 24;
    let mut y = 8;
    area.draw(&Text::new(heading.to_string(), (x, y), (FONT, TEXT_SIZE)))?;
    y += 28;
    for (label, colour) in entries {
        area.draw(&Rectangle::new(
            [(x, y + 2), (x + 16, y + 14)],
            colour.filled(),
        ))?;
        area.draw(&Text::new(label.clone(), (x + 24, y), (FONT, TEXT_SIZE)))?;
        y += LEGEND_ROW as i32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_peak_and_the_ends() {
        let mut v: Vec<u64> = (0..100_000).map(|i| i % 1000).collect();
        v[54_321] = 1 << 40;
        let keep = sample(&v);
        assert!(keep.len() <= MAX_POINTS + 1);
        assert!(keep.contains(&54_321));
        assert_eq!(*keep.last().unwrap(), v.len() - 1);
        assert!(keep.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(sample(&[1, 2, 3]), vec![0, 1, 2]);
    }

    #[test]
    fn a_title_too_wide_for_the_picture_goes_on_two_lines() {
        let (size, lines) = title_lines("Segments and their blocks", WIDTH);
        assert_eq!((size, lines.len()), (TITLE_SIZE, 1));
        let long = "One training step: transformer d_model 256 batch 64x100, fused attention \
                    (cuda:0, NVIDIA H100 80GB HBM3), offloaded to pinned host memory";
        let (size, lines) = title_lines(long, WIDTH);
        assert_eq!(size, TEXT_SIZE);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines.join(" "), long);
        assert!(
            lines
                .iter()
                .all(|l| text_width(l, size) <= f64::from(WIDTH)),
            "{lines:?}"
        );
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        let pts = steps(&[0, 5, 9], |j| [1.0, 2.0, 3.0][j]);
        assert_eq!(
            pts,
            vec![(0.0, 1.0), (5.0, 1.0), (5.0, 2.0), (9.0, 2.0), (9.0, 3.0)]
        );
    }
}
