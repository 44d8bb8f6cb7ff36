//! `fmx-perf compare --rate`: the small-message rate (osu_mbw_mr: every
//! sender streams a window of 64 messages to its partner, then waits for a
//! 4-byte ack) with one and with two pairs, fmx beside each MPI running
//! `bench/peers/osu_peer.c mbw_mr`, in interleaved runs (fmx, MPICH, Open
//! MPI, fmx, ...): medians and ranges of messages per second.

use std::process::Command;

use crate::compare::{Args, OMPI_SHM};
use crate::peers::Mpi;
use crate::stats::spread;

/// The messages/s column of an mbw_mr row for `size` (fmx-perf and the peer
/// print the same three columns: size, MB/s, messages/s).
fn rate_of(out: &str, size: usize) -> Option<f64> {
    out.lines().filter(|l| !l.trim_start().starts_with('#')).find_map(|l| {
        let v: Vec<f64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        (v.len() == 3 && v[0] as usize == size).then_some(v[2])
    })
}

/// The MPI peer's command for `pairs` pairs: bound to cores while there are
/// enough (2 ranks), unbound and oversubscribed beyond.
fn peer_command(mpi: Mpi, pairs: u32) -> Result<Command, String> {
    let np = (2 * pairs).to_string();
    let mut c = mpi.launcher()?;
    match (mpi, pairs) {
        (Mpi::Mpich, 1) => c.args(["-n", &np, "-bind-to", "core"]),
        (Mpi::Mpich, _) => c.args(["-n", &np]),
        (Mpi::OpenMpi, 1) => c.args(["-n", &np, "--bind-to", "core"]).args(OMPI_SHM),
        (Mpi::OpenMpi, _) => c.args(["-n", &np, "--oversubscribe", "--bind-to", "none"]).args(OMPI_SHM),
    };
    Ok(c)
}

/// `compare --rate`.
pub fn main(a: &Args) -> Result<(), String> {
    let size = a.sizes.first().copied().unwrap_or(8);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut peers = Vec::new();
    for mpi in Mpi::ALL {
        match mpi.build("osu_peer", &["-Wno-stringop-overflow"]) {
            Ok(bin) => peers.push((mpi, bin)),
            Err(e) => println!("Not compared: {e}"),
        }
    }
    let mut t = format!(
        "{size} B messages, window 64, osu_mbw_mr's method; {} interleaved runs per side: median [range] of messages/s.\n\n\
         | pairs | fmx | {} |\n|---:|---:|{}\n",
        a.reps,
        peers.iter().map(|(m, _)| format!("{} | fmx vs {}", m.name(), m.name())).collect::<Vec<_>>().join(" | "),
        "---:|---:|".repeat(peers.len())
    );
    for pairs in [1u32, 2] {
        let mut sides: Vec<Vec<f64>> = vec![Vec::new(); 1 + peers.len()];
        for _ in 0..a.reps {
            let s = size.to_string();
            let out = crate::peers::run(Command::new(&exe).args([
                "mbw_mr",
                "--pairs",
                &pairs.to_string(),
                "-m",
                &format!("{s}:{s}"),
                "-W",
                "64",
            ]))?;
            sides[0].push(rate_of(&out, size).ok_or_else(|| format!("fmx-perf mbw_mr printed no row for {size} B:\n{out}"))?);
            for (i, (mpi, bin)) in peers.iter().enumerate() {
                let out = crate::peers::run(peer_command(*mpi, pairs)?.arg(bin).args(["mbw_mr", &s]))?;
                sides[i + 1].push(rate_of(&out, size).ok_or_else(|| format!("{} printed no mbw_mr row:\n{out}", mpi.name()))?);
            }
        }
        let (fmx, lo, hi) = spread(&sides[0]);
        t.push_str(&format!("| {pairs} | {:.2}M [{:.2}-{:.2}] |", fmx / 1e6, lo / 1e6, hi / 1e6));
        for runs in &sides[1..] {
            let (m, lo, hi) = spread(runs);
            t.push_str(&format!(" {:.2}M [{:.2}-{:.2}] | {:.2}x |", m / 1e6, lo / 1e6, hi / 1e6, fmx / m));
        }
        t.push('\n');
    }
    t.push_str(
        "\nA ratio above 1 means fmx moves more messages per second. Two pairs are four ranks: on a 2-core machine they share cores.\n",
    );
    print!("{t}");
    if let Some(path) = &a.update_readme {
        crate::report::update_readme(path, "rate-table", &t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{rate_of, spread};

    #[test]
    fn the_rate_column_is_read_from_either_side() {
        let fmx = "# fmx-perf mbw_mr\n# Size                  MB/s        Messages/s\n8                      28.78        3597716.80\n";
        assert_eq!(rate_of(fmx, 8), Some(3_597_716.80));
        let peer = "# OSU-methodology mbw_mr (MPI peer), 1 pairs\n8                     51.06        6383078.46\n";
        assert_eq!(rate_of(peer, 8), Some(6_383_078.46));
        assert_eq!(rate_of(peer, 16), None);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
    }
}
