//! Removing a job's leftover files. A process killed with SIGKILL cannot
//! unlink what it created under `/dev/shm`, so launchers sweep them.
//!
//! The convention every transport follows: a file a job may leave is named
//! `fmx<kind>-<job>-<rest>` (`fmx-<job>-<rank>` for shared-memory segments,
//! `fmxofi-<job>-<rank>.<n>` for libfabric shm endpoints). Job ids contain no
//! `-`, so one job's files never match another's, and a launcher can sweep a
//! job without knowing which transports its ranks were built with.

use std::path::Path;

/// Where POSIX shared memory (`shm_open`, libfabric's shm provider) keeps its files.
pub const SHM_DIR: &str = "/dev/shm";

/// Whether `name` is a file of `job` under the naming convention.
pub fn is_job_file(name: &str, job: &str) -> bool {
    name.split_once('-').is_some_and(|(kind, rest)| kind.starts_with("fmx") && rest.strip_prefix(job).is_some_and(|r| r.starts_with('-')))
}

/// Removes every file of `job` in `dir` (see the convention above); returns how many.
pub fn remove_job_files(dir: &Path, job: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| is_job_file(&e.file_name().to_string_lossy(), job))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// A shell glob for the files of `job` in `dir` (for a helper process that
/// sweeps them when the launcher itself is killed).
pub fn job_files_glob(dir: &Path, job: &str) -> String {
    format!("{}/fmx*-{job}-*", dir.display())
}

/// Removes every file in `dir` whose name starts with `prefix`; returns how many it removed.
pub fn remove_files_with_prefix(dir: &Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_convention_names_one_job_only() {
        assert!(is_job_file("fmx-7x5-0", "7x5") && is_job_file("fmxofi-7x5-3.1", "7x5") && is_job_file("fmx-7x5g2-1", "7x5g2"));
        assert!(!is_job_file("fmx-7x55-0", "7x5") && !is_job_file("fmx-7x5g2-1", "7x5") && !is_job_file("other-7x5-0", "7x5"));
        assert!(!is_job_file("fmx-7x5", "7x5"));
    }

    #[test]
    fn removes_only_the_prefixed_files() {
        let dir = std::env::temp_dir().join(format!("fmx-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["fmx-a1-0", "fmx-a1-1", "fmx-a10-0", "other"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        assert_eq!(remove_files_with_prefix(&dir, "fmx-a1-"), 2);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["fmx-a10-0", "other"]);
        assert_eq!(remove_files_with_prefix(&dir.join("missing"), "fmx-"), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
