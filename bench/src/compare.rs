//! `fmx-perf compare`: fmx and the MPI peers, side by side in one run.
//!
//! Builds `bench/peers/osu_peer.c` with `mpicc.mpich` and `mpicc.openmpi`
//! (Debian's mpich and openmpi-bin), runs the same OSU-methodology latency
//! and bandwidth sweeps under `mpiexec.hydra -bind-to core` and Open MPI
//! (`--mca pml ob1 --mca btl self,vader`, bound to cores), runs fmx-perf's
//! own two pinned ranks, and prints one table with the ratios. One run is
//! one sample on a shared machine (the same binary moves 2-3x with vCPU
//! placement), so every side runs `--reps` times, interleaved (fmx, MPICH,
//! Open MPI, fmx, ...), and each cell is the median with the range. Each
//! round also hands one cache line between two pinned cores (`fmx-perf
//! limits`), the floor the smallest latency is held against. With
//! `--update-readme FILE` the table replaces the block between
//! `<!-- perf-table:begin -->` and `<!-- perf-table:end -->`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::peers::Mpi;
use crate::report::parse_osu;
use crate::stats::spread;

/// Open MPI's shared-memory path.
pub(crate) const OMPI_SHM: [&str; 6] = ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"];

/// One OSU-methodology sweep of `mpi`'s peer: two ranks, bound to cores.
fn peer_sweep(mpi: Mpi, bin: &std::path::Path, test: &str, max: usize) -> Result<String, String> {
    let mut c = mpi.launcher()?;
    match mpi {
        Mpi::Mpich => c.args(["-n", "2", "-bind-to", "core"]),
        Mpi::OpenMpi => c.args(["-n", "2", "--bind-to", "core"]).args(OMPI_SHM),
    };
    crate::peers::run(c.arg(bin).args([test, &max.to_string()]))
}

