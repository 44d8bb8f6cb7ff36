//! What every side-by-side comparison needs: finding an MPI (its compiler
//! and launcher, through `FMX_MPICH_CC` / `FMX_MPICH_RUN` /
//! `FMX_OPENMPI_CC` / `FMX_OPENMPI_RUN` or Debian's names on PATH),
//! building the C peers (whose sources travel inside fmx-perf, or come from
//! `--peer-src` / `FMX_PEER_SRC`), running them, and pinning a rank to a core.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The C peers' sources, carried in the binary: an installed fmx-perf needs no checkout.
const SOURCES: &[(&str, &str)] = &[
    ("osu_peer", include_str!("../peers/osu_peer.c")),
    ("neighbor_peer", include_str!("../peers/neighbor_peer.c")),
    ("redistribute_peer", include_str!("../peers/redistribute_peer.c")),
];

static PEER_SRC: OnceLock<PathBuf> = OnceLock::new();

/// Takes the peers' C sources from `dir` instead of the copies inside fmx-perf.
pub fn set_peer_src(dir: PathBuf) {
    let _ = PEER_SRC.set(dir);
}

/// An MPI implementation fmx is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mpi {
    /// MPICH (Debian's `mpich`: mpicc.mpich, mpiexec.hydra).
    Mpich,
    /// Open MPI (Debian's `openmpi-bin`: mpicc.openmpi, mpirun.openmpi).
    OpenMpi,
}

impl Mpi {
    /// Both, in table order.
    pub const ALL: [Mpi; 2] = [Mpi::Mpich, Mpi::OpenMpi];

    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Mpi::Mpich => "MPICH",
            Mpi::OpenMpi => "Open MPI",
        }
    }

    /// (compiler variable, default compiler, launcher variable, default launcher, Debian package).
    fn names(self) -> (&'static str, &'static str, &'static str, &'static str, &'static str) {
        match self {
            Mpi::Mpich => ("FMX_MPICH_CC", "mpicc.mpich", "FMX_MPICH_RUN", "mpiexec.hydra", "mpich"),
            Mpi::OpenMpi => ("FMX_OPENMPI_CC", "mpicc.openmpi", "FMX_OPENMPI_RUN", "mpirun.openmpi", "openmpi-bin"),
        }
    }

    /// The compiler and the launcher; an error says which is missing and how to get it.
    pub fn tools(self) -> Result<(PathBuf, PathBuf), String> {
        let (cc_var, cc, run_var, run, pkg) = self.names();
        let find = |var: &str, default: &str| {
            let name = std::env::var(var).unwrap_or_else(|_| default.to_owned());
            which(&name)
                .ok_or_else(|| format!("{}: {name} not found on PATH (apt-get install {pkg}, or set {var} to its path)", self.name()))
        };
        Ok((find(cc_var, cc)?, find(run_var, run)?))
    }

    /// The launcher with loopback-only wiring (never the outside interface).
    pub fn launcher(self) -> Result<Command, String> {
        let (_, run) = self.tools()?;
        let mut c = Command::new(run);
        match self {
            // Hydra would pick the outside interface; UCX (MPICH's ch4 device) too.
            Mpi::Mpich => c.env("UCX_NET_DEVICES", "lo").args(["-iface", "lo"]),
            Mpi::OpenMpi => c.args(["--allow-run-as-root", "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo"]),
        };
        Ok(c)
    }

    /// The version its launcher reports, for the report's header.
    pub fn version(self) -> String {
        let Ok((_, run)) = self.tools() else { return "not found".into() };
        let out = Command::new(&run).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let text = out.unwrap_or_default();
        // Hydra: "    Version:   4.0.2"; Open MPI: "mpirun (Open MPI) 4.1.4", or in
        // Debian's 4.1 "mpirun.openmpi (OpenRTE) 4.1.4".
        let line = text.lines().find(|l| l.contains("Version:") || l.contains("Open MPI") || l.contains("(OpenRTE)")).unwrap_or("");
        line.rsplit([' ', ':']).find(|w| !w.is_empty()).unwrap_or("unknown").to_owned()
    }

    /// Builds peer `stem` (`osu_peer`, ...) with this MPI's compiler; `flags` go before `-o`.
    pub fn build(self, stem: &str, flags: &[&str]) -> Result<PathBuf, String> {
        let (cc, _) = self.tools()?;
        let dir = cache_dir();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let src = match PEER_SRC.get().cloned().or_else(|| std::env::var_os("FMX_PEER_SRC").map(PathBuf::from)) {
            Some(d) => d.join(format!("{stem}.c")),
            None => {
                let text = SOURCES.iter().find(|s| s.0 == stem).ok_or_else(|| format!("no peer program {stem}"))?.1;
                let p = dir.join(format!("{stem}.c"));
                std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
                p
            }
        };
        let tag = if self == Mpi::Mpich { "mpich" } else { "openmpi" };
        let out = dir.join(format!("{stem}_{tag}"));
        run(Command::new(cc).arg("-O2").args(flags).arg("-o").arg(&out).arg(&src).arg("-lm"))?;
        Ok(out)
    }
}

/// Where the peers are built: `$XDG_CACHE_HOME/fmx-perf`, `~/.cache/fmx-perf`, or the temp directory.
fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("fmx-perf").join("peers")
}

/// `name` as given if it has a slash, else the first executable of that name on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| runnable(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| runnable(p))
}

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

/// Pins this thread to core `slot` (modulo the cores there are): the core
/// pinned to, or None when the cores cannot be listed or set.
pub fn pin(slot: u32) -> Option<u32> {
    let cores = core_affinity::get_core_ids().filter(|c| !c.is_empty())?;
    let core = cores[slot as usize % cores.len()];
    core_affinity::set_for_current(core).then_some(core.id as u32)
}

/// Starts `np` ranks of this very command line on this host (fmx-perf run
/// alone) and waits for them.
pub fn launch_self(np: u32, transport: Option<String>) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut l = fmx_launcher::Launch::new(np, exe);
    l.args = std::env::args_os().skip(1).collect();
    l.transport = transport;
    if crate::progress::stderr_is_terminal() && std::env::var_os(crate::progress::ENV).is_none() {
        l.env.push((crate::progress::ENV.into(), "tty".into()));
    }
    let o = l.run().map_err(|e| e.to_string())?;
    if o.code == 0 {
        Ok(())
    } else {
        Err(format!("the benchmark ranks failed (exit code {})", o.code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_mpi_is_named_with_the_way_to_get_it() {
        std::env::set_var("FMX_OPENMPI_CC", "/nonexistent/mpicc");
        let e = Mpi::OpenMpi.tools().unwrap_err();
        assert!(e.contains("Open MPI: /nonexistent/mpicc not found") && e.contains("apt-get install openmpi-bin"), "{e}");
        assert!(which("sh").is_some() && which("no-such-program-fmx").is_none());
        assert!(SOURCES.iter().all(|(_, text)| text.contains("MPI_Init")));
    }
}
