//! The report's charts, drawn by plotters as inline SVG (text stays text,
//! so the page needs no fonts or images for them).

use plotters::prelude::*;

use super::fitted::Overlay;
use crate::curation::histogram::Histogram;

/// Chart size in CSS pixels.
pub const WIDTH: u32 = 560;
/// Chart height in CSS pixels.
pub const HEIGHT: u32 = 300;
/// Fill of histogram bars (the screenshot test looks for it).
pub const BAR: RGBColor = RGBColor(0x4c, 0x78, 0xa8);
/// The clean component's curve.
pub const CLEAN: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
/// The noisy component's curve.
pub const NOISY: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// The threshold line and the training curves.
const INK: RGBColor = RGBColor(0x33, 0x33, 0x33);

/// A histogram chart and what to draw over it.
#[derive(Debug, Clone)]
pub struct Bars<'a> {
    /// Title above the chart.
    pub title: &'a str,
    /// What the x axis measures.
    pub x_label: &'a str,
    /// The bars.
    pub hist: &'a Histogram,
    /// Mixture components to overlay, as expected counts per bin.
    pub overlay: Option<&'a Overlay>,
    /// A vertical line at this x (the threshold), with its legend text.
    pub marker: Option<(f64, &'a str)>,
}

/// Turn a plotters failure into ours (drawing into a string cannot fail for
/// outside reasons, so this is an internal error).
fn drawing<E: std::fmt::Display>(e: E) -> crate::Error {
    crate::Error::Other(anyhow::anyhow!("drawing a report chart: {e}"))
}

/// The SVG as an element of an HTML page: the HTML parser puts `<svg>` in
/// the SVG namespace itself, and without the namespace URL the page holds
/// no `http` address at all (a reader can check it fetches nothing).
fn inline(svg: String) -> String {
    svg.replacen(" xmlns=\"http://www.w3.org/2000/svg\"", "", 1)
}

/// Draw a histogram as an SVG element.
pub fn histogram_svg(b: &Bars<'_>) -> crate::Result<String> {
    let mut svg = String::new();
    let curve_max = b
        .overlay
        .map(|o| {
            o.clean
                .iter()
                .zip(&o.noisy)
                .map(|(c, n)| c + n)
                .fold(0.0, f64::max)
        })
        .unwrap_or(0.0);
    let bars_max = b.hist.max_count() as f64;
    // Room for the curves where they fit the bars, but a density spike at
    // the edge of a Beta mixture may not flatten the bars.
    let y_max = (bars_max.max(curve_max.min(2.0 * bars_max)) * 1.08).max(1.0);
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(b.title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(b.hist.lo..b.hist.hi, 0.0..y_max)
            .map_err(drawing)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc(b.x_label)
            .y_desc("pairs")
            .x_labels(6)
            .y_labels(5)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(drawing)?;
        chart
            .draw_series(b.hist.counts.iter().enumerate().map(|(i, &c)| {
                let (lo, hi) = b.hist.edges(i);
                Rectangle::new([(lo, 0.0), (hi, c as f64)], BAR.filled())
            }))
            .map_err(drawing)?
            .label("pairs per bin")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], BAR.filled()));
        let clip = |v: f64| v.min(y_max);
        if let Some(o) = b.overlay {
            for (name, colour, ys) in [
                ("clean component", CLEAN, &o.clean),
                ("noisy component", NOISY, &o.noisy),
            ] {
                chart
                    .draw_series(LineSeries::new(
                        o.x.iter().zip(ys.iter()).map(|(&x, &y)| (x, clip(y))),
                        colour.stroke_width(2),
                    ))
                    .map_err(drawing)?
                    .label(name)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 14, y)], colour.stroke_width(2))
                    });
            }
        }
        if let Some((x, name)) = b.marker {
            chart
                .draw_series(LineSeries::new([(x, 0.0), (x, y_max)], INK.stroke_width(1)))
                .map_err(drawing)?
                .label(name)
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], INK));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperMiddle)
            .background_style(WHITE.mix(0.85))
            .border_style(INK.mix(0.4))
            .draw()
            .map_err(drawing)?;
        root.present().map_err(drawing)?;
    }
    Ok(inline(svg))
}

/// Draw one per-epoch curve (`points` are (epoch, value)) as an SVG
/// element; `y_range` fixes the axis (e.g. 0–1 for a fraction), else it
/// spans the values.
pub fn curve_svg(
    title: &str,
    y_label: &str,
    points: &[(f64, f64)],
    y_range: Option<(f64, f64)>,
) -> crate::Result<String> {
    let finite: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let x_max = finite.iter().map(|p| p.0).fold(1.0, f64::max);
    let (y_lo, y_hi) = y_range.unwrap_or_else(|| {
        let lo = finite.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = finite.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        if lo > hi {
            (0.0, 1.0)
        } else {
            let pad = ((hi - lo) * 0.1).max(1e-3 * hi.abs().max(1.0));
            (lo - pad, hi + pad)
        }
    });
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(0.5..x_max + 0.5, y_lo..y_hi)
            .map_err(drawing)?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc(y_label)
            .x_labels(finite.len().clamp(2, 10))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(drawing)?;
        chart
            .draw_series(LineSeries::new(finite.iter().copied(), INK.stroke_width(2)))
            .map_err(drawing)?;
        chart
            .draw_series(finite.iter().map(|&p| Circle::new(p, 3, INK.filled())))
            .map_err(drawing)?;
        root.present().map_err(drawing)?;
    }
    Ok(inline(svg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_draw_one_bar_per_nonempty_bin_and_the_overlay() {
        let hist = Histogram::of([0.1, 0.1, 0.6], 0.0, 1.0, 4);
        let overlay = Overlay {
            x: vec![0.0, 0.5, 1.0],
            clean: vec![0.0, 1.0, 0.0],
            noisy: vec![1.0, 0.0, 0.0],
        };
        let svg = histogram_svg(&Bars {
            title: "clean_prob",
            x_label: "x",
            hist: &hist,
            overlay: Some(&overlay),
            marker: Some((0.5, "threshold")),
        })
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40]);
        // Bars are filled rects of the bar colour (plus one legend swatch);
        // plotters writes empty bins as zero-height rects too.
        let bar = format!("fill=\"#{:02X}{:02X}{:02X}\"", BAR.0, BAR.1, BAR.2);
        assert_eq!(svg.matches(&bar).count(), 4 + 1, "{svg}");
        for text in [
            "clean component",
            "noisy component",
            "threshold",
            "pairs per bin",
        ] {
            assert!(svg.contains(text), "{text}");
        }
        assert!(!svg.contains("http"), "{svg}");
    }

    #[test]
    fn curves_draw_a_point_per_epoch() {
        let svg = curve_svg(
            "loss",
            "loss",
            &[(1.0, 0.5), (2.0, 0.3), (3.0, f64::NAN)],
            None,
        )
        .unwrap();
        assert_eq!(svg.matches("<circle").count(), 2, "{svg}");
    }
}