/// Every run's figure per (test, size): (who, value), one entry per round.
type Table = BTreeMap<(&'static str, usize), Vec<(String, f64)>>;

/// Per (test, size), each side's (median, lowest, highest).
type Medians = BTreeMap<(&'static str, usize), Vec<(String, (f64, f64, f64))>>;

/// Per (test, size) and side: the median and range of its rounds, in the
/// order the sides first appear.
fn medians(table: &Table) -> Medians {
    table
        .iter()
        .map(|(k, vals)| {
            let mut who: Vec<&String> = Vec::new();
            for (w, _) in vals {
                if !who.contains(&w) {
                    who.push(w);
                }
            }
            let cells = who
                .into_iter()
                .map(|w| {
                    let v: Vec<f64> = vals.iter().filter(|(x, _)| x == w).map(|(_, v)| *v).collect();
                    (w.clone(), spread(&v))
                })
                .collect();
            (*k, cells)
        })
        .collect()
}

fn record(table: &mut Table, test: &'static str, who: &str, rows: &[(usize, f64)], sizes: &[usize]) {
    for &(size, value) in rows.iter().filter(|r| sizes.contains(&r.0)) {
        table.entry((test, size)).or_default().push((who.to_owned(), value));
    }
}

/// Options of `fmx-perf compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The sizes in the table (bytes; K and M suffixes)
    #[arg(long, value_name = "LIST", default_value = "8,1048576,4194304", value_parser = crate::cli::size_list)]
    pub sizes: std::vec::Vec<usize>,
    /// Replace the table between <!-- perf-table:begin --> and <!-- perf-table:end --> in FILE
    #[arg(long, value_name = "FILE")]
    pub update_readme: Option<PathBuf>,
    /// fmx alone, no MPI peers
    #[arg(long)]
    pub no_peers: bool,
    /// Take the peers' C sources (osu_peer.c, ...) from DIR instead of the copies inside fmx-perf
    #[arg(long, value_name = "DIR")]
    pub peer_src: Option<PathBuf>,
    /// Also draw every sweep (fmx and the peers, latency and bandwidth) into FILE (.svg, or .png through rsvg-convert)
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Instead: tail latency at the first of --sizes, perftest's statistics from per-iteration timings, fmx beside each peer
    #[arg(long)]
    pub tail: bool,
    /// One JSON document (metadata with the peers' versions, the table's rows with ratios, every sweep) instead of the table
    #[arg(long, conflicts_with_all = ["tail", "update_readme"])]
    pub json: bool,
    /// Instead: the message rate (mbw_mr, window 64) at the first of --sizes with 1 and 2 pairs, fmx beside each peer
    #[arg(long, conflicts_with_all = ["tail", "json"])]
    pub rate: bool,
    /// Interleaved runs per side (medians and ranges are shown)
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub reps: u64,
    /// Timed round trips per run for --tail
    #[arg(long, default_value_t = 20_000, value_parser = crate::cli::at_least_one)]
    pub tail_iterations: u64,
}

/// perftest's columns of one stats row: (t_typical, t_avg, p99, p99.9).
fn stats_row(out: &str, size: usize) -> Option<[f64; 4]> {
    out.lines().filter(|l| !l.trim_start().starts_with('#')).find_map(|l| {
        let v: Vec<f64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        (v.len() == 9 && v[0] as usize == size).then(|| [v[4], v[5], v[7], v[8]])
    })
}

/// `compare --tail`: per side, median [range] of t_typical, t_avg, p99 and p99.9.
fn tail(a: &Args) -> Result<(), String> {
    let size = a.sizes.first().copied().unwrap_or(8);
    let iters = a.tail_iterations.to_string();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut sides: Vec<(String, Vec<[f64; 4]>)> = vec![("fmx".into(), Vec::new())];
    let mut peers = Vec::new();
    for mpi in Mpi::ALL {
        match mpi.build("osu_peer", &["-Wno-stringop-overflow"]) {
            Ok(bin) => {
                peers.push((mpi, bin));
                sides.push((mpi.name().into(), Vec::new()));
            }
            Err(e) => println!("Not compared: {e}"),
        }
    }
    for _ in 0..a.reps {
        let out = crate::peers::run(Command::new(&exe).args([
            "latency",
            "-m",
            &format!("{size}:{size}"),
            "-i",
            &iters,
            "-x",
            "1000",
            "--stats",
        ]))?;
        sides[0].1.push(stats_row(&out, size).ok_or_else(|| format!("fmx-perf printed no stats row:\n{out}"))?);
        for (i, (mpi, bin)) in peers.iter().enumerate() {
            let mut c = mpi.launcher()?;
            match mpi {
                Mpi::Mpich => c.args(["-n", "2", "-bind-to", "core"]),
                Mpi::OpenMpi => c.args(["-n", "2", "--bind-to", "core"]).args(OMPI_SHM),
            };
            let out = crate::peers::run(c.arg(bin).args(["latency", &size.to_string(), &iters, "stats"]))?;
            sides[i + 1].1.push(stats_row(&out, size).ok_or_else(|| format!("{} printed no stats row:\n{out}", mpi.name()))?);
        }
    }
    let cell = |runs: &[[f64; 4]], k: usize| {
        let mut v: Vec<f64> = runs.iter().map(|r| r[k]).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let mut t = format!(
        "{size} B ping-pong, {iters} timed round trips per run, {} interleaved runs per side: median [range] in us, \
         half round trips timed one by one.\n\n| side | t_typical | t_avg | p99 | p99.9 | p99 vs fmx | p99.9 vs fmx |\n|---|---:|---:|---:|---:|---:|---:|\n",
        a.reps
    );
    let fmx_p = (cell(&sides[0].1, 2).0, cell(&sides[0].1, 3).0);
    for (name, runs) in &sides {
        t.push_str(&format!("| {name} |"));
        for k in 0..4 {
            let (m, lo, hi) = cell(runs, k);
            t.push_str(&format!(" {m:.2} [{lo:.2}-{hi:.2}] |"));
        }
        t.push_str(&format!(" {:.2}x | {:.2}x |\n", cell(runs, 2).0 / fmx_p.0, cell(runs, 3).0 / fmx_p.1));
    }
    t.push_str("\nA ratio above 1 means the side's tail is longer than fmx's.\n");
    print!("{t}");
    if let Some(path) = &a.update_readme {
        crate::report::update_readme(path, "tail-table", &t)?;
    }
    Ok(())
}

/// Entry point of `fmx-perf compare`.
pub fn main(a: &Args) -> Result<(), String> {
    let (sizes, readme, peers) = (a.sizes.clone(), a.update_readme.clone(), !a.no_peers);
    if let Some(d) = &a.peer_src {
        crate::peers::set_peer_src(d.clone());
    }
    if a.tail {
        return tail(a);
    }
    if a.rate {
        return crate::compare_rate::main(a);
    }
    let max = sizes.iter().copied().max().unwrap_or(8).next_power_of_two();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut table = Table::new();
    let mut names = vec!["fmx".to_owned()];
    // Every sweep, for --plot: (who, test, rows) of the first round.
    let mut curves: Vec<(String, &str, Vec<(usize, f64)>)> = Vec::new();
    let mut missing = Vec::new();
    let mut versions = Vec::new();
    let mut built = Vec::new();
    if peers {
        for mpi in Mpi::ALL {
            // A peer that is not installed is listed with the reason; the others still run.
            match mpi.build("osu_peer", &["-Wno-stringop-overflow"]) {
                Ok(b) => {
                    built.push((mpi, b));
                    names.push(mpi.name().to_owned());
                    versions.push((mpi.name().to_owned(), mpi.version()));
                }
                Err(e) => missing.push(e),
            }
        }
    }
    let mut handoffs = Vec::new();
    let steps = a.reps as usize * (2 * (1 + built.len()) + 1);
    let mut progress = crate::progress::Progress::for_steps(steps, "fmx-perf compare");
    for round in 0..a.reps {
        for test in ["latency", "bw"] {
            progress.step(format!("round {} of {}: fmx {test}", round + 1, a.reps));
            let out = crate::peers::run(Command::new(&exe).args([test, "--max-size", &max.to_string()]))?;
            record(&mut table, test, "fmx", &parse_osu(&out), &sizes);
            if round == 0 {
                curves.push(("fmx".into(), test, parse_osu(&out)));
            }
            progress.inc();
        }
        for (mpi, bin) in &built {
            for test in ["latency", "bw"] {
                progress.step(format!("round {} of {}: {} {test}", round + 1, a.reps, mpi.name()));
                let rows = parse_osu(&peer_sweep(*mpi, bin, test, max)?);
                progress.inc();
                record(&mut table, test, mpi.name(), &rows, &sizes);
                if round == 0 {
                    curves.push((mpi.name().into(), test, rows));
                }
            }
        }
        progress.step(format!("round {} of {}: the cache-line floor", round + 1, a.reps));
        let budget = Some(std::time::Duration::from_millis(300));
        handoffs.extend((0..3).map(|_| crate::limits::handoff_ns_within(100_000, budget)));
        progress.inc();
    }
    drop(progress);
    let med = medians(&table);
    if a.json {
        print!("{}", json_report(&med, &names, &versions, &missing, &curves)?.to_json()?);
        println!();
        return plot_if_asked(a, &curves);
    }
    let mut text = render(&med, &names, a.reps);
    text.push_str(&against_targets(&med, &names, &handoffs));
    if !versions.is_empty() {
        let peers: Vec<String> = versions.iter().map(|(n, v)| format!("{n} {v}")).collect();
        text.push_str(&format!("\nPeers: {}; fmx {}.\n", peers.join(", "), crate::cli::VERSION));
    }
    for m in &missing {
        text.push_str(&format!("\nNot compared: {m}\n"));
    }
    print!("{text}");
    plot_if_asked(a, &curves)?;
    if let Some(path) = readme {
        crate::report::update_readme(&path, "perf-table", &text)?;
    }
    Ok(())
}

/// Every sweep: (who, test, rows).
type Curves<'a> = [(String, &'a str, Vec<(usize, f64)>)];

