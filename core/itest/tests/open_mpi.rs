//! fmx programs started by Open MPI's `mpirun` through the PMIx client
//! (cargo feature `pmix`): the same suites as under Hydra. `srun
//! --mpi=pmix` is tested by scripts/slurm-test, which needs Slurm's daemons.
//!
//! `#[ignore]`d so that a machine with only cargo passes; scripts/pmix-test
//! installs Open MPI and libpmix and runs them with `--features pmix --
//! --ignored`. There, a missing `mpirun.openmpi` is a failure, never a pass.
#![cfg(feature = "pmix")]

use std::process::Output;

const RANK: &str = env!("CARGO_BIN_EXE_fmx-itest-rank");

/// `mpirun -np NP RANK SCENARIO` on loopback, oversubscribing the cores;
/// `env` is passed to the ranks (`-x`).
fn mpirun(np: u32, scenario: &str, env: &[(&str, &str)]) -> Output {
    let mut c = fmx_itest::open_mpi_run();
    for (k, v) in env {
        c.env(k, v).args(["-x", k]);
    }
    c.args(["-np", &np.to_string(), RANK, scenario]);
    match c.output() {
        Ok(o) if o.status.code() == Some(127) => panic!("mpirun.openmpi is missing: scripts/ensure-packages pmix installs Open MPI"),
        Ok(o) => o,
        Err(e) => panic!("running timeout mpirun.openmpi: {e}"),
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn count(o: &Output, line: &str) -> usize {
    String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.trim() == line).count()
}

/// Every rank says OK.
fn mpirun_ok(np: u32, scenario: &str, env: &[(&str, &str)]) -> Output {
    let o = mpirun(np, scenario, env);
    assert!(o.status.success(), "{scenario} on {np} ranks under mpirun failed:\n{}", text(&o));
    assert_eq!(count(&o, &format!("OK {scenario}")), np as usize, "{scenario}:\n{}", text(&o));
    o
}

/// Rank, size and node map from PMIx agree with Open MPI's own variables
/// (the identity scenario checks OMPI_COMM_WORLD_* and PMIX_RANK); then
/// point-to-point, collectives and messages up to 64 MiB over shared memory.
#[test]
#[ignore = "needs Open MPI's mpirun and libpmix: scripts/pmix-test installs them and runs these"]
fn mpirun_ranks_point_to_point_collectives_and_sizes() {
    for np in [1, 2, 4] {
        let o = mpirun_ok(np, "identity", &[]);
        let out = String::from_utf8_lossy(&o.stdout);
        for r in 0..np {
            let want = format!("LAUNCHER PMIx rank={r} size={np} node=0 local={r}/{np}");
            assert!(out.lines().any(|l| l == want), "no {want:?} in:\n{}", text(&o));
        }
    }
    for scenario in ["p2p-order", "coll", "sizes"] {
        let o = mpirun_ok(4, scenario, &[]);
        assert_eq!(count(&o, "TRANSPORT shm"), 4, "{}", text(&o));
    }
}

/// Ranks that finish 3 s apart with a 1 s PMI timeout: the finalize fence
/// waits for the last.
#[test]
#[ignore = "needs Open MPI's mpirun and libpmix: scripts/pmix-test installs them and runs these"]
fn mpirun_finalize_waits_for_a_rank_that_finishes_late() {
    mpirun_ok(3, "late-finalize", &[("FMX_PMI_TIMEOUT", "1")]);
}

/// `PMIx_Spawn` through mpirun: three children run a collective among
/// themselves, read the parent's values and report to the parent.
#[test]
#[ignore = "needs Open MPI's mpirun and libpmix: scripts/pmix-test installs them and runs these"]
fn mpirun_spawns_a_new_world_that_reports_back() {
    let o = mpirun(2, "spawn", &[]);
    assert!(o.status.success(), "spawn under mpirun failed:\n{}", text(&o));
    assert_eq!(count(&o, "OK spawn"), 2, "{}", text(&o));
    assert_eq!(count(&o, "OK spawn-child"), 3, "{}", text(&o));
    assert_eq!(count(&o, "SPAWNED 3"), 1, "{}", text(&o));
}
