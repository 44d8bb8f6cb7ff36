//! fmx-perf's command line. The point-to-point tests take OSU's flags
//! (`-m [MIN:]MAX`, `-i`, `-x`, `-W`, `-f`) and perftest's statistics
//! (`--stats`, `--report_gbits`); every comparison is a subcommand with its
//! own `--help`.

use clap::{Args, Parser, Subcommand};

use crate::{check_cost, compare, neighbor, neighbor_compare, ofi_compare, redistribute};

/// The version line: crate version and the commit it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("FMX_GIT_HASH"), ")");

/// `fmx-perf`.
#[derive(Parser, Debug)]
#[command(
    name = "fmx-perf",
    version = VERSION,
    about = "Latency and bandwidth of fmx, measured as the OSU micro-benchmarks and perftest measure them",
    long_about = "Latency and bandwidth of fmx, measured as the OSU micro-benchmarks and perftest measure them.\n\n\
        Started alone, a test launches its own two ranks on this host, pinned to different cores; under \
        fmxrun, mpiexec or srun it measures between ranks 0 and 1 of the world. The default output is OSU's \
        two columns, so scripts that parse osu_latency and osu_bw read it unchanged."
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Ping-pong latency: half the round trip of a blocking send and receive (osu_latency)
    #[command(visible_alias = "lat")]
    Latency(PerfArgs),
    /// Bandwidth: a window of non-blocking sends, one acknowledgement (osu_bw)
    Bw(PerfArgs),
    /// Bidirectional bandwidth: both ranks send a window at once (osu_bibw)
    Bibw(PerfArgs),
    /// Multiple bandwidth and message rate: several pairs stream at once (osu_mbw_mr)
    #[command(name = "mbw_mr", visible_alias = "mbw-mr")]
    MbwMr(MbwMrArgs),
    /// The hardware floor: core-to-core cache-line latency and memcpy bandwidth per size
    Limits(crate::limits::Args),
    /// Per-process queue pairs, eager memory, bootstrap traffic and set-up time against N, by connection mode (a model)
    ScaleModel(crate::scale_model::Args),
    /// latency, bw, bibw, mbw_mr and limits in one report, with fmx's distance from the floor
    All(crate::all::Args),
    /// fmx's latency and bandwidth beside MPICH's and Open MPI's, in one run
    Compare(compare::Args),
    /// The neighbourhood exchange of MPI-3.0 Example 7.4's torus
    Neighbor(neighbor::Args),
    /// `neighbor` beside MPICH and Open MPI
    NeighborCompare(neighbor_compare::Args),
    /// fmx over libfabric beside fi_pingpong (needs the `ofi` feature)
    OfiCompare(ofi_compare::Args),
    /// What FMX_CHECK=collectives costs an allreduce
    CheckCost(check_cost::Args),
    /// Moving a block-distributed array from N old ranks to M new ones, beside MPI
    Redistribute(redistribute::Args),
    /// One rank of `redistribute` (started by it)
    #[command(hide = true)]
    RedistributeRank(redistribute::RankArgs),
    /// One rank of `check-cost` (started by it)
    #[command(hide = true)]
    CheckCostRank(check_cost::RankArgs),
}

/// Options of `latency`, `bw` and `bibw`.
#[derive(Args, Debug, Clone, Default)]
#[command(after_help = "Iterations and warm-up default to OSU's: latency 10000 and 1000 up to 8 KiB, 1000 and 100 above; \
    bw and bibw 100 and 10 up to 8 KiB, 20 and 2 above. -i and -x set every size, as in OSU. Sizes take K and M suffixes.")]
