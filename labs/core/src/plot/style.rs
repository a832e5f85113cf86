//! What the pictures share: sizes, units, colours, and thinning long traces.

use plotters::style::RGBColor;

pub const WIDTH: u32 = 1100;
pub const HEIGHT: u32 = 560;
pub const FONT: &str = "sans-serif";

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

/// A legend drawn in its own area beside the chart, so that it never hides data.
pub fn side_legend<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    heading: &str,
    entries: &[(String, RGBColor)],
) -> Result<(), plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>> {
    use plotters::prelude::*;
    let x = 8;
    let mut y = 60;
    area.draw(&Text::new(heading.to_string(), (x, y), (FONT, 15)))?;
    y += 26;
    for (label, colour) in entries {
        area.draw(&Rectangle::new([(x, y), (x + 16, y + 12)], colour.filled()))?;
        area.draw(&Text::new(label.clone(), (x + 24, y), (FONT, 13)))?;
        y += 22;
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
    fn steps_hold_each_value_until_the_next_point() {
        let pts = steps(&[0, 5, 9], |j| [1.0, 2.0, 3.0][j]);
        assert_eq!(
            pts,
            vec![(0.0, 1.0), (5.0, 1.0), (5.0, 2.0), (9.0, 2.0), (9.0, 3.0)]
        );
    }
}
