//! perftest's statistics over per-iteration timings: t_min, t_max,
//! t_typical (the median), t_avg, t_stdev and the 99% / 99.9% percentiles.

use serde::Serialize;

/// Summary of one size's samples (microseconds, or MB/s for bandwidth).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stats {
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// The median (perftest's t_typical).
    pub typical: f64,
    /// Arithmetic mean.
    pub avg: f64,
    /// Population standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl Stats {
    /// Summarises `samples` (sorted in place); `None` for no samples.
    pub fn of(samples: &mut [f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let n = samples.len() as f64;
        let avg = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|s| (s - avg) * (s - avg)).sum::<f64>() / n;
        Some(Self {
            min: samples[0],
            max: samples[samples.len() - 1],
            typical: samples[samples.len() / 2],
            avg,
            stdev: var.sqrt(),
            p99: percentile(samples, 990),
            p999: percentile(samples, 999),
        })
    }

    /// Every field, for the finiteness check.
    pub fn values(&self) -> [f64; 7] {
        [self.min, self.max, self.typical, self.avg, self.stdev, self.p99, self.p999]
    }
}

/// The nearest-rank percentile of sorted samples: the smallest sample at
/// or below which `per_mille` thousandths of them lie (integer arithmetic:
/// 0.999 * 1000 is not 999 in floating point).
/// (median, lowest, highest) of one figure's interleaved runs (not empty):
/// how `compare`, `compare --rate` and `neighbor-compare` report a cell.
pub fn spread(runs: &[f64]) -> (f64, f64, f64) {
    let mut v = runs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let m = if n % 2 == 1 { v[n / 2] } else { f64::midpoint(v[n / 2 - 1], v[n / 2]) };
    (m, v[0], v[n - 1])
}

fn percentile(sorted: &[f64], per_mille: usize) -> f64 {
    let rank = (per_mille * sorted.len()).div_ceil(1000);
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_median_of_a_known_series() {
        // 1..=1000 shuffled: p99 is 990, p99.9 is 999, the median 501 (upper middle).
        let mut v: Vec<f64> = (1..=1000).map(|i| f64::from((i * 7919) % 1000 + 1)).collect();
        let s = Stats::of(&mut v).unwrap();
        assert_eq!((s.min, s.max, s.typical, s.p99, s.p999), (1.0, 1000.0, 501.0, 990.0, 999.0));
        assert!((s.avg - 500.5).abs() < 1e-9);
        assert!((s.stdev - 288.674_990_257).abs() < 1e-6, "{}", s.stdev);
    }

    #[test]
    fn one_sample_is_every_statistic() {
        let s = Stats::of(&mut [2.5]).unwrap();
        assert_eq!(s.values(), [2.5, 2.5, 2.5, 2.5, 0.0, 2.5, 2.5]);
        assert!(Stats::of(&mut []).is_none());
    }
}
