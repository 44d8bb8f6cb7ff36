//! What to measure: the test, its sizes and OSU's iteration counts.

use crate::cli::PerfArgs;

/// Which test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Ping-pong; half round trip in microseconds (`osu_latency`).
    Latency,
    /// Window of non-blocking sends, one ack; MB/s = 10^6 B/s (`osu_bw`).
    Bw,
    /// Both directions at once (`osu_bibw`).
    Bibw,
    /// Every pair streams at once: aggregate MB/s and messages/s (`osu_mbw_mr`).
    MbwMr,
}

impl Test {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Bw => "bw",
            Self::Bibw => "bibw",
            Self::MbwMr => "mbw_mr",
        }
    }
}

/// How results are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OSU's two columns (`Size`, value).
    Osu,
    /// OSU's `-f`: average, minimum, maximum, iterations.
    Full,
    /// perftest's columns.
    Stats,
    /// One JSON document.
    Json,
    /// CSV rows.
    Csv,
}

/// Settings of a run (OSU's defaults).
#[derive(Clone, Debug)]
pub struct Params {
    /// The test.
    pub test: Test,
    /// Smallest message (bytes).
    pub min_size: usize,
    /// Largest message (bytes).
    pub max_size: usize,
    /// Timed iterations for every size (None: OSU's default per test and size).
    pub iters: Option<usize>,
    /// Warm-up iterations for every size (None: OSU's default).
    pub warmup: Option<usize>,
    /// Messages in flight for bw/bibw.
    pub window: usize,
    /// The output.
    pub format: Format,
    /// Bandwidth in Gb/s rather than MB/s.
    pub gbits: bool,
    /// Send from and receive into plain `Vec`s instead of registered buffers
    /// (measures the bounce/per-operation registration path of verbs).
    pub plain: bool,
    /// Sender-receiver pairs (mbw_mr; the others measure one pair).
    pub pairs: usize,
    /// The ranks that measure, as asked with `--pair` (latency, bw, bibw).
    pub pair: Option<(u32, u32)>,
}

/// Above this size OSU uses fewer iterations (its `LARGE_MESSAGE_SIZE`).
pub const LARGE_THRESHOLD: usize = 8192;

impl Params {
    /// OSU defaults for `test`: sizes 1 B .. 4 MiB, window 64.
    pub fn new(test: Test) -> Self {
        Self {
            test,
            min_size: 1,
            max_size: 4 << 20,
            iters: None,
            warmup: None,
            window: 64,
            format: Format::Osu,
            gbits: false,
            plain: false,
            pairs: 1,
            pair: None,
        }
    }

    /// The run `args` ask for; an error names a contradiction clap cannot see.
    pub fn from_args(test: Test, a: &PerfArgs) -> Result<Self, String> {
        let mut p = Self::new(test);
        if let Some(r) = a.message_size {
            p.max_size = r.max;
            p.min_size = r.min.unwrap_or(p.min_size.min(r.max));
        }
        p.min_size = a.min_size.unwrap_or(p.min_size);
        p.max_size = a.max_size.unwrap_or(p.max_size);
        if p.min_size > p.max_size {
            return Err(format!("the smallest size {} is above the largest {}", p.min_size, p.max_size));
        }
        p.iters = a.iterations.map(|i| i as usize);
        p.warmup = a.warmup.map(|i| i as usize);
        p.window = a.window as usize;
        p.format = match (a.json, a.csv, a.stats, a.full) {
            (true, _, _, _) => Format::Json,
            (_, true, _, _) => Format::Csv,
            (_, _, true, _) => Format::Stats,
            (_, _, _, true) => Format::Full,
            _ => Format::Osu,
        };
        p.gbits = a.report_gbits;
        p.plain = a.plain;
        if a.pair.is_some() && test == Test::MbwMr {
            return Err(
                "--pair chooses one pair; mbw_mr streams between the halves of the world (across nodes where there are several)".into()
            );
        }
        p.pair = a.pair;
        Ok(p)
    }

    /// Whether each iteration is timed on its own (the statistics need it;
    /// OSU's plain columns time the whole loop, as OSU does).
    pub fn per_iteration(&self) -> bool {
        self.format != Format::Osu
    }

    /// The sizes measured: 0 if asked, then powers of two.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        if self.min_size == 0 {
            v.push(0);
        }
        let mut s = self.min_size.max(1).next_power_of_two();
        while s <= self.max_size {
            v.push(s);
            s *= 2;
        }
        v
    }

    /// OSU's (iterations, warm-up) for small and for large sizes of this test.
    pub fn osu_defaults(&self) -> [(usize, usize); 2] {
        match self.test {
            Test::Latency => [(10_000, 1_000), (1_000, 100)],
            Test::Bw | Test::Bibw | Test::MbwMr => [(100, 10), (20, 2)],
        }
    }

    /// (iterations, warm-up) for a size: `-i` and `-x` for every size, as
    /// OSU takes them, else OSU's defaults (fewer above 8 KiB).
    pub fn loops(&self, size: usize) -> (usize, usize) {
        let (it, skip) = self.osu_defaults()[usize::from(size > LARGE_THRESHOLD)];
        (self.iters.unwrap_or(it), self.warmup.unwrap_or(skip))
    }

    /// The header line that says how many iterations each size got.
    pub fn loops_line(&self) -> String {
        let [(si, sw), (li, lw)] = self.osu_defaults();
        match (self.iters, self.warmup) {
            (Some(i), Some(w)) => format!("{i} iterations and {w} warm-up for every size"),
            (Some(i), None) => format!("{i} iterations for every size; warm-up {sw} up to {LARGE_THRESHOLD} B, {lw} above"),
            (None, Some(w)) => format!("{si} iterations up to {LARGE_THRESHOLD} B, {li} above (OSU's); warm-up {w} for every size"),
            (None, None) => format!("{si} iterations and {sw} warm-up up to {LARGE_THRESHOLD} B, {li} and {lw} above (OSU's)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::SizeRange;

    #[test]
    fn osu_flags_set_the_range_and_every_size_iterations() {
        let a = PerfArgs { message_size: Some(SizeRange { min: None, max: 4096 }), iterations: Some(50), ..PerfArgs::default() };
        let p = Params::from_args(Test::Latency, &a).unwrap();
        assert_eq!((p.min_size, p.max_size), (1, 4096));
        assert_eq!(p.sizes().len(), 13);
        assert_eq!(p.loops(8), (50, 1000));
        assert_eq!(p.loops(1 << 20), (50, 100), "-i is not divided for large sizes");
        let a = PerfArgs { message_size: Some(SizeRange { min: Some(0), max: 8 }), ..PerfArgs::default() };
        assert_eq!(Params::from_args(Test::Bw, &a).unwrap().sizes(), [0, 1, 2, 4, 8]);
        let a = PerfArgs { min_size: Some(64), max_size: Some(8), ..PerfArgs::default() };
        assert!(Params::from_args(Test::Bw, &a).unwrap_err().contains("64 is above the largest 8"));
    }
}
