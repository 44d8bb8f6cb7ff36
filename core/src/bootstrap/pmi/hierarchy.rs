//! The node-level address exchange: ranks of one node hand their blobs to the
//! node's first rank (the leader) through files in node-local memory
//! (`/dev/shm`), the leader puts one value per node, and every rank gets one
//! value per node instead of one per rank.
//!
//! Cost, for N ranks on M nodes with blobs of b bytes and PMI values of v
//! bytes (hex halves them): flat, N·⌈2b/v⌉ puts in all and N·⌈2b/v⌉ gets per
//! rank; by node, M·⌈2b·N/M/v⌉ puts and about ⌈2b·N/v⌉ + M gets per rank,
//! plus one file per rank. Both use one fence. It pays when many ranks share
//! a node and blobs are small (shm addresses are tens of bytes); with one rank
//! per node it is the flat exchange plus files, so `auto` uses it only from
//! 64 ranks with at least 4 on some node.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// `auto` (default), `on` or `off`.
pub const ENV_HIERARCHY: &str = "FMX_PMI_HIERARCHY";

/// Whether to exchange by node, from `FMX_PMI_HIERARCHY` and the job's shape.
pub(crate) fn wanted(nodes: &[u32]) -> Result<bool> {
    match fmx_transport::settings::var(ENV_HIERARCHY).as_deref().map(str::trim) {
        None | Some("" | "auto") => {
            let busiest = nodes.iter().map(|n| nodes.iter().filter(|m| *m == n).count()).max().unwrap_or(0);
            Ok(nodes.len() >= 64 && busiest >= 4)
        }
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(Error::Bootstrap(format!("{ENV_HIERARCHY}={other:?}: expected auto, on or off"))),
    }
}

fn dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// Where `rank` leaves its blob of exchange `round`.
pub(crate) fn path(job: &str, round: u32, rank: u32) -> PathBuf {
    let job: String = job.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    dir().join(format!("fmx-pmi-{job}-{round}-{rank}"))
}

/// Writes our blob where the leader will look (complete or absent: written
/// aside, then renamed).
pub(crate) fn leave(job: &str, round: u32, rank: u32, blob: &[u8]) -> Result<()> {
    let to = path(job, round, rank);
    let tmp = to.with_extension("tmp");
    let io = |source| Error::BootstrapIo { what: format!("writing {}", to.display()), source };
    std::fs::write(&tmp, blob).map_err(io)?;
    std::fs::rename(&tmp, &to).map_err(io)
}

/// The leader collects the blobs of `ranks` (its node's others), removing
/// each file once read; waits at most `timeout` for each to appear.
pub(crate) fn collect(
    job: &str,
    round: u32,
    ranks: &[u32],
    timeout: Duration,
    mut watch: Option<&mut super::Watch>,
) -> Result<Vec<(u32, Vec<u8>)>> {
    let deadline = Instant::now() + timeout;
    let mut asked = Instant::now();
    let mut out = Vec::with_capacity(ranks.len());
    for &r in ranks {
        let p = path(job, round, r);
        loop {
            match std::fs::read(&p) {
                Ok(b) => {
                    let _ = std::fs::remove_file(&p);
                    out.push((r, b));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                // Past the deadline a watched wait (the finalize barrier) goes on
                // for as long as the rank works, unless the watch finds a peer gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && watch.is_some() => {
                    std::thread::sleep(Duration::from_millis(10));
                    if asked.elapsed() >= super::WATCH_EVERY {
                        asked = Instant::now();
                        if let Some(e) = watch.as_mut().and_then(|w| w()) {
                            for &q in ranks {
                                let _ = std::fs::remove_file(path(job, round, q));
                            }
                            return Err(e);
                        }
                    }
                }
                Err(e) => {
                    for &q in ranks {
                        let _ = std::fs::remove_file(path(job, round, q));
                    }
                    return Err(Error::Bootstrap(format!(
                        "rank {r}'s address file {} did not appear within {timeout:?} ({e}): the process manager places rank {r} on this \
                         node; if it is elsewhere or died, set {ENV_HIERARCHY}=off",
                        p.display()
                    )));
                }
            }
        }
    }
    Ok(out)
}

/// One node's blobs as one: (rank, length, bytes) each.
pub(crate) fn pack(blobs: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (r, b) in blobs {
        out.extend_from_slice(&r.to_le_bytes());
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

/// Inverse of [`pack`]; `None` if malformed.
pub(crate) fn unpack(mut b: &[u8]) -> Option<Vec<(u32, Vec<u8>)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let r = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
        let len = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?) as usize;
        out.push((r, b.get(8..8 + len)?.to_vec()));
        b = &b[8 + len..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_roundtrips_and_rejects_truncation() {
        let blobs = vec![(3, vec![1, 2, 3]), (9, vec![]), (4, vec![7; 100])];
        assert_eq!(unpack(&pack(&blobs)).unwrap(), blobs);
        let p = pack(&blobs);
        assert!(unpack(&p[..p.len() - 1]).is_none());
    }

    #[test]
    fn the_leader_reads_files_and_names_a_missing_rank() {
        let job = format!("unit{}", std::process::id());
        leave(&job, 0, 1, b"one").unwrap();
        leave(&job, 0, 2, b"two").unwrap();
        let got = collect(&job, 0, &[1, 2], Duration::from_secs(1), None).unwrap();
        assert_eq!(got, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
        assert!(!path(&job, 0, 1).exists(), "the leader removes what it read");
        let e = collect(&job, 1, &[5], Duration::from_millis(50), None).unwrap_err().to_string();
        assert!(e.contains("rank 5's address file") && e.contains("FMX_PMI_HIERARCHY=off"), "{e}");
    }

    /// The finalize barrier's node-level wait: past the timeout it waits for
    /// a late rank's file, and ends with the watch's error when a peer died.
    #[test]
    fn a_watched_wait_outlasts_the_timeout_and_ends_on_the_watch() {
        let job = format!("unitw{}", std::process::id());
        let late = {
            let job = job.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                leave(&job, 0, 1, b"late").unwrap();
            })
        };
        let mut never: super::super::Watch = Box::new(|| None);
        let got = collect(&job, 0, &[1], Duration::from_millis(50), Some(&mut never)).unwrap();
        assert_eq!(got, vec![(1, b"late".to_vec())]);
        late.join().unwrap();
        let mut dead: super::super::Watch = Box::new(|| Some(crate::error::Error::Bootstrap("rank 3 died".into())));
        let e = collect(&job, 1, &[3], Duration::from_millis(50), Some(&mut dead)).unwrap_err().to_string();
        assert!(e.contains("rank 3 died"), "{e}");
    }

    #[test]
    fn auto_needs_a_large_job_with_busy_nodes() {
        // (No env var set in unit tests: auto.)
        assert!(!wanted(&[0, 0, 0, 0]).unwrap());
        assert!(wanted(&[0; 64]).unwrap());
        let one_per_node: Vec<u32> = (0..64).collect();
        assert!(!wanted(&one_per_node).unwrap());
    }
}
