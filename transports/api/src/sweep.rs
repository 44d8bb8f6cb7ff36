//! Removing a job's leftover files. A process killed with SIGKILL cannot
//! unlink what it created under `/dev/shm`, so launchers sweep by the prefix
//! each transport names its files with.

use std::path::Path;

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
