//! `fmx-perf check-cost`: what `FMX_CHECK=collectives` costs an allreduce.
//! Jobs of `--np` ranks (default 4) alternate without and with the checking
//! mode, `--reps` times each (default 5), in one run; each job times
//! `--iters` allreduces of `u64`s per size (after a warm-up) on rank 0 and
//! prints the mean. The table gives, per size, the median and range over the
//! jobs of each mode and the ratio of the medians. With `--update-readme
//! FILE` it replaces the block between `<!-- check-cost-table:begin -->` and
//! `<!-- check-cost-table:end -->`.

use std::time::Instant;

use fmx::Op;

/// One job's rank (`fmx-perf check-cost-rank ITERS SIZE...`, under fmxrun).
pub fn rank_main(a: &RankArgs) -> Result<(), String> {
    let args = &a.args;
    let iters: usize = args.first().and_then(|v| v.parse().ok()).ok_or("usage: check-cost-rank ITERS BYTES...")?;
    let sizes: Vec<usize> = args[1..].iter().map(|v| v.parse().map_err(|_| format!("size {v:?}"))).collect::<Result<_, _>>()?;
    let fmx = fmx::init().map_err(|e| e.to_string())?;
    let w = fmx.world();
    crate::peers::pin(w.rank());
    let e2s = |e: fmx::Error| e.to_string();
    for &bytes in &sizes {
        let n = (bytes / 8).max(1);
        let (send, mut recv) = (vec![1u64; n], vec![0u64; n]);
        let iters = if bytes > 64 << 10 { (iters / 20).max(5) } else { iters };
        for _ in 0..iters / 10 + 1 {
            w.allreduce(&send, &mut recv, Op::Sum).map_err(e2s)?;
        }
        w.barrier().map_err(e2s)?;
        let t = Instant::now();
        for _ in 0..iters {
            w.allreduce(&send, &mut recv, Op::Sum).map_err(e2s)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        if recv[0] != u64::from(w.size()) {
            return Err(format!("allreduce gave {} on {} ranks", recv[0], w.size()));
        }
        if w.rank() == 0 {
            println!("COST {bytes} {us:.3}");
        }
    }
    fmx.finalize().map_err(e2s)
}

/// Median and range of `v` (sorted in place).
fn stats(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Options of `fmx-perf check-cost`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Ranks per job
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    np: u32,
    /// Allreduce sizes in bytes (K and M suffixes)
    #[arg(long, value_name = "LIST", default_value = "8,1048576", value_parser = crate::cli::size_list)]
    sizes: std::vec::Vec<usize>,
    /// Timed allreduces per size (a twentieth above 64 KiB)
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Jobs per mode, interleaved
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Replace the table between <!-- check-cost-table:begin --> and <!-- check-cost-table:end --> in FILE
    #[arg(long, value_name = "FILE")]
    update_readme: Option<std::path::PathBuf>,
}

/// The hidden rank subcommand's arguments, passed through as its parent wrote them.
#[derive(clap::Args, Debug)]
pub struct RankArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Entry point of `fmx-perf check-cost`.
pub fn main(a: &Args) -> Result<(), String> {
    let (np, sizes, iters, reps, readme) = (a.np, a.sizes.clone(), a.iters as usize, a.reps as usize, a.update_readme.clone());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // [mode][size] -> microseconds per allreduce, one per job.
    let mut got = vec![vec![Vec::new(); sizes.len()]; 2];
    for _ in 0..reps {
        for (mode, check) in [(0, "off"), (1, "collectives")] {
            let mut l = fmx_launcher::Launch::new(np, &exe);
            l.args = ["check-cost-rank".to_string(), iters.to_string()]
                .into_iter()
                .chain(sizes.iter().map(ToString::to_string))
                .map(Into::into)
                .collect();
            l.env = vec![("FMX_CHECK".into(), check.into())];
            l.capture = true;
            let o = l.run().map_err(|e| e.to_string())?;
            if o.code != 0 {
                return Err(format!("a job with FMX_CHECK={check} failed ({}): {:?}", o.code, o.lines));
            }
            for (_, _, line) in o.lines.iter().filter(|(r, e, _)| *r == 0 && !e) {
                let mut w = line.split_whitespace();
                if let (Some("COST"), Some(b), Some(us)) = (w.next(), w.next(), w.next()) {
                    let i = sizes.iter().position(|s| s.to_string() == b).ok_or("unexpected size")?;
                    got[mode][i].push(us.parse::<f64>().map_err(|e| e.to_string())?);
                }
            }
        }
    }
    let mut table = format!(
        "allreduce of u64 on {np} ranks, us per call: median (range) of {reps} jobs each, interleaved off/on\n\n\
         | bytes | FMX_CHECK off | FMX_CHECK=collectives | ratio |\n|---|---|---|---|\n"
    );
    for (i, b) in sizes.iter().enumerate() {
        let (off, off_lo, off_hi) = stats(&mut got[0][i]);
        let (on, on_lo, on_hi) = stats(&mut got[1][i]);
        table.push_str(&format!("| {b} | {off:.2} ({off_lo:.2}-{off_hi:.2}) | {on:.2} ({on_lo:.2}-{on_hi:.2}) | {:.2}x |\n", on / off));
    }
    print!("{table}");
    if let Some(f) = readme {
        crate::report::update_readme(&f, "check-cost-table", &table)?;
    }
    Ok(())
}
