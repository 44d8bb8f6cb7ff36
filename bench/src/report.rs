//! Results and their rendering: OSU's columns (and its `-f`), perftest's
//! statistics, JSON and CSV. Every row is checked finite before it is
//! written, so no format ever carries `inf` or `NaN`.

use std::io::Write;

use serde::Serialize;

use crate::meta::Meta;
use crate::params::{Format, Params, Test};
use crate::stats::Stats;

/// One measured size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Message size in bytes.
    pub size: usize,
    /// Timed iterations.
    pub iterations: usize,
    /// Warm-up iterations.
    pub warmup: usize,
    /// Latency in us, or bandwidth in MB/s (10^6 B/s).
    pub value: f64,
    /// Per-iteration statistics (latency in us, bandwidth in MB/s), when timed.
    pub stats: Option<Stats>,
    /// Messages per second (bandwidth tests).
    pub rate: Option<f64>,
}

/// The unit of a row's value as written: us, MB/s or Gb/s.
pub fn unit(p: &Params) -> &'static str {
    match (p.test, p.gbits) {
        (Test::Latency, _) => "us",
        (_, false) => "MB/s",
        (_, true) => "Gb/s",
    }
}

/// A value in the written unit (bandwidth in MB/s becomes Gb/s on request).
fn scaled(p: &Params, v: f64) -> f64 {
    if p.test != Test::Latency && p.gbits {
        v * 8.0 / 1000.0
    } else {
        v
    }
}

/// The row, or an error naming the size and the value that is not finite.
pub fn check_finite(row: &Row) -> Result<(), String> {
    let mut named = vec![("value", row.value)];
    named.extend(row.rate.map(|r| ("messages/s", r)));
    if let Some(s) = &row.stats {
        named.extend(["t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p99.9"].into_iter().zip(s.values()));
    }
    match named.iter().find(|(_, v)| !v.is_finite()) {
        Some((what, v)) => Err(format!(
            "size {} B: {what} is {v} after {} timed iterations; nothing written for it (a clock or iteration-count problem, not a result)",
            row.size, row.iterations
        )),
        None => Ok(()),
    }
}

/// OSU's column header for the format (`-f` adds min, max, iterations).
fn columns(p: &Params) -> String {
    let u = unit(p);
    let what = if p.test == Test::Latency { format!("Latency ({u})") } else { format!("Bandwidth ({u})") };
    match p.format {
        Format::Full => {
            let short = if p.test == Test::Latency { format!("Latency({u})") } else { format!("Bandwidth({u})") };
            format!(
                "{:<10}{:>20}{:>20}{:>20}{:>12}\n",
                "# Size",
                format!("Avg {short}"),
                format!("Min {short}"),
                format!("Max {short}"),
                "Iterations"
            )
        }
        Format::Stats if p.test == Test::Latency => format!(
            "{:>7} {:>11} {:>14} {:>14} {:>16} {:>14} {:>16} {:>22} {:>24}\n",
            "#bytes",
            "#iterations",
            "t_min[usec]",
            "t_max[usec]",
            "t_typical[usec]",
            "t_avg[usec]",
            "t_stdev[usec]",
            "99% percentile[usec]",
            "99.9% percentile[usec]"
        ),
        Format::Stats => {
            let u = if p.gbits { "Gb/sec" } else { "MB/sec" };
            format!(
                "{:>7} {:>11} {:>18} {:>21} {:>16}\n",
                "#bytes",
                "#iterations",
                format!("BW peak[{u}]"),
                format!("BW average[{u}]"),
                "MsgRate[Mpps]"
            )
        }
        _ if p.test == Test::MbwMr => format!("# Size{:>22}{:>18}\n", u, "Messages/s"),
        _ => format!("# Size{what:>22}\n"),
    }
}

/// The header lines of the column formats.
pub fn header(p: &Params, transport: &str, pair: &str, set_up: &str, large: &str) -> String {
    let buffers = if p.plain { "plain Vec (registered per operation or bounced)" } else { "registered once (Fmx::alloc_registered)" };
    let mut s = format!("# fmx-perf {} (OSU methodology), transport {transport}\n", p.test.name());
    // Under shm+verbs or shm+ofi, which half carries this pair.
    s.push_str(&format!("# {pair}\n# set-up: {set_up}\n# large messages: {large}\n"));
    // Like perftest (and OSU under an MPI registration cache), buffers are registered once.
    s.push_str(&format!("# buffers: {buffers}\n# iterations: {}\n", p.loops_line()));
    if p.test != Test::Latency {
        s.push_str(&format!("# window: {} messages in flight\n", p.window));
    }
    if p.test == Test::MbwMr {
        s.push_str(&format!("# pairs: {}, all at once; aggregate figures\n", p.pairs));
    }
    s.push_str(&columns(p));
    s
}

