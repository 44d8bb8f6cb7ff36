//! `--plot FILE.svg|FILE.png`: latency and bandwidth against message size
//! on log axes, one curve per series (fmx, the floor, the peers), side by
//! side. SVG is drawn with plotters' SVG backend (no system fonts needed);
//! PNG is that SVG rasterised by `rsvg-convert` (Debian's librsvg2-bin).

use std::path::Path;

use plotters::prelude::*;

/// One curve: its name and its (size in bytes, value) points.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend's name.
    pub name: String,
    /// (size, value), sizes above 0.
    pub points: Vec<(usize, f64)>,
}

impl Series {
    /// A named curve from OSU-style rows (size 0 left out: log axes).
    pub fn new(name: impl Into<String>, rows: &[(usize, f64)]) -> Self {
        Self { name: name.into(), points: rows.iter().copied().filter(|&(s, v)| s > 0 && v > 0.0 && v.is_finite()).collect() }
    }
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(90, 90, 90),
];

fn human(bytes: f64) -> String {
    let b = bytes.round() as u64;
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// Size ticks at powers of four (1, 4, 16, ... 1K, 4K, ...) within the range.
fn size_keys(min: f64, max: f64) -> Vec<f64> {
    (0..=32).map(|i| f64::from(1u32 << (2 * i).min(31))).filter(|&k| k >= min / 1.5 && k <= max * 1.5).collect()
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut xmax, mut ymin, mut ymax) = (2.0f64, f64::MAX, f64::MIN);
    let mut xmin = f64::MAX;
    for &(x, y) in pts {
        xmin = xmin.min(x as f64);
        xmax = xmax.max(x as f64);
        ymin = ymin.min(y);
        ymax = ymax.max(y);
    }
    if xmin == f64::MAX {
        return Err(format!("{title}: nothing to plot"));
    }
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (xmin.max(1.0) / 1.5..xmax * 1.5).log_scale().with_key_points(size_keys(xmin, xmax)),
            (ymin / 1.5..ymax * 1.5).log_scale(),
        )
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(unit)
        .x_label_formatter(&|x| human(*x))
        .y_label_formatter(&|y| {
            if *y >= 10.0 {
                format!("{y:.0}")
            } else if *y >= 1.0 {
                format!("{y:.1}")
            } else {
                format!("{y:.2}")
            }
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x as f64, y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled()))).map_err(e)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    Ok(())
}

/// Draws the latency panel and the bandwidth panel into `path` (.svg or .png).
pub fn plot(path: &Path, title: &str, latency: &[Series], bandwidth: &[Series]) -> Result<(), String> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let svg_path = match ext {
        "svg" => path.to_path_buf(),
        "png" => path.with_extension("svg"),
        _ => return Err(format!("--plot {}: the file must end in .svg or .png", path.display())),
    };
    {
        let root = SVGBackend::new(&svg_path, (1400, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root.titled(title, ("sans-serif", 26)).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(700);
        panel(&left, "latency (lower is better)", "microseconds", latency)?;
        panel(&right, "bandwidth (higher is better)", "MB/s (10^6 B/s)", bandwidth)?;
        root.present().map_err(|e| format!("{}: {e}", svg_path.display()))?;
    }
    if ext == "png" {
        let tool = crate::peers::which("rsvg-convert")
            .ok_or("--plot FILE.png needs rsvg-convert (apt-get install librsvg2-bin); FILE.svg needs nothing")?;
        crate::peers::run(std::process::Command::new(tool).arg("-b").arg("white").arg("-o").arg(path).arg(&svg_path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_svg_with_both_panels_every_curve_and_the_legend() {
        let dir = std::env::temp_dir().join(format!("fmx-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.svg");
        let lat = [Series::new("fmx", &[(8, 0.3), (4096, 0.9), (1 << 20, 60.0)]), Series::new("Open MPI", &[(8, 0.26), (4096, 1.1)])];
        let bw = [Series::new("fmx bw", &[(8, 50.0), (1 << 20, 17000.0)]), Series::new("memcpy", &[(8, 900.0), (1 << 20, 20000.0)])];
        plot(&path, "test", &lat, &bw).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for text in ["latency (lower is better)", "bandwidth (higher is better)", "Open MPI", "memcpy", "message size (bytes)", "1M"] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        assert!(svg.matches("<polyline").count() >= 4, "one line per series");
        assert!(plot(&dir.join("p.gif"), "t", &lat, &bw).unwrap_err().contains(".svg or .png"));
        assert!(plot(&path, "t", &[], &bw).unwrap_err().contains("nothing to plot"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
