//! fmx-info reports what this build has, the launcher fmx would use, and
//! every setting with where its value came from.

use std::process::Command;

fn info(env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fmx-info"));
    for (k, _) in
        std::env::vars().filter(|(k, _)| k.starts_with("FMX_") || k.starts_with("PMI") || k.starts_with("OMPI_") || k.starts_with("SLURM_"))
    {
        c.env_remove(k);
    }
    let o = c.envs(env.iter().copied()).args(args).output().expect("fmx-info runs");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).into_owned())
}

fn line<'a>(out: &'a str, start: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no line starting {start:?} in:\n{out}"))
}

#[test]
fn transports_launcher_and_settings_with_their_sources() {
    let (code, out) = info(&[("FMX_POOL_SLOTS", "7"), ("FMX_VERBS_TIMEOUT", "17")], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, "shm ").contains("built"), "{out}");
    for t in ["verbs", "ofi"] {
        let l = line(&out, &format!("{t} "));
        let built = if t == "verbs" { cfg!(feature = "verbs") } else { cfg!(feature = "ofi") };
        assert_eq!(l.contains("not in this build: add the cargo feature"), !built, "{l}");
    }
    assert!(out.contains("none: a process started alone is a world of one"), "{out}");
    let pool = line(&out, "FMX_POOL_SLOTS ");
    assert!(pool.contains("= 7 ") && pool.contains("# environment"), "{pool}");
    let shm = line(&out, "FMX_SHM_POOL_SLOTS ");
    assert!(shm.contains("= 64 ") && shm.contains("# default"), "{shm}");
    let ack = line(&out, "FMX_VERBS_ACK_TIMEOUT_EXP ");
    assert!(ack.contains("= 17 ") && ack.contains("old name FMX_VERBS_TIMEOUT"), "{ack}");
    // fmxrun's own variables only with --all.
    assert!(!out.contains("FMX_RANK "), "{out}");
    let (_, all) = info(&[], &["-c", "--all"]);
    assert!(all.starts_with("FMX_TRANSPORT ") && all.contains("FMX_RANK "), "{all}");
}

#[test]
fn the_launcher_is_named_or_refused_with_the_reason() {
    let (_, out) = info(&[("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_COMM_WORLD_RANK", "1"), ("PMIX_RANK", "1")], &[]);
    assert!(out.contains("refused: started by Open MPI's mpirun with 4 processes"), "{out}");
    let (_, out) = info(&[("FMX_RENDEZVOUS", "127.0.0.1:5000"), ("FMX_RANK", "2"), ("FMX_SIZE", "4")], &[]);
    assert!(out.contains("fmxrun (bootstrap at 127.0.0.1:5000; rank 2 of 4)"), "{out}");
    let (code, help) = info(&[], &["--help"]);
    assert!(code == 0 && help.contains("Usage: fmx-info"), "{help}");
}
