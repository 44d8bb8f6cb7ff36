//! What to measure.

/// Which test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Ping-pong; half round trip in microseconds (`osu_latency`).
    Latency,
    /// Window of non-blocking sends, one ack; MB/s = 10^6 B/s (`osu_bw`).
    Bw,
    /// Both directions at once (`osu_bibw`).
    Bibw,
}

impl Test {
    /// Parses `latency`, `bw`, `bibw`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "latency" | "lat" => Some(Self::Latency),
            "bw" => Some(Self::Bw),
            "bibw" => Some(Self::Bibw),
            _ => None,
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Latency => "latency",
            Self::Bw => "bw",
            Self::Bibw => "bibw",
        }
    }

    /// Column header of the OSU output.
    pub fn unit(self) -> &'static str {
        match self {
            Self::Latency => "Latency (us)",
            Self::Bw | Self::Bibw => "Bandwidth (MB/s)",
        }
    }
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
    /// Iterations for sizes up to `large_threshold` (None: OSU's default per test).
    pub iters: Option<usize>,
    /// Warm-up iterations (None: OSU's default).
    pub warmup: Option<usize>,
    /// Messages in flight for bw/bibw.
    pub window: usize,
    /// Print JSON instead of OSU columns.
    pub json: bool,
    /// Send from and receive into plain `Vec`s instead of registered buffers
    /// (measures the bounce/per-operation registration path of verbs).
    pub plain: bool,
}

/// Above this size OSU uses fewer iterations.
pub const LARGE_THRESHOLD: usize = 8192;

impl Params {
    /// OSU defaults for `test`: sizes 1 B .. 4 MiB, window 64.
    pub fn new(test: Test) -> Self {
        Self { test, min_size: 1, max_size: 4 << 20, iters: None, warmup: None, window: 64, json: false, plain: false }
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

    /// (iterations, warm-up) for a size, as OSU picks them.
    pub fn loops(&self, size: usize) -> (usize, usize) {
        let large = size > LARGE_THRESHOLD;
        let (it, skip) = match (self.test, large) {
            (Test::Latency, false) => (10_000, 1_000),
            (Test::Latency, true) => (1_000, 100),
            (_, false) => (100, 10),
            (_, true) => (20, 2),
        };
        let it = self.iters.map_or(it, |i| if large { (i / 10).max(1) } else { i });
        (it, self.warmup.unwrap_or(skip))
    }
}
