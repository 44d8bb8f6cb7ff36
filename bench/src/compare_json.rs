//! `fmx-perf compare --json`: the comparison as one JSON document, with a
//! metadata block naming fmx's build and each peer's version, every sweep
//! fmx and the peers ran, and the table's rows with their ratios.

use std::collections::BTreeMap;

use serde::Serialize;

/// The whole document.
#[derive(Serialize)]
pub struct Report {
    /// What ran, where and when.
    pub meta: Meta,
    /// One row per test and size of `--sizes`: every side's figure and fmx's ratio to each peer.
    pub results: Vec<Row>,
    /// Every sweep, all sizes: who, test, and (size, value) points.
    pub sweeps: Vec<Sweep>,
}

/// The metadata block.
#[derive(Serialize)]
pub struct Meta {
    /// Always "fmx-perf compare".
    pub tool: &'static str,
    /// fmx's crate version.
    pub fmx_version: &'static str,
    /// The commit fmx-perf was built from, or "unknown".
    pub git: &'static str,
    /// This host.
    pub host: String,
    /// When the report was made (RFC 3339, UTC).
    pub date: String,
    /// The peers that ran, with the version their launcher reports.
    pub peers: Vec<Peer>,
    /// Peers that could not run, with the reason.
    pub not_compared: Vec<String>,
    /// What a ratio means.
    pub ratios: &'static str,
}

/// A peer that ran.
#[derive(Serialize)]
pub struct Peer {
    /// MPICH or Open MPI.
    pub name: String,
    /// What its launcher says of its version.
    pub version: String,
}

/// One test and size of the table.
#[derive(Serialize)]
pub struct Row {
    /// latency or bw.
    pub test: &'static str,
    /// Bytes.
    pub size: usize,
    /// us or MB/s.
    pub unit: &'static str,
    /// Every side's figure (fmx and each peer).
    pub values: BTreeMap<String, f64>,
    /// fmx against each peer: above 1, fmx is better.
    pub fmx_ratio: BTreeMap<String, f64>,
}

/// One sweep.
#[derive(Serialize)]
pub struct Sweep {
    /// fmx or the peer's name.
    pub who: String,
    /// latency or bw.
    pub test: &'static str,
    /// (size in bytes, value) in the test's unit.
    pub points: Vec<(usize, f64)>,
}

impl Report {
    /// The document as text; an error naming the first number that is not
    /// finite (JSON has no NaN or infinity).
    pub fn to_json(&self) -> Result<String, String> {
        for r in &self.results {
            if let Some((who, v)) = r.values.iter().chain(&r.fmx_ratio).find(|(_, v)| !v.is_finite()) {
                return Err(format!("compare: {} at {} B for {who} is {v}, not a finite number", r.test, r.size));
            }
        }
        for s in &self.sweeps {
            if let Some((size, v)) = s.points.iter().find(|(_, v)| !v.is_finite()) {
                return Err(format!("compare: {}'s {} sweep at {size} B is {v}, not a finite number", s.who, s.test));
            }
        }
        serde_json::to_string_pretty(self).map_err(|e| e.to_string())
    }
}

/// Fmx's ratio to a peer: peer/fmx for latency, fmx/peer for bandwidth.
pub fn ratio(test: &str, fmx: f64, peer: f64) -> f64 {
    if test == "latency" {
        peer / fmx
    } else {
        fmx / peer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(fmx: f64) -> Report {
        Report {
            meta: Meta {
                tool: "fmx-perf compare",
                fmx_version: "0",
                git: "x",
                host: "h".into(),
                date: "d".into(),
                peers: vec![],
                not_compared: vec![],
                ratios: "r",
            },
            results: vec![Row {
                test: "latency",
                size: 8,
                unit: "us",
                values: BTreeMap::from([("fmx".into(), fmx)]),
                fmx_ratio: BTreeMap::new(),
            }],
            sweeps: vec![],
        }
    }

    #[test]
    fn numbers_that_json_cannot_hold_are_named() {
        let e = report(f64::INFINITY).to_json().unwrap_err();
        assert_eq!(e, "compare: latency at 8 B for fmx is inf, not a finite number");
        let v: serde_json::Value = serde_json::from_str(&report(0.3).to_json().unwrap()).unwrap();
        assert_eq!(v["results"][0]["values"]["fmx"], 0.3);
        assert_eq!(ratio("latency", 0.5, 1.0), 2.0);
        assert_eq!(ratio("bw", 100.0, 50.0), 2.0);
    }
}
