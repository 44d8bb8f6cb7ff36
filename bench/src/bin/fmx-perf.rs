//! `fmx-perf`: see `fmx-perf --help`. The point-to-point tests (latency, bw,
//! bibw), started alone, launch their own two ranks on this host, pinned to
//! different cores; under fmxrun, mpiexec, srun or mpirun they use the given
//! world (`--pair A,B`, by default rank 0 and the first rank on another node).

use std::process::ExitCode;

use clap::Parser;
use fmx_bench::cli::{Cli, Command, PerfArgs};
use fmx_bench::params::{Format, Params, Test};
use fmx_bench::report::{self, Writer};
use fmx_bench::{
    all, check_cost, compare, limits, meta, neighbor, neighbor_compare, ofi_compare, osu, pair, peers, redistribute, scale_model, set_up,
};

/// One rank of a point-to-point test: the world split so that the pair
/// measuring (`--pair`, or rank 0 and the first rank on another node) are
/// ranks 0 and 1 (`mbw_mr`: ranks by node, pairs across nodes).
fn run_rank(p: &Params) -> Result<(), String> {
    let e2s = |e: fmx::Error| e.to_string();
    let fmx = fmx::init().map_err(e2s)?;
    let world = fmx.world();
    let mut p = p.clone();
    if p.test == Test::MbwMr {
        if world.size() < 2 || world.size() % 2 != 0 {
            return Err(format!(
                "mbw_mr streams from one half of the world to the other, so it needs an even number of ranks; the world has {}",
                world.size()
            ));
        }
        p.pairs = world.size() as usize / 2;
    }
    let p = &p;
    let mut nodes = vec![0u32; world.size() as usize];
    world.allgather(&[fmx.locality().node], &mut nodes).map_err(e2s)?;
    // The world split so that the measuring ranks lead (mbw_mr: by node, so
    // that its pairs cross nodes where there are several).
    let order = pair::streaming_order(&nodes);
    let (pair, key) = if p.test == Test::MbwMr {
        (order.get(..2).map_or((0, 1), |o| (o[0], o[1])), order.iter().position(|&r| r == world.rank()).unwrap_or(0) as i32)
    } else {
        let pair = pair::choose(p.pair, &nodes)?;
        (pair, pair::key(world.rank(), pair))
    };
    let comm = world.split(Some(0), key).map_err(e2s)?.ok_or("split of the world returned no communicator")?;
    let core = peers::pin(world.rank());
    let meta = if p.format == Format::Json { meta::gather(&comm, p, core, pair)? } else { None };
    // Connection set-up apart from the steady state: one 8 B round trip
    // before anything timed. Connected on demand, it is what connects the
    // pair; its time is reported on its own, and no warm-up iteration absorbs it.
    let first = if p.test == Test::MbwMr { None } else { set_up::first_round_trip(&fmx, &comm, pair)? };
    let mut out = if comm.rank() == 0 {
        let (a, b) = pair;
        let route = if p.test == Test::MbwMr {
            format!("streams (world rank, node): {}", pair::describe_streams(&order, &nodes))
        } else {
            format!(
                "rank {a} (node {}) to rank {b} (node {}): {}",
                nodes[a as usize],
                nodes[b as usize],
                comm.transport_of(1).map_err(e2s)?
            )
        };
        let set_up = match first {
            _ if p.test == Test::MbwMr => "any connection is made before the timed loops (mbw_mr warms up every pair)".to_owned(),
            Some(f) => set_up::line(&fmx, &comm, pair, f)?,
            None => String::new(),
        };
        let header = report::header(p, world.transport_name(), &route, &set_up, &world.large_message_path());
        Some(Writer::new(std::io::stdout().lock(), p, &header)?)
    } else {
        None
    };
    osu::run(&fmx, &comm, p, |row| out.as_mut().map_or(Ok(()), |w| w.row(row)))?;
    if let Some(w) = out {
        w.finish(meta.as_ref())?;
    }
    drop(comm);
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
        Command::ScaleModel(a) => scale_model::main(a),
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
