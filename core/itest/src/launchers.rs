//! Rank-program scenarios about the process managers that start fmx jobs
//! (fmxrun, Hydra, Slurm, Open MPI): what each rank learns, and spawning a new world.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use fmx::{Fmx, Op, SpawnRequest};

/// The key under which a spawning world leaves its contact address.
pub const PARENT_KEY: &str = "fmx-itest-parent";

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Rank, size and node placement agree with what the process manager put in
/// the environment, and a collective over the world gives the right answer.
pub fn identity(fmx: &Fmx) -> Result<(), String> {
    let w = fmx.world();
    let loc = fmx.locality();
    println!(
        "LAUNCHER {} rank={} size={} node={} local={}/{}",
        fmx.launcher(),
        w.rank(),
        w.size(),
        loc.node,
        loc.local_rank,
        loc.local_size
    );
    let each_launchers_own = [
        ("PMI_RANK", w.rank()),
        ("PMI_SIZE", w.size()),
        ("FMX_RANK", w.rank()),
        ("FMX_SIZE", w.size()),
        ("PMIX_RANK", w.rank()),
        ("OMPI_COMM_WORLD_RANK", w.rank()),
        ("OMPI_COMM_WORLD_SIZE", w.size()),
        ("SLURM_PROCID", w.rank()),
        ("SLURM_STEP_NUM_TASKS", w.size()),
    ];
    for (var, got) in each_launchers_own {
        if let Some(want) = env_u32(var).filter(|&want| want != got) {
            return Err(format!("{var}={want} but fmx says {got}"));
        }
    }
    // Hydra, Slurm and Open MPI say where we are on the node; fmx learns it
    // from PMI_process_mapping or PMIx's node map.
    for (var, got) in [
        ("MPI_LOCALRANKID", loc.local_rank),
        ("SLURM_LOCALID", loc.local_rank),
        ("MPI_LOCALNRANKS", loc.local_size),
        ("OMPI_COMM_WORLD_LOCAL_RANK", loc.local_rank),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", loc.local_size),
    ] {
        if let Some(want) = env_u32(var).filter(|&want| want != got) {
            return Err(format!("{var}={want} but fmx's locality says {got}"));
        }
    }
    let mut sum = [0u64];
    w.allreduce(&[u64::from(w.rank()) + 1], &mut sum, Op::Sum).map_err(|e| e.to_string())?;
    let n = u64::from(w.size());
    if sum[0] != n * (n + 1) / 2 {
        return Err(format!("allreduce of rank+1 gave {} on {n} ranks", sum[0]));
    }
    let next = (w.rank() + 1) % w.size();
    let prev = (w.rank() + w.size() - 1) % w.size();
    let mut got = [0u32];
    w.sendrecv(&[w.rank()], next, 3, &mut got, prev, 3).map_err(|e| e.to_string())?;
    if got[0] != prev {
        return Err(format!("ring exchange: expected {prev}, got {}", got[0]));
    }
    Ok(())
}

/// Rank 0 asks the process manager for `children` new processes running
/// `spawn-child`, and checks that each reports in over TCP (127.0.0.1) with
/// its rank in the new world and the sum of an allreduce there.
pub fn spawn(fmx: &Fmx, children: u32) -> Result<(), String> {
    let w = fmx.world();
    if fmx.spawned() {
        return Err("a freshly launched world says it was spawned".into());
    }
    if w.rank() != 0 {
        return Ok(());
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?.to_string();
    let program = std::env::current_exe().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
    let req = SpawnRequest { program, args: vec!["spawn-child".into()], nprocs: children, values: vec![(PARENT_KEY.into(), addr)] };
    fmx.spawn(&req).map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = vec![false; children as usize];
    let mut reports = 0;
    while reports < children {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
                let mut line = String::new();
                BufReader::new(s).read_line(&mut line).map_err(|e| e.to_string())?;
                let nums: Vec<u64> = line.split_whitespace().filter_map(|t| t.parse().ok()).collect();
                let [rank, size, sum] = nums[..] else { return Err(format!("malformed child report {line:?}")) };
                let n = u64::from(children);
                if size != n || sum != n * (n + 1) / 2 || rank >= n || seen[rank as usize] {
                    return Err(format!("child report {line:?}: expected a new rank below {n}, size {n}, sum {}", n * (n + 1) / 2));
                }
                seen[rank as usize] = true;
                reports += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("{reports} of {children} spawned processes reported within 60 s"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    println!("SPAWNED {children}");
    Ok(())
}

/// A process of a spawned world: it knows it was spawned, works with its own
/// world, and reports to the parent at the address the parent left.
pub fn spawn_child(fmx: &Fmx) -> Result<(), String> {
    let w = fmx.world();
    if !fmx.spawned() {
        return Err("a spawned process does not know it was spawned".into());
    }
    let addr = fmx.parent_value(PARENT_KEY).map_err(|e| e.to_string())?.ok_or("the parent's value is missing")?;
    let mut sum = [0u64];
    w.allreduce(&[u64::from(w.rank()) + 1], &mut sum, Op::Sum).map_err(|e| e.to_string())?;
    let mut s = TcpStream::connect(&addr).map_err(|e| format!("connecting to the parent at {addr}: {e}"))?;
    writeln!(s, "{} {} {}", w.rank(), w.size(), sum[0]).map_err(|e| e.to_string())?;
    Ok(())
}