/// `--plot FILE`: every sweep, latency and bandwidth.
fn plot_if_asked(a: &Args, curves: &Curves<'_>) -> Result<(), String> {
    use crate::plot::{plot, Series};
    let Some(path) = &a.plot else { return Ok(()) };
    let of = |test: &str| -> Vec<Series> { curves.iter().filter(|c| c.1 == test).map(|c| Series::new(c.0.clone(), &c.2)).collect() };
    plot(path, &format!("fmx-perf compare on {} ({})", crate::meta::hostname(), crate::cli::VERSION), &of("latency"), &of("bw"))
}

/// The comparison as `--json`'s document.
fn json_report(
    med: &Medians,
    names: &[String],
    versions: &[(String, String)],
    missing: &[String],
    curves: &Curves<'_>,
) -> Result<crate::compare_json::Report, String> {
    use crate::compare_json::{ratio, Meta, Peer, Report, Row, Sweep};
    // Each side's median over the rounds.
    let results = med
        .iter()
        .filter_map(|(&(test, size), vals)| {
            let fmx = vals.iter().find(|(w, _)| w == "fmx")?.1 .0;
            let fmx_ratio = names[1..]
                .iter()
                .filter_map(|p| vals.iter().find(|(w, _)| w == p).map(|(_, v)| (p.clone(), ratio(test, fmx, v.0))))
                .collect();
            let unit = if test == "latency" { "us" } else { "MB/s" };
            Some(Row { test, size, unit, values: vals.iter().map(|(w, v)| (w.clone(), v.0)).collect(), fmx_ratio })
        })
        .collect();
    Ok(Report {
        meta: Meta {
            tool: "fmx-perf compare",
            fmx_version: env!("CARGO_PKG_VERSION"),
            git: env!("FMX_GIT_HASH"),
            host: crate::meta::hostname(),
            date: crate::meta::rfc3339_now(),
            peers: versions.iter().map(|(n, v)| Peer { name: n.clone(), version: v.clone() }).collect(),
            not_compared: missing.to_vec(),
            ratios: "above 1 means fmx is better: peer latency / fmx latency, fmx bandwidth / peer bandwidth",
        },
        results,
        sweeps: curves
            .iter()
            .map(|(who, test, rows)| Sweep {
                who: who.clone(),
                test: if *test == "latency" { "latency" } else { "bw" },
                points: rows.clone(),
            })
            .collect(),
    })
}