/// One row in the column formats.
pub fn line(p: &Params, r: &Row) -> String {
    let v = scaled(p, r.value);
    match (p.format, &r.stats) {
        (Format::Full, Some(s)) => {
            format!("{:<10}{v:>20.2}{:>20.2}{:>20.2}{:>12}\n", r.size, scaled(p, s.min), scaled(p, s.max), r.iterations)
        }
        (Format::Stats, Some(s)) if p.test == Test::Latency => format!(
            "{:>7} {:>11} {:>14.2} {:>14.2} {:>16.2} {:>14.2} {:>16.2} {:>22.2} {:>24.2}\n",
            r.size, r.iterations, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
        ),
        (Format::Stats, Some(s)) => {
            let mpps = r.rate.unwrap_or(0.0) / 1e6;
            format!("{:>7} {:>11} {:>18.2} {v:>21.2} {mpps:>16.6}\n", r.size, r.iterations, scaled(p, s.max))
        }
        _ if p.test == Test::MbwMr => format!("{:<10}{v:>18.2}{:>18.2}\n", r.size, r.rate.unwrap_or(0.0)),
        _ => format!("{:<10}{v:>18.2}\n", r.size),
    }
}

/// Writes rows as they come, in the asked format; JSON is written at the end.
pub struct Writer<W: Write> {
    out: Sink<W>,
    params: Params,
    rows: Vec<Row>,
}

/// Where rows go: straight out, or through the CSV encoder.
enum Sink<W: Write> {
    Text(W),
    Csv(csv::Writer<W>),
}

/// One CSV record (flat: csv cannot nest).
#[derive(Serialize)]
struct CsvRecord<'a> {
    test: &'a str,
    size: usize,
    iterations: usize,
    warmup: usize,
    value: f64,
    unit: &'a str,
    min: Option<f64>,
    max: Option<f64>,
    typical: Option<f64>,
    avg: Option<f64>,
    stdev: Option<f64>,
    p99: Option<f64>,
    p999: Option<f64>,
    messages_per_second: Option<f64>,
}

/// The JSON document.
#[derive(Serialize)]
struct Document<'a> {
    meta: &'a Meta,
    results: Vec<JsonRow<'a>>,
}

#[derive(Serialize)]
struct JsonRow<'a> {
    size: usize,
    iterations: usize,
    warmup: usize,
    value: f64,
    unit: &'a str,
    messages_per_second: Option<f64>,
    stats: Option<Stats>,
}

impl<W: Write> Writer<W> {
    /// A writer for `p`'s format; column formats get `header` first.
    pub fn new(mut out: W, p: &Params, header: &str) -> Result<Self, String> {
        let out = match p.format {
            Format::Csv => Sink::Csv(csv::Writer::from_writer(out)),
            Format::Json => Sink::Text(out),
            Format::Osu | Format::Full | Format::Stats => {
                out.write_all(header.as_bytes()).map_err(|e| e.to_string())?;
                Sink::Text(out)
            }
        };
        Ok(Self { out, params: p.clone(), rows: Vec::new() })
    }

    /// Checks and writes one size's row (JSON keeps it for the end).
    pub fn row(&mut self, r: Row) -> Result<(), String> {
        check_finite(&r)?;
        let p = &self.params;
        let io = |e: std::io::Error| e.to_string();
        match (&mut self.out, p.format) {
            (_, Format::Json) => self.rows.push(r),
            (Sink::Csv(w), _) => {
                let s = r.stats.map(|s| s.values().map(|v| scaled(p, v)));
                let at = |i: usize| s.map(|v| v[i]);
                w.serialize(CsvRecord {
                    test: p.test.name(),
                    size: r.size,
                    iterations: r.iterations,
                    warmup: r.warmup,
                    value: scaled(p, r.value),
                    unit: unit(p),
                    min: at(0),
                    max: at(1),
                    typical: at(2),
                    avg: at(3),
                    stdev: at(4),
                    p99: at(5),
                    p999: at(6),
                    messages_per_second: r.rate,
                })
                .map_err(|e| e.to_string())?;
                w.flush().map_err(io)?;
            }
            (Sink::Text(w), _) => {
                w.write_all(line(p, &r).as_bytes()).map_err(io)?;
                w.flush().map_err(io)?;
            }
        }
        Ok(())
    }

