//! Helpers shared by the rank programs and the tests that launch them.

pub mod connect;
pub mod launchers;
pub mod topology;

/// `timeout 120 mpirun.openmpi` on loopback only, oversubscribing the cores
/// and allowed to run as root (as CI does), with fmx's own variables that a
/// test's environment could leak removed; the caller adds `-x`, `-np` and
/// the program.
pub fn open_mpi_run() -> std::process::Command {
    let mut c = std::process::Command::new("timeout");
    c.args(["120", "mpirun.openmpi", "--oversubscribe", "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"]);
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c.env_remove("FMX_RENDEZVOUS").env_remove("PMI_FD").env_remove("FMX_PMI");
    c
}

/// A job's captured output, one `[rank] line` (or `[rank err] line`) per line, for assertion messages.
pub fn dump(o: &fmx_launcher::Outcome) -> String {
    o.lines.iter().map(|(r, e, l)| format!("[{r}{}] {l}\n", if *e { " err" } else { "" })).collect()
}

/// Files a job left in shared memory: fmx's shm segments (`fmx-<job>-<rank>`
/// in `FMX_SHM_DIR`, default `/dev/shm`) and the libfabric shm endpoints fmx
/// names after the job (`fmxofi-<job>-<rank>.<n>` in `/dev/shm`), for the
/// job and the worlds and bridges it spawned (`<job>g<k>`, `<job>b<k>`).
pub fn files_left(job: &str) -> Vec<String> {
    let of_job = |name: &str, kind: &str| {
        let Some(id) = name.strip_prefix(kind).and_then(|n| n.split('-').next()) else {
            return false;
        };
        id.strip_prefix(job).is_some_and(|rest| {
            rest.is_empty() || (rest.len() > 1 && rest.starts_with(['g', 'b']) && rest[1..].bytes().all(|b| b.is_ascii_digit()))
        })
    };
    let shm = std::env::var("FMX_SHM_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let mut left = Vec::new();
    for (dir, kind) in [(shm.as_str(), "fmx-"), ("/dev/shm", "fmxofi-")] {
        if let Ok(d) = std::fs::read_dir(dir) {
            left.extend(d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| of_job(n, kind)));
        }
    }
    left
}

#[cfg(test)]
mod tests {
    #[test]
    fn files_left_names_the_job_its_worlds_and_bridges_only() {
        let dir = std::env::temp_dir().join(format!("fmx-itest-left-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in ["fmx-7x5-0", "fmx-7x5g2-1", "fmx-7x5b1-3", "fmx-7x55-0", "fmx-7x5gx-0", "other"] {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        std::env::set_var("FMX_SHM_DIR", &dir);
        let mut left = super::files_left("7x5");
        left.sort();
        assert_eq!(left, ["fmx-7x5-0", "fmx-7x5b1-3", "fmx-7x5g2-1"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A rank program's verdict on `scenario`: `OK scenario` on stdout, or
/// `FAIL scenario: why` on stderr and exit code 1 (the tests read both).
pub fn report(scenario: &str, r: Result<(), String>) {
    match r {
        Ok(()) => println!("OK {scenario}"),
        Err(e) => {
            eprintln!("FAIL {scenario}: {e}");
            std::process::exit(1);
        }
    }
}

/// The byte at index `i` of message `m` from `src` (content checks).
pub fn pattern(src: u32, m: u64, i: usize) -> u8 {
    ((i as u64).wrapping_mul(31) ^ m.wrapping_mul(131) ^ u64::from(src).wrapping_mul(7)) as u8
}

/// Fills `buf` with [`pattern`].
pub fn fill(buf: &mut [u8], src: u32, m: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(src, m, i);
    }
}

/// The first index where `buf` differs from [`pattern`].
pub fn first_mismatch(buf: &[u8], src: u32, m: u64) -> Option<usize> {
    buf.iter().enumerate().position(|(i, &b)| b != pattern(src, m, i))
}