fn render(med: &Medians, names: &[String], reps: u64) -> String {
    let peers = &names[1..];
    let mut s = format!("{reps} interleaved runs per side: median [range].\n\n| test | size | fmx |");
    for p in peers {
        s.push_str(&format!(" {p} | fmx vs {p} |"));
    }
    s.push_str("\n|---|---:|---:|");
    for _ in peers {
        s.push_str("---:|---:|");
    }
    s.push('\n');
    let cell = |(m, lo, hi): (f64, f64, f64)| format!("{m:.2} [{lo:.2}-{hi:.2}]");
    for (&(test, size), vals) in med {
        let get = |who: &str| vals.iter().find(|(w, _)| w == who).map(|v| v.1);
        let unit = if test == "latency" { "us" } else { "MB/s" };
        let Some(f) = get("fmx") else { continue };
        s.push_str(&format!("| {test} ({unit}) | {} | {} |", human(size), cell(f)));
        for p in peers {
            match get(p) {
                // Ratio > 1 means fmx is better: peer/fmx for latency, fmx/peer for bandwidth (medians).
                Some(v) => {
                    let ratio = if test == "latency" { v.0 / f.0 } else { f.0 / v.0 };
                    s.push_str(&format!(" {} | {ratio:.2}x |", cell(v)));
                }
                None => s.push_str(" – | – |"),
            }
        }
        s.push('\n');
    }
    s.push_str("\nRatios above 1 mean fmx is better (peer latency / fmx latency; fmx bandwidth / peer bandwidth), of the medians.\n");
    s
}

/// The smallest size's latency against issue 21's two targets: at most 0.9x
/// the better peer's, and at most 3x one cache-line handoff (the best of
/// this comparison's rounds: a floor is what the hardware can do).
fn against_targets(med: &Medians, names: &[String], handoffs: &[f64]) -> String {
    let Some(((_, size), vals)) = med.iter().find(|((t, _), _)| *t == "latency") else { return String::new() };
    let Some(fmx) = vals.iter().find(|(w, _)| w == "fmx").map(|v| v.1 .0) else { return String::new() };
    let mut s = String::new();
    let best = names[1..].iter().filter_map(|p| vals.iter().find(|(w, _)| w == p)).min_by(|a, b| a.1 .0.total_cmp(&b.1 .0));
    let met = |ok: bool| if ok { "met" } else { "not met" };
    if let Some((who, v)) = best {
        let r = fmx / v.0;
        s.push_str(&format!(
            "\n{} latency: fmx {fmx:.2} us is {r:.2}x the better peer's ({who}, {:.2} us); target at most 0.9x: {}.\n",
            human(*size),
            v.0,
            met(r <= 0.9)
        ));
    }
    if let Some(floor) = handoffs.iter().copied().min_by(f64::total_cmp) {
        let r = fmx * 1000.0 / floor;
        let (m, _, hi) = spread(handoffs);
        s.push_str(&format!(
            "{} latency: fmx is {r:.2}x one cache-line handoff between cores 0 and 1 ({floor:.1} ns, the best of {} runs; median \
             {m:.1}, worst {hi:.1}); target at most 3x: {}.\n",
            human(*size),
            handoffs.len(),
            met(r <= 3.0)
        ));
    }
    s
}

fn human(size: usize) -> String {
    if size >= 1 << 20 && size % (1 << 20) == 0 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size % (1 << 10) == 0 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}