    /// Ends the report: the JSON document, with `meta`, when that is the format.
    pub fn finish(self, meta: Option<&Meta>) -> Result<(), String> {
        let mut out = match self.out {
            Sink::Text(w) => w,
            Sink::Csv(w) => w.into_inner().map_err(|e| e.to_string())?,
        };
        if self.params.format == Format::Json {
            let meta = meta.ok_or("no metadata for the JSON report")?;
            let p = &self.params;
            let results = self
                .rows
                .iter()
                .map(|r| JsonRow {
                    size: r.size,
                    iterations: r.iterations,
                    warmup: r.warmup,
                    value: scaled(p, r.value),
                    unit: unit(p),
                    messages_per_second: r.rate,
                    stats: r.stats.map(|s| {
                        let v = s.values().map(|v| scaled(p, v));
                        Stats { min: v[0], max: v[1], typical: v[2], avg: v[3], stdev: v[4], p99: v[5], p999: v[6] }
                    }),
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &Document { meta, results }).map_err(|e| e.to_string())?;
            out.write_all(b"\n").map_err(|e| e.to_string())?;
        }
        out.flush().map_err(|e| e.to_string())
    }
}

/// Reads OSU-format output (ours or a peer's): `size value` lines, `#` comments skipped.
pub fn parse_osu(text: &str) -> Vec<(usize, f64)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let size = it.next()?.parse().ok()?;
            let value = it.next()?.parse().ok()?;
            Some((size, value))
        })
        .collect()
}

/// Replaces the table between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in `path` with `text`.
pub fn update_readme(path: &std::path::Path, name: &str, text: &str) -> Result<(), String> {
    let shown = path.display();
    let (begin, end) = (format!("<!-- {name}:begin -->"), format!("<!-- {name}:end -->"));
    let old = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    let (Some(a), Some(b)) = (old.find(&begin), old.find(&end)) else {
        return Err(format!("{shown} has no {begin} ... {end} block"));
    };
    std::fs::write(path, format!("{}{begin}\n{text}{}", &old[..a], &old[b..])).map_err(|e| format!("{shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: usize, value: f64) -> Row {
        Row { size, iterations: 10, warmup: 1, value, stats: Stats::of(&mut [value, value * 2.0]), rate: None }
    }

    #[test]
    fn osu_lines_parse_back() {
        let p = Params::new(Test::Bw);
        let rows = [row(1, 0.25), row(4 << 20, 15000.5)];
        let mut w = Writer::new(
            Vec::new(),
            &p,
            &header(&p, "shm", "rank 0 (node 0) to rank 1 (node 0): shm", "no connection to set up", "single copy"),
        )
        .unwrap();
        for r in &rows {
            w.row(r.clone()).unwrap();
        }
        let Sink::Text(out) = w.out else { panic!("OSU columns are text") };
        let text = String::from_utf8(out).unwrap();
        assert_eq!(parse_osu(&text), [(1, 0.25), (4 << 20, 15000.5)]);
    }

    #[test]
    fn a_row_that_is_not_finite_is_an_error_naming_the_size() {
        let e = check_finite(&row(8, f64::INFINITY)).unwrap_err();
        assert!(e.contains("size 8 B") && e.contains("inf"), "{e}");
        let mut r = row(8, 1.0);
        r.stats.as_mut().unwrap().p999 = f64::NAN;
        assert!(check_finite(&r).unwrap_err().contains("p99.9 is NaN"));
    }

    #[test]
    fn gbits_scale_bandwidth_only() {
        let mut p = Params::new(Test::Bw);
        p.gbits = true;
        assert_eq!(unit(&p), "Gb/s");
        assert!((scaled(&p, 1000.0) - 8.0).abs() < 1e-12);
        p.test = Test::Latency;
        assert_eq!((unit(&p), scaled(&p, 1000.0)), ("us", 1000.0));
    }
}
