//! What every side-by-side comparison needs: running a peer program,
//! building the C peers with an MPI's `mpicc`, pinning a rank to a core.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd` to its end: its stdout, or an error with its status and output.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Builds `peers/<stem>.c` with `mpicc` (e.g. `mpicc.mpich`) into
/// `peers/build/<stem>_<mpi>`; `flags` go before `-o`.
pub fn build(mpicc: &str, stem: &str, flags: &[&str]) -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
    let out = dir.join("build").join(format!("{stem}_{}", mpicc.trim_start_matches("mpicc.")));
    std::fs::create_dir_all(dir.join("build")).map_err(|e| e.to_string())?;
    run(Command::new(mpicc).arg("-O2").args(flags).arg("-o").arg(&out).arg(dir.join(format!("{stem}.c"))))?;
    Ok(out)
}

/// Pins this thread to core `slot` (modulo the cores there are).
pub fn pin(slot: u32) {
    if let Some(cores) = core_affinity::get_core_ids() {
        if !cores.is_empty() {
            core_affinity::set_for_current(cores[slot as usize % cores.len()]);
        }
    }
}
