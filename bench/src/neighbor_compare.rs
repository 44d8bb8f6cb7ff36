//! `fmx-perf neighbor-compare`: `fmx-perf neighbor` beside MPICH's and Open
//! MPI's `MPI_Neighbor_alltoallv` on the same torus and rank counts, in one
//! run; with `--update-readme FILE` the table replaces the block between
//! `<!-- neighbor-table:begin -->` and `<!-- neighbor-table:end -->`.

use std::process::Command;

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

fn build(mpicc: &str) -> Result<std::path::PathBuf, String> {
    crate::peers::build(mpicc, "neighbor_peer", &[])
}

fn peer(name: &str, n: u32, ks: &str) -> Result<Vec<(usize, f64)>, String> {
    let np = n.to_string();
    let out = if name == "MPICH" {
        let bin = build("mpicc.mpich")?;
        // Hydra would pick the outside interface; UCX (MPICH's ch4 device) too.
        crate::peers::run(
            Command::new("mpiexec.hydra")
                .env("UCX_NET_DEVICES", "lo")
                .args(["-iface", "lo", "-n", &np, "-bind-to", "core"])
                .arg(bin)
                .arg(ks),
        )?
    } else {
        let bin = build("mpicc.openmpi")?;
        crate::peers::run(
            Command::new("mpirun.openmpi")
                .args(["--allow-run-as-root", "--oversubscribe", "-n", &np, "--bind-to", "core:overload-allowed"])
                .args(crate::compare::OMPI_SHM_LO)
                .arg(bin)
                .arg(ks),
        )?
    };
    Ok(parse_peer(&out))
}

/// Entry point of `fmx-perf neighbor-compare`.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut ranks = vec![2u32, 4];
    let mut ks: Vec<usize> = KS.to_vec();
    let mut readme = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let list = |v: Option<&String>, what: &str| -> Result<Vec<usize>, String> {
            let v = v.ok_or(format!("{what} needs a list"))?;
            v.split(',').map(|s| s.trim().parse().map_err(|_| format!("{what}: bad value {s:?}"))).collect()
        };
        match a.as_str() {
            "--ranks" => ranks = list(it.next(), "--ranks")?.into_iter().map(|r| r as u32).collect(),
            "--ks" => ks = list(it.next(), "--ks")?,
            "--update-readme" => readme = Some(it.next().ok_or("--update-readme needs a file")?.clone()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    let ks_arg = ks.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut text = String::from(
        "| ranks | k | fmx persistent (us) | fmx neighbor_alltoallv (us) | MPICH (us) | Open MPI (us) | best peer / fmx persistent |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &n in &ranks {
        let fmx: Vec<NeighborRow> =
            parse(&crate::peers::run(Command::new(&exe).args(["neighbor", "--np", &n.to_string(), "--ks", &ks_arg]))?);
        let mpich = peer("MPICH", n, &ks_arg)?;
        let ompi = peer("Open MPI", n, &ks_arg)?;
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
