//! `fmx-perf neighbor-compare`: `fmx-perf neighbor` beside MPICH's and Open
//! MPI's `MPI_Neighbor_alltoallv` on the same torus and rank counts, in one
//! run; with `--update-readme FILE` the table replaces the block between
//! `<!-- neighbor-table:begin -->` and `<!-- neighbor-table:end -->`.

use std::process::Command;

use crate::peers::Mpi;

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
    /// Replace the table between <!-- neighbor-table:begin --> and <!-- neighbor-table:end --> in FILE
    #[arg(long, value_name = "FILE")]
    update_readme: Option<std::path::PathBuf>,
}

/// Entry point of `fmx-perf neighbor-compare`.
pub fn main(a: &Args) -> Result<(), String> {
    let (ranks, ks, readme) = (&a.ranks, &a.ks, &a.update_readme);
    let ks_arg = ks.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut text = String::from(
        "| ranks | k | fmx persistent (us) | fmx neighbor_alltoallv (us) | MPICH (us) | Open MPI (us) | best peer / fmx persistent |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &n in ranks {
        let fmx: Vec<NeighborRow> =
            parse(&crate::peers::run(Command::new(&exe).args(["neighbor", "--np", &n.to_string(), "--ks", &ks_arg]))?);
        let mpich = peer(Mpi::Mpich, n, &ks_arg)?;
        let ompi = peer(Mpi::OpenMpi, n, &ks_arg)?;
        for r in &fmx {
            let get = |v: &[(usize, f64)]| v.iter().find(|x| x.0 == r.k).map(|x| x.1);
            let (m, o) = (get(&mpich), get(&ompi));
            let best = [m, o].into_iter().flatten().fold(f64::INFINITY, f64::min);
            let show = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.2}"));
            text.push_str(&format!(
                "| {n} | {} | {:.2} | {:.2} | {} | {} | {:.2}x |\n",
                r.k,
                r.persistent,
                r.blocking,
                show(m),
                show(o),
                best / r.persistent
            ));
        }
    }
    text.push_str("\nAbove 1 means fmx's persistent exchange is faster than the faster MPI.\n");
    print!("{text}");
    if let Some(path) = readme {
        crate::report::update_readme(&path, "neighbor-table", &text)?;
    }
    Ok(())
}
