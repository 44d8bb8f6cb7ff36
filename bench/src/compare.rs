//! `fmx-perf compare`: fmx and the MPI peers, side by side in one run.
//!
//! Builds `bench/peers/osu_peer.c` with `mpicc.mpich` and `mpicc.openmpi`
//! (Debian's mpich and openmpi-bin), runs the same OSU-methodology latency
//! and bandwidth sweeps under `mpiexec.hydra -bind-to core` and Open MPI
//! (`--mca pml ob1 --mca btl self,vader`, bound to cores), runs fmx-perf's
//! own two pinned ranks, and prints one table with the ratios. With
//! `--update-readme FILE` the table replaces the block between
//! `<!-- perf-table:begin -->` and `<!-- perf-table:end -->`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::report::{parse_osu, Row};

/// Open MPI's shared-memory path, with its out-of-band wiring kept on loopback.
pub(crate) const OMPI_SHM_LO: [&str; 12] =
    ["--mca", "pml", "ob1", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"];

struct Peer {
    name: &'static str,
    mpicc: &'static str,
    launcher: &'static [&'static str],
    /// Options after the launcher's own.
    extra: &'static [&'static str],
}

const PEERS: &[Peer] = &[
    Peer { name: "MPICH", mpicc: "mpicc.mpich", launcher: &["mpiexec.hydra", "-iface", "lo", "-n", "2", "-bind-to", "core"], extra: &[] },
    Peer {
        name: "Open MPI",
        mpicc: "mpicc.openmpi",
        launcher: &["mpirun.openmpi", "--allow-run-as-root", "-n", "2", "--bind-to", "core"],
        extra: &OMPI_SHM_LO,
    },
];

fn build_peer(p: &Peer) -> Result<PathBuf, String> {
    crate::peers::build(p.mpicc, "osu_peer", &["-Wno-stringop-overflow"])
}

type Table = BTreeMap<(&'static str, usize), Vec<(String, f64)>>;

fn record(table: &mut Table, test: &'static str, who: &str, rows: &[Row], sizes: &[usize]) {
    for r in rows.iter().filter(|r| sizes.contains(&r.size)) {
        table.entry((test, r.size)).or_default().push((who.to_owned(), r.value));
    }
}

/// Entry point of `fmx-perf compare`.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut sizes = vec![8usize, 1 << 20, 4 << 20];
    let mut readme = None;
    let mut peers = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sizes" => {
                let v = it.next().ok_or("--sizes needs a list")?;
                sizes = v.split(',').map(|s| s.trim().parse().map_err(|_| format!("bad size {s:?}"))).collect::<Result<_, _>>()?;
            }
            "--update-readme" => readme = Some(it.next().ok_or("--update-readme needs a file")?.clone()),
            "--no-peers" => peers = false,
            other => return Err(format!("unknown option {other}")),
        }
    }
    let max = sizes.iter().copied().max().unwrap_or(8).next_power_of_two();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut table = Table::new();
    let mut names = vec!["fmx".to_owned()];
    for test in ["latency", "bw"] {
        let out = crate::peers::run(Command::new(&exe).args([test, "--max-size", &max.to_string()]))?;
        record(&mut table, test, "fmx", &parse_osu(&out), &sizes);
    }
    if peers {
        for p in PEERS {
            let bin = build_peer(p)?;
            for test in ["latency", "bw"] {
                let (prog, rest) = p.launcher.split_first().expect("launcher");
                let out = crate::peers::run(Command::new(prog).args(rest).args(p.extra).arg(&bin).args([test, &max.to_string()]))?;
                record(&mut table, test, p.name, &parse_osu(&out), &sizes);
            }
            names.push(p.name.to_owned());
        }
    }
    let text = render(&table, &names);
    print!("{text}");
    if let Some(path) = readme {
        crate::report::update_readme(&path, "perf-table", &text)?;
    }
    Ok(())
}

fn render(table: &Table, names: &[String]) -> String {
    let peers = &names[1..];
    let mut s = String::from("| test | size | fmx |");
    for p in peers {
        s.push_str(&format!(" {p} | fmx vs {p} |"));
    }
    s.push_str("\n|---|---:|---:|");
    for _ in peers {
        s.push_str("---:|---:|");
    }
    s.push('\n');
    for ((test, size), vals) in table {
        let get = |who: &str| vals.iter().find(|(w, _)| w == who).map(|v| v.1);
        let unit = if *test == "latency" { "us" } else { "MB/s" };
        let Some(f) = get("fmx") else { continue };
        s.push_str(&format!("| {test} ({unit}) | {} | {f:.2} |", human(*size)));
        for p in peers {
            match get(p) {
                // Ratio > 1 means fmx is better: peer/fmx for latency, fmx/peer for bandwidth.
                Some(v) => {
                    let ratio = if *test == "latency" { v / f } else { f / v };
                    s.push_str(&format!(" {v:.2} | {ratio:.2}x |"));
                }
                None => s.push_str(" – | – |"),
            }
        }
        s.push('\n');
    }
    s.push_str("\nRatios above 1 mean fmx is better (peer latency / fmx latency; fmx bandwidth / peer bandwidth).\n");
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
