//! `fmx-perf neighbor-compare`: `fmx-perf neighbor` beside MPICH's and Open
//! MPI's `MPI_Neighbor_alltoallv` on the same torus and rank counts, in one
//! run of `--reps` interleaved rounds (fmx, MPICH, Open MPI, again), each
//! cell the median and range of its rounds; with `--update-readme FILE` the table replaces the block between
//! `<!-- neighbor-table:begin -->` and `<!-- neighbor-table:end -->`.

use std::process::Command;

use crate::peers::Mpi;
use crate::stats::spread;

use crate::neighbor::{parse, NeighborRow, KS};

/// `k us` rows of a peer.
fn parse_peer(text: &str) -> Vec<(usize, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect()
}

fn peer(mpi: Mpi, n: u32, ks: &str) -> Result<Vec<(usize, f64)>, String> {
    let np = n.to_string();
    let bin = mpi.build("neighbor_peer", &[])?;
    let mut c = mpi.launcher()?;
    match mpi {
        Mpi::Mpich => c.args(["-n", &np, "-bind-to", "core"]),
        Mpi::OpenMpi => c.args(["--oversubscribe", "-n", &np, "--bind-to", "core:overload-allowed"]).args(crate::compare::OMPI_SHM),
    };
    Ok(parse_peer(&crate::peers::run(c.arg(bin).arg(ks))?))
}

/// Options of `fmx-perf neighbor-compare`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rank counts, one job per count and side
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = [2u32, 4])]
    ranks: Vec<u32>,
    /// Doubles per neighbour
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = KS.to_vec())]
    ks: Vec<usize>,
    /// Rounds: every side runs once per round (fmx, MPICH, Open MPI, then again); each cell is the median and range
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Replace the table between <!-- neighbor-table:begin --> and <!-- neighbor-table:end --> in FILE
    #[arg(long, value_name = "FILE")]
    update_readme: Option<std::path::PathBuf>,
}

/// One (ranks, k)'s figures over the rounds: fmx persistent, fmx
/// `neighbor_alltoallv`, MPICH, Open MPI (microseconds per exchange).
#[derive(Default)]
struct Runs([Vec<f64>; 4]);

/// Entry point of `fmx-perf neighbor-compare`.
pub fn main(a: &Args) -> Result<(), String> {
    let (ranks, ks, readme) = (&a.ranks, &a.ks, &a.update_readme);
    let ks_arg = ks.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut runs: std::collections::BTreeMap<(u32, usize), Runs> = std::collections::BTreeMap::new();
    for round in 0..a.reps {
        for &n in ranks {
            eprintln!("# neighbor-compare: round {} of {}, {n} ranks", round + 1, a.reps);
            let fmx: Vec<NeighborRow> =
                parse(&crate::peers::run(Command::new(&exe).args(["neighbor", "--np", &n.to_string(), "--ks", &ks_arg]))?);
            let mpich = peer(Mpi::Mpich, n, &ks_arg)?;
            let ompi = peer(Mpi::OpenMpi, n, &ks_arg)?;
            for r in &fmx {
                let cell = runs.entry((n, r.k)).or_default();
                cell.0[0].push(r.persistent);
                cell.0[1].push(r.blocking);
                for (side, peer) in [(2, &mpich), (3, &ompi)] {
                    if let Some(v) = peer.iter().find(|x| x.0 == r.k) {
                        cell.0[side].push(v.1);
                    }
                }
            }
        }
    }
    let text = render(&runs, a.reps);
    print!("{text}");
    if let Some(path) = readme {
        crate::report::update_readme(path, "neighbor-table", &text)?;
    }
    Ok(())
}

/// The table: each cell the median [range] of its rounds; the ratio of the
/// medians (the faster MPI's over fmx's persistent exchange).
fn render(runs: &std::collections::BTreeMap<(u32, usize), Runs>, reps: u64) -> String {
    let mut text = format!(
        "{reps} interleaved runs per side (fmx, MPICH, Open MPI, again): median [range], us per exchange.\n\n\
         | ranks | k | fmx persistent | fmx neighbor_alltoallv | MPICH | Open MPI | best peer / fmx persistent |\n|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let show = |v: &[f64]| {
        if v.is_empty() {
            "–".to_string()
        } else {
            let (m, lo, hi) = spread(v);
            format!("{m:.2} [{lo:.2}-{hi:.2}]")
        }
    };
    for (&(n, k), r) in runs {
        let median = |v: &[f64]| (!v.is_empty()).then(|| spread(v).0);
        let best = [median(&r.0[2]), median(&r.0[3])].into_iter().flatten().fold(f64::INFINITY, f64::min);
        let ratio = median(&r.0[0]).map_or("–".to_string(), |p| format!("{:.2}x", best / p));
        text.push_str(&format!(
            "| {n} | {k} | {} | {} | {} | {} | {ratio} |\n",
            show(&r.0[0]),
            show(&r.0[1]),
            show(&r.0[2]),
            show(&r.0[3])
        ));
    }
    text.push_str("\nAbove 1 means fmx's persistent exchange is faster than the faster MPI (medians).\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_the_median_and_range_of_its_rounds_and_the_ratio_of_medians() {
        let mut runs = std::collections::BTreeMap::new();
        runs.insert((2, 1), Runs([vec![1.0, 3.0, 2.0], vec![5.0, 4.0, 6.0], vec![9.0, 8.0, 7.0], vec![4.0, 6.0, 5.0]]));
        runs.insert((4, 1), Runs([vec![2.0], vec![2.0], vec![], vec![3.0]]));
        let t = render(&runs, 3);
        assert!(t.contains("| 2 | 1 | 2.00 [1.00-3.00] | 5.00 [4.00-6.00] | 8.00 [7.00-9.00] | 5.00 [4.00-6.00] | 2.50x |"), "{t}");
        // A peer that gave no figure is a dash; the ratio takes the other.
        assert!(t.contains("| 4 | 1 | 2.00 [2.00-2.00] | 2.00 [2.00-2.00] | – | 3.00 [3.00-3.00] | 1.50x |"), "{t}");
    }
}
