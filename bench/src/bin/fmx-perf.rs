//! `fmx-perf latency|bw|bibw [options]` and `fmx-perf compare [options]`.
//!
//! Started alone, it launches its own two ranks on this host, pinned to
//! different cores; under fmxrun it uses the given world (ranks 0 and 1).

use std::process::ExitCode;

use fmx_bench::params::{Params, Test};
use fmx_bench::peers::pin;
use fmx_bench::{check_cost, compare, neighbor, neighbor_compare, ofi_compare, osu, redistribute, report};

const USAGE: &str = "usage:
  fmx-perf latency|bw|bibw [--min-size B] [--max-size B] [--iters N] [--warmup N] [--window N] [--json] [--plain] [--transport NAME]
  fmx-perf compare [--sizes 8,1048576,4194304] [--update-readme FILE] [--no-peers]
  fmx-perf neighbor [--np N] [--ks 1,64,4096,65536]        (alone: N local ranks, default 2; or under fmxrun/mpiexec/srun)
  fmx-perf neighbor-compare [--ranks 2,4] [--ks ...] [--update-readme FILE]
  fmx-perf ofi-compare [--provider tcp;ofi_rxm] [--domain lo] [--server 127.0.0.1] [--sizes 8,1048576] [--iters N] [--reps 3] [--update-readme FILE]
                       (needs the `ofi` feature: cargo run --release --features fmx-bench/ofi --bin fmx-perf -- ofi-compare)
  fmx-perf check-cost [--np 4] [--sizes 8,1048576] [--iters 2000] [--reps 5] [--update-readme FILE]
                       (allreduce with and without FMX_CHECK=collectives, interleaved jobs)";

fn size_arg(v: Option<String>, what: &str) -> Result<usize, String> {
    let v = v.ok_or_else(|| format!("{what} needs a value"))?;
    let (num, mul) = match v.as_bytes().last() {
        Some(b'K' | b'k') => (&v[..v.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&v[..v.len() - 1], 1 << 20),
        _ => (&v[..], 1),
    };
    num.parse::<usize>().map(|n| n * mul).map_err(|_| format!("{what}: {v:?} is not a size"))
}

fn parse(args: &[String]) -> Result<(Params, Option<String>), String> {
    let test = args.first().and_then(|t| Test::parse(t)).ok_or_else(|| USAGE.to_owned())?;
    let mut p = Params::new(test);
    let mut transport = None;
    let mut it = args[1..].iter().cloned();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--min-size" | "-m" => p.min_size = size_arg(it.next(), "--min-size")?,
            "--max-size" | "-M" => p.max_size = size_arg(it.next(), "--max-size")?,
            "--iters" | "-i" => p.iters = Some(size_arg(it.next(), "--iters")?),
            "--warmup" | "-x" => p.warmup = Some(size_arg(it.next(), "--warmup")?),
            "--window" | "-W" => p.window = size_arg(it.next(), "--window")?.max(1),
            "--json" => p.json = true,
            "--plain" => p.plain = true,
            "--transport" => transport = Some(it.next().ok_or("--transport needs a name")?),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if p.min_size > p.max_size {
        return Err(format!("--min-size {} is above --max-size {}", p.min_size, p.max_size));
    }
    Ok((p, transport))
}

fn run_rank(p: &Params) -> Result<(), String> {
    let fmx = fmx::init().map_err(|e| e.to_string())?;
    let world = fmx.world();
    if world.size() < 2 {
        return Err("fmx-perf needs at least 2 ranks".into());
    }
    pin(world.rank());
    let rows = osu::run(&fmx, p).map_err(|e| e.to_string())?;
    if world.rank() == 0 {
        let tp = world.transport_name();
        if p.json {
            print!("{}", report::json(p.test, tp, &rows));
        } else {
            print!("{}", report::osu_header(p.test, tp));
            // Under shm+verbs or shm+ofi, which half carries this pair.
            println!("# rank 0 to rank 1: {}", world.transport_of(1).map_err(|e| e.to_string())?);
            println!("# large messages: {}", world.large_message_path());
            // Like perftest (and OSU under an MPI registration cache), buffers are registered once.
            println!(
                "# buffers: {}",
                if p.plain { "plain Vec (registered per operation or bounced)" } else { "registered once (Fmx::alloc_registered)" }
            );
            for r in &rows {
                print!("{}", report::osu_line(r));
            }
        }
    }
    fmx.finalize().map_err(|e| e.to_string())
}

/// `fmx-perf neighbor`: under a launcher, measure; alone, start `--np` local ranks.
fn neighbor_main(args: &[String]) -> Result<(), String> {
    let mut np = 2u32;
    let mut ks: Vec<usize> = neighbor::KS.to_vec();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--np" => np = it.next().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).ok_or("--np needs a rank count")?,
            "--ks" => {
                let v = it.next().ok_or("--ks needs a list")?;
                ks = v.split(',').map(|s| s.trim().parse().map_err(|_| format!("--ks: bad value {s:?}"))).collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    let launched = ["FMX_RANK", "PMI_FD"].iter().any(|v| std::env::var_os(v).is_some());
    if !launched {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut l = fmx_launcher::Launch::new(np, exe);
        l.args = args.iter().map(Into::into).collect();
        let o = l.run().map_err(|e| e.to_string())?;
        return if o.code == 0 { Ok(()) } else { Err(format!("the benchmark ranks failed (exit code {})", o.code)) };
    }
    let fmx = fmx::init().map_err(|e| e.to_string())?;
    pin(fmx.world().rank());
    let rows = neighbor::run(&fmx, &ks).map_err(|e| e.to_string())?;
    if fmx.world().rank() == 0 {
        print!("{}", neighbor::render(&rows, fmx.world().size(), fmx.world().transport_name()));
    }
    fmx.finalize().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Subcommands with their own options.
    let sub: Option<(&str, fn(&[String]) -> Result<(), String>)> = match args.first().map(String::as_str) {
        Some("compare") => Some(("compare", |a| compare::main(&a[1..]))),
        Some("neighbor-compare") => Some(("neighbor-compare", |a| neighbor_compare::main(&a[1..]))),
        Some("ofi-compare") => Some(("ofi-compare", |a| ofi_compare::main(&a[1..]))),
        Some("neighbor") => Some(("neighbor", neighbor_main)),
        Some("redistribute") => Some(("redistribute", |a| redistribute::main(&a[1..]))),
        Some("redistribute-rank") => Some(("redistribute-rank", |a| redistribute::rank_main(&a[1..]))),
        Some("check-cost") => Some(("check-cost", |a| check_cost::main(&a[1..]))),
        Some("check-cost-rank") => Some(("check-cost-rank", |a| check_cost::rank_main(&a[1..]))),
        _ => None,
    };
    if let Some((name, run)) = sub {
        return match run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fmx-perf {name}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let (p, transport) = match parse(&args) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let under_launcher = std::env::var_os("FMX_RANK").is_some();
    let r = if under_launcher {
        run_rank(&p)
    } else {
        // Started alone: launch our own two ranks.
        std::env::current_exe().map_err(|e| e.to_string()).and_then(|exe| {
            let mut l = fmx_launcher::Launch::new(2, exe);
            l.args = args.iter().map(Into::into).collect();
            l.transport = transport;
            let o = l.run().map_err(|e| e.to_string())?;
            if o.code == 0 {
                Ok(())
            } else {
                Err(format!("the benchmark ranks failed (exit code {})", o.code))
            }
        })
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fmx-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
