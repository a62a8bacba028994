//! PNG plots of benchmark results (plotters): one line per series, points marked.
//!
//! Text is drawn with a system font found through fontconfig (`fonts-dejavu-core` is
//! installed by `scripts/setup.sh`).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

/// Draws `series` (name, points) as lines over a shared x axis.
pub fn lines(path: &Path, y_label: &str, x_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> Result<()> {
    let pts = series.iter().flat_map(|(_, p)| p.iter().copied());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for (x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    let pad = ((x1 - x0) * 0.05).max(0.25);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(y_label, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..(y1 * 1.15).max(1e-9))
        .map_err(err)?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).x_labels(8).draw().map_err(err)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
