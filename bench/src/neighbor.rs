//! `fmx-perf neighbor`: the torus of Example 7.4 of the MPI Forum ticket (P x
//! Q with diagonals, weights 2 and 1; Q = 2 from 4 ranks, else 1), built with
//! `dist_graph_create` (one source per rank, degree 8, reorder off), each rank
//! exchanging k doubles per neighbour. One row per k, microseconds per
//! exchange averaged over ranks, for a persistent plan and for the blocking
//! `neighbor_alltoallv`; `fmx-perf neighbor-compare` runs MPICH's and Open
//! MPI's `MPI_Neighbor_alltoallv` (bench/peers/neighbor_peer.c) on the same
//! graph in the same run.

use std::time::Instant;

use fmx::{Fmx, Info, Op, Reorder, Result, Weights};

/// The default k values (doubles per neighbour).
pub const KS: &[usize] = &[1, 64, 4096, 65536];

/// Options of `fmx-perf neighbor`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Ranks to start when run alone (under a launcher: the world's size)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    np: u32,
    /// Doubles per neighbour
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_values_t = KS.to_vec())]
    ks: Vec<usize>,
}

/// `fmx-perf neighbor`: under a launcher, measure; alone, start `--np` local ranks
/// running the same command line.
pub fn main(a: &Args) -> std::result::Result<(), String> {
    let e2s = |e: fmx::Error| e.to_string();
    if !fmx::started_by_launcher() {
        return crate::peers::launch_self(a.np, None);
    }
    let fmx = fmx::init().map_err(e2s)?;
    crate::peers::pin(fmx.world().rank());
    let rows = run(&fmx, &a.ks).map_err(e2s)?;
    if fmx.world().rank() == 0 {
        print!("{}", render(&rows, fmx.world().size(), fmx.world().transport_name()));
    }
    fmx.finalize().map_err(e2s)
}

/// Iterations and warm-up for k, as the C peer runs them.
fn loops(k: usize) -> (usize, usize) {
    match k {
        0..=64 => (10_000, 1_000),
        65..=4096 => (1_000, 100),
        _ => (100, 10),
    }
}

/// One measured k: microseconds per exchange (mean over ranks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NeighborRow {
    /// Doubles per neighbour.
    pub k: usize,
    /// With a persistent plan.
    pub persistent: f64,
    /// With the blocking `neighbor_alltoallv`.
    pub blocking: f64,
}

/// Runs every k on the world; rows on rank 0 (empty elsewhere).
pub fn run(fmx: &Fmx, ks: &[usize]) -> Result<Vec<NeighborRow>> {
    let w = fmx.world();
    let (d, wt, _) = fmx_itest::topology::torus(w.rank(), w.size());
    let g = w.dist_graph_create(&[w.rank()], &[8], &d, Weights::Values(&wt), &Info::new(), Reorder::No)?;
    let (indeg, outdeg, _) = g.neighbors_count();
    let mean = |us: f64| -> Result<f64> {
        let mut sum = [0f64];
        g.allreduce(&[us], &mut sum, Op::Sum)?;
        Ok(sum[0] / f64::from(g.size()))
    };
    let mut rows = Vec::new();
    for &k in ks {
        let (iters, warmup) = loops(k);
        let sc = vec![k; outdeg];
        let rc = vec![k; indeg];
        let mut plan = g.neighbor_alltoallv_plan::<f64>(&sc, &rc)?;
        for (i, x) in plan.send_mut()?.iter_mut().enumerate() {
            *x = f64::from(g.rank()) + i as f64;
        }
        g.barrier()?;
        let mut t0 = Instant::now();
        for it in 0..iters + warmup {
            if it == warmup {
                t0 = Instant::now();
            }
            plan.run()?;
        }
        let persistent = mean(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)?;
        drop(plan);
        let send: Vec<f64> = (0..k * outdeg).map(|i| f64::from(g.rank()) + i as f64).collect();
        let mut recv = vec![0f64; k * indeg];
        let sd: Vec<usize> = (0..outdeg).map(|j| j * k).collect();
        let rd: Vec<usize> = (0..indeg).map(|i| i * k).collect();
        g.barrier()?;
        let mut t0 = Instant::now();
        for it in 0..iters + warmup {
            if it == warmup {
                t0 = Instant::now();
            }
            g.neighbor_alltoallv(&send, &sc, &sd, &mut recv, &rc, &rd)?;
        }
        let blocking = mean(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)?;
        if g.rank() == 0 {
            rows.push(NeighborRow { k, persistent, blocking });
        }
    }
    Ok(rows)
}

/// The two OSU-style blocks `fmx-perf neighbor` prints.
pub fn render(rows: &[NeighborRow], n: u32, transport: &str) -> String {
    let (_, _, (p, q)) = fmx_itest::topology::torus(0, n);
    let mut s = format!("# fmx-perf neighbor: torus {p}x{q}, {n} ranks, degree 8, k doubles per neighbour, transport {transport}\n");
    for (name, pick) in [("persistent (plan start + wait)", true), ("neighbor_alltoallv", false)] {
        s.push_str(&format!("# {name}\n# k{:>25}\n", "us/exchange"));
        for r in rows {
            s.push_str(&format!("{:<10}{:>18.2}\n", r.k, if pick { r.persistent } else { r.blocking }));
        }
    }
    s
}

/// Reads [`render`]'s output back: (k, persistent, blocking).
pub fn parse(text: &str) -> Vec<NeighborRow> {
    let mut persistent = Vec::new();
    let mut blocking = Vec::new();
    let mut in_blocking = false;
    for l in text.lines() {
        if l.starts_with("# neighbor_alltoallv") {
            in_blocking = true;
        }
        let mut it = l.split_whitespace();
        let (Some(Ok(k)), Some(Ok(v))) = (it.next().map(str::parse::<usize>), it.next().map(str::parse::<f64>)) else { continue };
        if in_blocking {
            blocking.push((k, v));
        } else {
            persistent.push((k, v));
        }
    }
    persistent
        .into_iter()
        .zip(blocking)
        .filter(|(a, b)| a.0 == b.0)
        .map(|((k, p), (_, b))| NeighborRow { k, persistent: p, blocking: b })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_rows_parse_back_and_the_torus_matches_the_ticket() {
        let rows = [NeighborRow { k: 1, persistent: 0.5, blocking: 1.25 }, NeighborRow { k: 65536, persistent: 250.0, blocking: 300.5 }];
        assert_eq!(parse(&render(&rows, 4, "shm")), rows);
        // 2x2: rank 0's x-neighbours are both rank 1, y-neighbours both rank 2, diagonals all rank 3.
        assert_eq!(fmx_itest::topology::torus(0, 4).0, [1, 1, 2, 2, 3, 3, 3, 3]);
        // 2 ranks: a 2x1 torus, y-neighbours are the rank itself.
        assert_eq!(fmx_itest::topology::torus(1, 2).0, [0, 0, 1, 1, 0, 0, 0, 0]);
    }
}
