//! Results and their rendering.

use crate::params::Test;

/// One measured size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Message size in bytes.
    pub size: usize,
    /// Latency in us or bandwidth in MB/s.
    pub value: f64,
}

/// OSU's column format: `%-10d%18.2f`.
pub fn osu_header(test: Test, transport: &str) -> String {
    format!("# fmx-perf {} (OSU methodology), transport {transport}\n# Size{:>22}\n", test.name(), test.unit())
}

/// One OSU line.
pub fn osu_line(r: &Row) -> String {
    format!("{:<10}{:>18.2}\n", r.size, r.value)
}

/// The whole run as JSON.
pub fn json(test: Test, transport: &str, rows: &[Row]) -> String {
    let rows: Vec<String> = rows.iter().map(|r| format!("{{\"size\":{},\"value\":{:.4}}}", r.size, r.value)).collect();
    let unit = if test == Test::Latency { "us" } else { "MB/s" };
    format!("{{\"test\":\"{}\",\"transport\":\"{transport}\",\"unit\":\"{unit}\",\"results\":[{}]}}\n", test.name(), rows.join(","))
}

/// Reads OSU-format output (ours or a peer's): `size value` lines, `#` comments skipped.
pub fn parse_osu(text: &str) -> Vec<Row> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let size = it.next()?.parse().ok()?;
            let value = it.next()?.parse().ok()?;
            Some(Row { size, value })
        })
        .collect()
}

/// Replaces the table between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in `path` with `text`.
pub fn update_readme(path: &str, name: &str, text: &str) -> Result<(), String> {
    let (begin, end) = (format!("<!-- {name}:begin -->"), format!("<!-- {name}:end -->"));
    let old = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let (Some(a), Some(b)) = (old.find(&begin), old.find(&end)) else {
        return Err(format!("{path} has no {begin} ... {end} block"));
    };
    std::fs::write(path, format!("{}{begin}\n{text}{}", &old[..a], &old[b..])).map_err(|e| format!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn osu_lines_parse_back() {
        let rows = [Row { size: 1, value: 0.25 }, Row { size: 4 << 20, value: 15000.5 }];
        let mut text = osu_header(Test::Bw, "shm");
        for r in &rows {
            text.push_str(&osu_line(r));
        }
        assert_eq!(parse_osu(&text), rows);
        assert!(json(Test::Latency, "shm", &rows).contains("\"size\":4194304,\"value\":15000.5000"));
    }
}
