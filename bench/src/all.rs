//! `fmx-perf all`: latency, bw, bibw, mbw_mr and the floor (limits) in one
//! run and one report, ending with fmx's distance from the floor. Each test
//! runs as its own child of this binary, so each has its own ranks.

use std::process::Command;

use crate::cli::{size_range, SizeRange};
use crate::report::parse_osu;

/// Options of `fmx-perf all`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Message sizes: MAX, or MIN:MAX
    #[arg(short = 'm', long = "message-size", value_name = "[MIN:]MAX", default_value = "1:4M", value_parser = size_range)]
    pub sizes: SizeRange,
    /// Timed iterations for every size, and the cache-line round trips of limits (default: OSU's per test)
    #[arg(short = 'i', long = "iterations", value_name = "N", value_parser = crate::cli::at_least_one)]
    pub iterations: Option<u64>,
    /// The transport of the ranks
    #[arg(long, value_name = "NAME")]
    pub transport: Option<String>,
    /// Also draw latency and bandwidth against size, with the floor, into FILE (.svg, or .png through rsvg-convert)
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
}

/// Runs `fmx-perf ARGS` and returns its output.
fn child(args: &[String]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    crate::peers::run(Command::new(exe).args(args))
}

/// The value at `size` in OSU-format output.
fn at(rows: &[(usize, f64)], size: usize) -> Option<f64> {
    rows.iter().find(|r| r.0 == size).map(|r| r.1)
}

/// Entry point of `fmx-perf all`.
pub fn main(a: &Args) -> Result<(), String> {
    let range = format!("{}:{}", a.sizes.min.unwrap_or(1), a.sizes.max);
    let mut common = vec!["-m".to_owned(), range.clone()];
    if let Some(i) = a.iterations {
        common.extend(["-i".to_owned(), i.to_string()]);
    }
    if let Some(t) = &a.transport {
        common.extend(["--transport".to_owned(), t.clone()]);
    }
    let mut outputs = Vec::new();
    let mut progress = crate::progress::Progress::for_steps(5, "fmx-perf all");
    for test in ["latency", "bw", "bibw", "mbw_mr"] {
        let mut args = vec![test.to_owned()];
        args.extend(common.iter().cloned());
        progress.step(test.to_owned());
        let out = child(&args)?;
        progress.inc();
        println!("{out}");
        outputs.push((test, parse_osu(&out)));
    }
    let mut args = vec!["limits".to_owned(), "-m".to_owned(), range];
    if let Some(i) = a.iterations {
        args.extend(["-i".to_owned(), i.to_string()]);
    }
    progress.step("limits".to_owned());
    let limits = child(&args)?;
    drop(progress);
    println!("{limits}");
    let handoff_ns = limits
        .lines()
        .find_map(|l| l.strip_prefix("# core-to-core cache-line handoff (cores 0 and 1): "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or("fmx-perf limits printed no cache-line handoff")?;
    let memcpy = parse_osu(&limits);
    // fmx against the floor: the smallest size's latency against one handoff,
    // the largest size's bandwidth against memcpy of that size.
    let (small, large) = (a.sizes.min.unwrap_or(1).max(1).next_power_of_two(), a.sizes.max);
    let large = memcpy.iter().map(|r| r.0).filter(|&s| s <= large).max().unwrap_or(large);
    let mut t =
        String::from("# fmx against the floor of this host\n| test | size | fmx | floor | fmx / floor |\n|---|---:|---:|---:|---:|\n");
    if let Some(lat) = at(&outputs[0].1, small) {
        let floor = handoff_ns / 1000.0;
        t.push_str(&format!("| latency (us) | {small} B | {lat:.3} | {floor:.3} (one cache-line handoff) | {:.2}x |\n", lat / floor));
    }
    for (i, name) in [(1, "bw"), (2, "bibw")] {
        if let (Some(v), Some(m)) = (at(&outputs[i].1, large), at(&memcpy, large)) {
            t.push_str(&format!("| {name} (MB/s) | {large} B | {v:.0} | {m:.0} (memcpy) | {:.2}x |\n", v / m));
        }
    }
    print!("{t}");
    if let Some(path) = &a.plot {
        use crate::plot::{plot, Series};
        let floor: Vec<(usize, f64)> = outputs[0].1.iter().map(|r| (r.0, handoff_ns / 1000.0)).collect();
        let latency = [Series::new("fmx latency", &outputs[0].1), Series::new("one cache-line handoff (floor)", &floor)];
        let bandwidth = [
            Series::new("fmx bw", &outputs[1].1),
            Series::new("fmx bibw", &outputs[2].1),
            Series::new("fmx mbw_mr", &outputs[3].1),
            Series::new("memcpy (floor)", &memcpy),
        ];
        let title = format!("fmx-perf all on {} ({})", crate::meta::hostname(), crate::cli::VERSION);
        plot(path, &title, &latency, &bandwidth)?;
        eprintln!("fmx-perf all: plot written to {}", path.display());
    }
    Ok(())
}
