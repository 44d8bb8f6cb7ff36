//! Endpoint names for providers that keep endpoints in files.
//!
//! libfabric's `shm` provider maps each endpoint to `/dev/shm/<name>` and by
//! default derives the name from the process id. A process killed with
//! SIGKILL leaves its file behind, and once pids wrap (32768 on many hosts) a
//! new process with the same pid finds that file, sees its own pid alive in
//! it and `fi_enable` fails with EBUSY. Naming the endpoint after the job and
//! rank avoids the collision, and lets the launcher remove a killed job's
//! files by prefix ([`cleanup_job`]; the names follow
//! `fmx_transport::sweep`'s convention, so a launcher built without this
//! transport sweeps them too).

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The provider that names endpoints after files.
pub(crate) const FILE_NAMED_PROVIDER: &str = "shm";
use fmx_transport::sweep::SHM_DIR;

/// Endpoints this process has named: a process may open the same job and rank twice
/// (finalize, then init again) while the first file is still being torn down.
static OPENED: AtomicU32 = AtomicU32::new(0);

fn job_prefix(job: &str) -> String {
    format!("fmxofi-{job}-")
}

/// A fresh name for `rank`'s endpoint in `job`.
pub(crate) fn endpoint_name(job: &str, rank: u32) -> String {
    format!("{}{rank}.{}", job_prefix(job), OPENED.fetch_add(1, Ordering::Relaxed))
}

/// Removes the endpoint files of `job` that its processes could not remove
/// (they were killed); returns how many it removed. Launchers call this when
/// a job ends.
pub fn cleanup_job(job: &str) -> usize {
    fmx_transport::sweep::remove_files_with_prefix(Path::new(SHM_DIR), &job_prefix(job))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_job_and_rank_and_never_repeat() {
        let a = endpoint_name("j1", 3);
        let b = endpoint_name("j1", 3);
        assert!(a.starts_with("fmxofi-j1-3."), "{a}");
        assert_ne!(a, b);
        // Job ids have no '-', so one job's prefix never covers another's.
        assert!(!endpoint_name("j10", 0).starts_with(&job_prefix("j1")));
    }
}
