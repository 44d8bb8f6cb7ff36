//! `fmx-perf`: see `fmx-perf --help`. The point-to-point tests (latency, bw,
//! bibw), started alone, launch their own two ranks on this host, pinned to
//! different cores; under fmxrun, mpiexec or srun they use the given world
//! (ranks 0 and 1).

use std::process::ExitCode;

use clap::Parser;
use fmx_bench::cli::{Cli, Command, PerfArgs};
use fmx_bench::params::{Format, Params, Test};
use fmx_bench::report::{self, Writer};
use fmx_bench::{all, check_cost, compare, limits, meta, neighbor, neighbor_compare, ofi_compare, osu, peers, redistribute};

/// One rank of a point-to-point test.
fn run_rank(p: &Params) -> Result<(), String> {
    let e2s = |e: fmx::Error| e.to_string();
    let fmx = fmx::init().map_err(e2s)?;
    let world = fmx.world();
    if world.size() < 2 {
        return Err("fmx-perf needs at least 2 ranks".into());
    }
    let mut p = p.clone();
    if p.test == Test::MbwMr {
        if world.size() % 2 != 0 {
            return Err(format!("mbw_mr pairs ranks i and i + n/2, so it needs an even number of ranks; the world has {}", world.size()));
        }
        p.pairs = world.size() as usize / 2;
    }
    let p = &p;
    let core = peers::pin(world.rank());
    let meta = if p.format == Format::Json { meta::gather(&fmx, p, core)? } else { None };
    let mut out = if world.rank() == 0 {
        let header = report::header(p, world.transport_name(), world.transport_of(1).map_err(e2s)?, &world.large_message_path());
        Some(Writer::new(std::io::stdout().lock(), p, &header)?)
    } else {
        None
    };
    osu::run(&fmx, p, |row| out.as_mut().map_or(Ok(()), |w| w.row(row)))?;
    if let Some(w) = out {
        w.finish(meta.as_ref())?;
    }
    fmx.finalize().map_err(e2s)
}

/// A point-to-point test: under a launcher, measure; alone, start `ranks` of our own.
fn perf(test: Test, a: &PerfArgs, ranks: u32) -> Result<(), String> {
    let p = Params::from_args(test, a)?;
    if fmx::started_by_launcher() {
        run_rank(&p)
    } else {
        peers::launch_self(ranks, a.transport.clone())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Latency(a) => perf(Test::Latency, a, 2),
        Command::Bw(a) => perf(Test::Bw, a, 2),
        Command::Bibw(a) => perf(Test::Bibw, a, 2),
        Command::MbwMr(a) => perf(Test::MbwMr, &a.perf, 2 * a.pairs),
        Command::Limits(a) => limits::main(a),
        Command::All(a) => all::main(a),
        Command::Compare(a) => compare::main(a),
        Command::Neighbor(a) => neighbor::main(a),
        Command::NeighborCompare(a) => neighbor_compare::main(a),
        Command::OfiCompare(a) => ofi_compare::main(a),
        Command::CheckCost(a) => check_cost::main(a),
        Command::Redistribute(a) => redistribute::main(a),
        Command::RedistributeRank(a) => redistribute::rank_main(a),
        Command::CheckCostRank(a) => check_cost::rank_main(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fmx-perf: {e}");
            ExitCode::FAILURE
        }
    }
}
