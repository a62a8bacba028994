//! PNG plots of benchmark results (plotters): one line per series, points marked.
//!
//! Text is drawn with a system font found through fontconfig (`fonts-dejavu-core` is
//! installed by `scripts/setup.sh`).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// One named line: its points, (x, y).
pub type Series = (String, Vec<(f64, f64)>);

/// Draws `series` as lines over a shared, linear x axis.
pub fn lines(path: &Path, y_label: &str, x_label: &str, series: &[Series]) -> Result<()> {
    let (x0, x1, y1) = extent(path, series)?;
    let pad = ((x1 - x0) * 0.05).max(0.25);
    draw_lines(path, y_label, x_label, (x0 - pad)..(x1 + pad), 0.0..(y1 * 1.15).max(1e-9), series)
}

/// Draws `series` as lines over a shared, logarithmic x axis (every x > 0): link rates
/// from 1 to 1,000 Mbit/s, where a linear axis would crowd the slow end.
pub fn lines_log_x(path: &Path, y_label: &str, x_label: &str, series: &[Series]) -> Result<()> {
    let (x0, x1, y1) = extent(path, series)?;
    if x0 <= 0.0 {
        return Err(anyhow!("{}: a logarithmic axis needs x > 0 (got {x0})", path.display()));
    }
    draw_lines(path, y_label, x_label, (x0 / 1.2..x1 * 1.2).log_scale(), 0.0..(y1 * 1.15).max(1e-9), series)
}

/// Draws `series` over logarithmic x and y axes (every x and y > 0): latencies from
/// 0.3 µs at 8 B to hundreds at 4 MiB on one chart.
pub fn lines_log_xy(path: &Path, y_label: &str, x_label: &str, series: &[Series]) -> Result<()> {
    let (x0, x1, y1) = extent(path, series)?;
    let y0 = series.iter().flat_map(|(_, p)| p).map(|&(_, y)| y).fold(f64::MAX, f64::min);
    if x0 <= 0.0 || y0 <= 0.0 {
        return Err(anyhow!("{}: logarithmic axes need x, y > 0 (got x from {x0}, y from {y0})", path.display()));
    }
    draw_lines(path, y_label, x_label, (x0 / 1.2..x1 * 1.2).log_scale(), (y0 / 1.5..y1 * 1.5).log_scale(), series)
}

/// The smallest and largest x and the largest y of every point.
fn extent(path: &Path, series: &[Series]) -> Result<(f64, f64, f64)> {
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in series.iter().flat_map(|(_, p)| p) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    Ok((x0, x1, y1))
}

fn draw_lines<X, Y>(path: &Path, y_label: &str, x_label: &str, x: X, y: Y, series: &[Series]) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    crate::out::whole(path, |tmp| draw_lines_into(tmp, path, y_label, x_label, x, y, series))
}

/// [`draw_lines`] into the file `into` (`path` names the plot in errors).
fn draw_lines_into<X, Y>(into: &Path, path: &Path, y_label: &str, x_label: &str, x: X, y: Y, series: &[Series]) -> Result<()>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = BitMapBackend::new(into, (900, 560)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(y_label, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
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

/// Draws one bar per category, its `layers` (name, one value per category) stacked
/// from the bottom, and, when given, a named mark per category (a black bar across,
/// e.g. the end-to-end time beside work that overlapped).
pub fn stacked_bars(path: &Path, y_label: &str, categories: &[String], layers: &[Series1], mark: Option<&Series1>) -> Result<()> {
    let top = (0..categories.len())
        .map(|c| {
            let stack: f64 = layers.iter().map(|(_, v)| v.get(c).copied().unwrap_or(0.0)).sum();
            stack.max(mark.and_then(|(_, m)| m.get(c).copied()).unwrap_or(0.0))
        })
        .fold(0.0f64, f64::max);
    if categories.is_empty() || top <= 0.0 {
        return Err(anyhow!("{}: nothing to plot", path.display()));
    }
    crate::out::whole(path, |into| draw_bars_into(into, path, y_label, categories, layers, mark, top))
}

/// [`stacked_bars`] into the file `into`, up to `top` (`path` names the plot in errors).
fn draw_bars_into(
    into: &Path,
    path: &Path,
    y_label: &str,
    categories: &[String],
    layers: &[Series1],
    mark: Option<&Series1>,
    top: f64,
) -> Result<()> {
    let root = BitMapBackend::new(into, (900, 560)).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(err)?;
    let n = categories.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(y_label, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..n - 0.5, 0.0..top * 1.3)
        .map_err(err)?;
    let names = categories.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(categories.len())
        .x_label_formatter(&move |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    let mut base = vec![0.0f64; categories.len()];
    for (i, (name, values)) in layers.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let bars: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(c, &v)| {
                let r = Rectangle::new([(c as f64 - 0.3, base[c]), (c as f64 + 0.3, base[c] + v)], color.filled());
                base[c] += v;
                r
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], color.filled()));
    }
    if let Some((name, values)) = mark {
        let marks = values
            .iter()
            .enumerate()
            .map(|(c, &v)| PathElement::new(vec![(c as f64 - 0.4, v), (c as f64 + 0.4, v)], BLACK.stroke_width(4)));
        chart
            .draw_series(marks)
            .map_err(err)?
            .label(name.as_str())
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(4)));
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

/// One named value per category.
pub type Series1 = (String, Vec<f64>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_whole_pngs_and_a_failed_one_leaves_no_file() {
        let d = std::env::temp_dir().join(format!("gepsea-bench-plots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let line = d.join("wall.png");
        lines(&line, "Wall time (s)", "nodes", &[("agents".into(), vec![(4.0, 162.8), (8.0, 83.2), (36.0, 37.0)])]).unwrap();
        let bars = d.join("breakdown.png");
        let layers = [("search".to_string(), vec![10.0, 20.0]), ("write".to_string(), vec![5.0, 1.0])];
        stacked_bars(&bars, "Time (s)", &["a".into(), "b".into()], &layers, Some(&("end to end".into(), vec![12.0, 21.0]))).unwrap();
        for p in [&line, &bars] {
            let bytes = std::fs::read(p).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is a PNG", p.display());
            // The image's own end: the file was written to the last byte.
            assert_eq!(&bytes[bytes.len() - 8..bytes.len() - 4], b"IEND", "{} is whole", p.display());
        }
        let e = lines(&d.join("empty.png"), "y", "x", &[("none".into(), vec![])]).unwrap_err();
        assert!(e.to_string().contains("nothing to plot"), "{e}");
        assert_eq!(crate::out::tests::entries(&d), ["breakdown.png", "wall.png"], "no temporary or empty file");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
