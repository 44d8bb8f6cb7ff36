//! fmx inside a job something else started: the processes are started here
//! directly (no fmxrun, no PMI) and wire up through the program's own
//! bootstrap (`fmx::init_with_bootstrap`, files in a shared directory).

use std::process::{Command, Output, Stdio};

const PROGRAM: &str = env!("CARGO_BIN_EXE_fmx-itest-userboot");

fn start(size: u32, extra: &[(&str, &str)]) -> (tempdir::Dir, Vec<Output>) {
    let dir = tempdir::Dir::new();
    let children: Vec<_> = (0..size)
        .map(|r| {
            let mut c = Command::new("timeout");
            c.args(["120", PROGRAM]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            c.env("USERBOOT_DIR", &dir.0).env("USERBOOT_RANK", r.to_string()).env("USERBOOT_SIZE", size.to_string());
            for v in ["FMX_RENDEZVOUS", "PMI_FD", "PMI_SIZE", "PMI_PORT", "SLURM_STEP_NUM_TASKS", "FMX_LAUNCHER_PID"] {
                c.env_remove(v);
            }
            c.envs(extra.iter().copied());
            c.spawn().expect("start the program")
        })
        .collect();
    let outs = children.into_iter().map(|c| c.wait_with_output().expect("wait for the program")).collect();
    (dir, outs)
}

/// Shared-memory files the job left (they are named after its job id).
fn leftovers(dir: &tempdir::Dir) -> Vec<String> {
    let job: String = dir.0.file_name().unwrap().to_string_lossy().chars().filter(char::is_ascii_alphanumeric).collect();
    std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.contains(&job)).collect())
        .unwrap_or_default()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn four_processes_wire_up_through_the_programs_bootstrap() {
    let (dir, outs) = start(4, &[]);
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success() && text(o).contains("OK userboot"), "rank {r}:\n{}", text(o));
    }
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "files left in /dev/shm");
}

#[test]
fn a_failing_bootstrap_is_named_in_the_error() {
    let (dir, outs) = start(2, &[("USERBOOT_FAIL", "1")]);
    for (r, o) in outs.iter().enumerate() {
        let t = text(o);
        assert_eq!(o.status.code(), Some(1), "rank {r}:\n{t}");
        assert!(t.contains("the program's bootstrap failed in allgather: the shared directory is read-only"), "rank {r}:\n{t}");
    }
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "files left in /dev/shm");
}

/// Rank 1 is given a node map the others are not: every rank fails naming
/// the disagreement (instead of ranks choosing different transports and
/// waiting for each other).
#[test]
fn a_node_map_that_disagrees_between_ranks_is_an_error_on_every_rank() {
    let (dir, outs) = start(3, &[("USERBOOT_ODD_NODES", "1")]);
    for (r, o) in outs.iter().enumerate() {
        let t = text(o);
        assert_eq!(o.status.code(), Some(1), "rank {r}:\n{t}");
        assert!(t.contains("the node map disagrees between ranks: rank"), "rank {r}:\n{t}");
    }
    let t = text(&outs[1]);
    assert!(t.contains("rank 1 and rank 0 were given different maps (rank 1's: [0, 0, 1])"), "{t}");
    let t = text(&outs[0]);
    assert!(t.contains("rank 0 and rank 1 were given different maps (rank 0's: [0, 0, 0])"), "{t}");
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "files left in /dev/shm");
}

/// A temporary directory removed at drop (no crate for it in this workspace).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub fn new() -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!("fmxuserboot{}x{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
            std::fs::create_dir_all(&p).expect("create a temporary directory");
            Self(p)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