pub struct PerfArgs {
    /// Message sizes: MAX, or MIN:MAX (OSU's -m), powers of two between
    #[arg(short = 'm', long = "message-size", value_name = "[MIN:]MAX", value_parser = size_range)]
    pub message_size: Option<SizeRange>,
    /// Smallest message size (the MIN of -m)
    #[arg(long, value_name = "BYTES", value_parser = size)]
    pub min_size: Option<usize>,
    /// Largest message size (the MAX of -m)
    #[arg(long, value_name = "BYTES", value_parser = size)]
    pub max_size: Option<usize>,
    /// Timed iterations per size, for every size (OSU's -i)
    #[arg(short = 'i', long = "iterations", visible_alias = "iters", value_name = "N", value_parser = at_least_one)]
    pub iterations: Option<u64>,
    /// Warm-up iterations per size, for every size (OSU's -x)
    #[arg(short = 'x', long = "warmup", value_name = "N", value_parser = clap::value_parser!(u64))]
    pub warmup: Option<u64>,
    /// Messages in flight per iteration of bw and bibw (OSU's -W)
    #[arg(short = 'W', long = "window-size", visible_alias = "window", value_name = "N", default_value_t = 64,
          value_parser = window)]
    pub window: u64,
    /// Full statistics: average, minimum, maximum and iterations per size (OSU's -f)
    #[arg(short = 'f', long = "full")]
    pub full: bool,
    /// perftest's statistics per size: t_min, t_max, t_typical, t_avg, t_stdev, 99% and 99.9% percentiles
    #[arg(long)]
    pub stats: bool,
    /// Bandwidth in Gb/s instead of MB/s (perftest's --report_gbits)
    #[arg(long = "report_gbits", visible_alias = "gbps")]
    pub report_gbits: bool,
    /// One JSON document with metadata and every statistic, instead of columns
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// CSV with a header row and every statistic, instead of columns
    #[arg(long)]
    pub csv: bool,
    /// Send from and receive into plain Vecs (the bounce / per-operation registration path) instead of registered buffers
    #[arg(long)]
    pub plain: bool,
    /// The transport for the ranks fmx-perf starts itself (auto, shm, verbs, ofi, shm+verbs, shm+ofi)
    #[arg(long, value_name = "NAME")]
    pub transport: Option<String>,
    /// Under a launcher, the two ranks that measure (A times and reports); default: rank 0 and the first rank on another node, else rank 1
    #[arg(long, value_name = "A,B", value_parser = crate::pair::parse)]
    pub pair: Option<(u32, u32)>,
}

/// Options of `mbw_mr`.
#[derive(Args, Debug, Clone)]
pub struct MbwMrArgs {
    /// Sender-receiver pairs when fmx-perf starts its own ranks (2 x PAIRS ranks; under a launcher: half the world)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub pairs: u32,
    /// The options latency, bw and bibw take
    #[command(flatten)]
    pub perf: PerfArgs,
}

/// A byte count: digits with an optional K or M suffix (binary).
pub fn size(v: &str) -> Result<usize, String> {
    let (num, shift) = match v.as_bytes().last() {
        Some(b'K' | b'k') => (&v[..v.len() - 1], 10),
        Some(b'M' | b'm') => (&v[..v.len() - 1], 20),
        Some(b'G' | b'g') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{v:?} is not a size in bytes (digits, optionally followed by K, M or G)"))
}

/// OSU's `-m [MIN:]MAX`: the largest size, and the smallest if given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRange {
    /// MIN, when given.
    pub min: Option<usize>,
    /// MAX.
    pub max: usize,
}

/// Parses `-m [MIN:]MAX`.
pub fn size_range(v: &str) -> Result<SizeRange, String> {
    let r = match v.split_once(':') {
        Some((a, b)) => SizeRange { min: Some(size(a)?), max: size(b)? },
        None => SizeRange { min: None, max: size(v)? },
    };
    match r.min {
        Some(min) if min > r.max => Err(format!("the smallest size {min} is above the largest {}", r.max)),
        _ => Ok(r),
    }
}

/// A count of at least 1 (a timed iteration count of 0 would divide by zero).
pub fn at_least_one(v: &str) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(0) => Err("at least 1 is needed: results are averages over the timed iterations".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{v:?} is not a whole number")),
    }
}

/// A window of 1 to 65536 messages.
fn window(v: &str) -> Result<u64, String> {
    at_least_one(v).and_then(|n| if n <= 65536 { Ok(n) } else { Err(format!("{n} is more than 65536 messages in flight")) })
}

/// A comma-separated list of sizes (`8,1M,4M`).
pub fn size_list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',').map(|s| size(s.trim())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ranges_parse_as_osu_writes_them() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("64k"), Ok(64 << 10));
        assert_eq!(size("4M"), Ok(4 << 20));
        assert!(size("4X").unwrap_err().contains("\"4X\""));
        assert_eq!(size_range("4096"), Ok(SizeRange { min: None, max: 4096 }));
        assert_eq!(size_range("8:1M"), Ok(SizeRange { min: Some(8), max: 1 << 20 }));
        assert!(size_range("1M:8").unwrap_err().contains("above"));
        assert_eq!(size_list("8, 1M"), Ok(vec![8, 1 << 20]));
    }
}
