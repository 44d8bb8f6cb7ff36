//! Who we are and how to reach the others: rank, size, and the exchange of
//! endpoint addresses, from whichever launcher started the process.
//!
//! Backends, picked from the environment in this order: `fmxrun`
//! (`FMX_RENDEZVOUS` set); a PMI process manager (`PMI_FD` set: Hydra's
//! PMI-1, Slurm's PMI-2); a PMIx server (`PMIX_*` set, in a build with the
//! `pmix` feature: Open MPI's mpirun, `srun --mpi=pmix`); otherwise a lone
//! process is a world of one, unless the environment shows a launcher fmx
//! cannot use (`unclaimed`). Each backend implements the public
//! [`UserBootstrap`], the trait a program's own bootstrap implements, and
//! the crate's `Launcher` for what a process manager adds (`launcher.rs`).

mod fmxrun;
mod hub;
mod launcher;
mod pmi;
#[cfg(feature = "pmix")]
mod pmix;
mod traffic;
mod unclaimed;
mod user;
pub(crate) mod wire;
/// The PMI spawn values a spawned world reads (`spawn::Lineage`).
pub(crate) use pmi::spawn_world as spawn_keys;

pub(crate) use fmxrun::Link;
pub use fmxrun::{ENV_BOOT_TIMEOUT, ENV_RENDEZVOUS};

/// Environment variable with the launcher's pid (ranks die with it).
pub const ENV_LAUNCHER_PID: &str = "FMX_LAUNCHER_PID";

/// Environment variable naming the file a reconfiguration request is read
/// from (fmxrun relays SIGUSR1 as `+1` and SIGUSR2 as `-1` into it).
pub const ENV_RECONFIG_REQUEST: &str = "FMX_RECONFIG_REQUEST";
pub use pmi::SpawnRequest;
pub use traffic::BootstrapExchange;
pub use user::UserBootstrap;

use crate::error::{Error, Result};
use launcher::Launcher;

/// Which launcher started this process and what fmx would do under it, in
/// words (for fmx-info); reads the environment only.
pub(crate) fn describe_launcher() -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(addr) = fmx_transport::settings::var(ENV_RENDEZVOUS) {
        let (r, n) = (fmx_transport::settings::var("FMX_RANK"), fmx_transport::settings::var("FMX_SIZE"));
        format!("fmxrun (bootstrap at {addr}; rank {} of {})", r.as_deref().unwrap_or("?"), n.as_deref().unwrap_or("?"))
    } else if let Some(fd) = env("PMI_FD") {
        let v = fmx_transport::settings::var(pmi::ENV_PMI).unwrap_or_else(|| "auto".into());
        format!(
            "a PMI process manager (PMI_FD={fd}, PMI_RANK={}, FMX_PMI={v}: Hydra answers PMI-1, Slurm PMI-2)",
            env("PMI_RANK").as_deref().unwrap_or("?")
        )
    } else if cfg!(feature = "pmix") && pmix_started() {
        format!(
            "a PMIx server (PMIX_NAMESPACE={}, PMIX_RANK={})",
            env("PMIX_NAMESPACE").as_deref().unwrap_or("?"),
            env("PMIX_RANK").as_deref().unwrap_or("?")
        )
    } else if let Some(why) = unclaimed::unusable_launcher(|k| std::env::var(k).ok()) {
        format!("refused: {why}")
    } else {
        "none: a process started alone is a world of one (start jobs with fmxrun, mpiexec.hydra or srun --mpi=pmi2)".into()
    }
}

/// Whether a launcher started this process: fmxrun, a PMI or (in a build
/// with `pmix`) PMIx process manager, or one that `init` would refuse. Then
/// `fmx::init` joins that job or fails; otherwise it makes a world of one.
/// Programs that start their own ranks when run alone (fmx-perf) ask this
/// first, so that under `mpiexec`, `srun` or `mpirun` they measure instead.
pub fn started_by_launcher() -> bool {
    fmx_transport::settings::is_set(ENV_RENDEZVOUS)
        || std::env::var_os("PMI_FD").is_some()
        || pmix_started()
        || unclaimed::unusable_launcher(|k| std::env::var(k).ok()).is_some()
}

/// The bootstrap of this process: whichever [`Launcher`] started it, the
/// node map as the transport's selection refined it, and what went through it.
pub(crate) struct Bootstrap {
    launcher: Box<dyn Launcher>,
    refined: Option<Vec<u32>>,
    exchanges: Vec<BootstrapExchange>,
}

impl Bootstrap {
    fn over(launcher: Box<dyn Launcher>) -> Self {
        Self { launcher, refined: None, exchanges: Vec::new() }
    }

    /// Picks the backend from the environment.
    pub(crate) fn from_env() -> Result<Self> {
        if fmx_transport::settings::is_set(ENV_RENDEZVOUS) {
            Ok(Self::over(Box::new(fmxrun::Client::connect_from_env()?)))
        } else if std::env::var_os("PMI_FD").is_some() {
            Ok(Self::over(Box::new(pmi::Client::connect_from_env()?)))
        } else if pmix_started() {
            Self::from_pmix()
        } else if let Some(why) = unclaimed::unusable_launcher(|k| std::env::var(k).ok()) {
            Err(Error::Bootstrap(why))
        } else {
            Ok(Self::over(Box::new(launcher::Single)))
        }
    }

    /// The program's bootstrap, checked.
    pub(crate) fn user(b: Box<dyn UserBootstrap>) -> Result<Self> {
        Ok(Self::over(Box::new(user::User::new(b)?)))
    }

    /// Joins a bridge group (two worlds at once) served by fmxrun at `addr`.
    pub(crate) fn bridge(addr: &str, rank: u32, size: u32, job: String) -> Result<Self> {
        Ok(Self::over(Box::new(fmxrun::Client::connect(addr, rank, size, job)?)))
    }

    /// Joins a bridge group that the old world's rank 0 serves (`hub`:
    /// under a PMI process manager).
    pub(crate) fn bridge_by_hub(addr: &str, rank: u32, size: u32, job: String) -> Result<Self> {
        Ok(Self::over(Box::new(fmxrun::Client::connect_to(addr, rank, size, job, fmxrun::HUB)?)))
    }

    pub(crate) fn rank(&self) -> u32 {
        self.launcher.rank()
    }

    pub(crate) fn size(&self) -> u32 {
        self.launcher.size()
    }

    /// A job id unique on this host (names shared-memory files).
    pub(crate) fn job_id(&self) -> String {
        self.launcher.job_id()
    }

    /// Node index of every rank (all 0 when every rank shares this host):
    /// the launcher's map, or the refined one once the transport was chosen.
    pub(crate) fn nodes(&self) -> Vec<u32> {
        self.refined.clone().unwrap_or_else(|| self.launcher.nodes())
    }

    /// The node map as host identities refined it (ranks the launcher put on
    /// one node that run on different hosts, namespaces or containers):
    /// what `Fmx::locality` and placement report from now on.
    pub(crate) fn refine_nodes(&mut self, nodes: Vec<u32>) {
        self.refined = Some(nodes);
    }

    /// Transport asked for by the launcher, if any.
    pub(crate) fn transport_hint(&self) -> Option<String> {
        fmx_transport::settings::var("FMX_TRANSPORT")
    }

    /// Everyone's blob, in rank order; `what` names the exchange in
    /// [`Bootstrap::exchanges`].
    pub(crate) fn allgather(&mut self, what: &'static str, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.launcher.allgather(blob).map_err(|e| launcher::fmx_error(e, "allgather"))?;
        self.exchanges.push(BootstrapExchange::of(what, self.rank(), blob, &all));
        Ok(all)
    }

    /// Every allgather so far, in order.
    pub(crate) fn exchanges(&self) -> &[BootstrapExchange] {
        &self.exchanges
    }

    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.launcher.barrier().map_err(|e| launcher::fmx_error(e, "barrier"))
    }

    /// [`Launcher::finalize_watching`].
    pub(crate) fn finalize_watching(&mut self, watch: pmi::Watch) -> Result<()> {
        self.launcher.finalize_watching(watch)
    }

    /// [`Launcher::link`].
    pub(crate) fn link(&self) -> Option<std::rc::Rc<Link>> {
        self.launcher.link()
    }

    /// [`Launcher::abort`].
    pub(crate) fn abort(&self, code: i32, why: &str) {
        self.launcher.abort(code, why);
    }

    /// Which launcher this is, for messages and `Fmx::launcher`.
    pub(crate) fn name(&self) -> &'static str {
        self.launcher.name()
    }

    /// Whether this world was started by another one's spawn request.
    pub(crate) fn spawned(&self) -> bool {
        self.launcher.spawned()
    }

    /// Asks the process manager to start a new world.
    pub(crate) fn spawn(&mut self, req: &SpawnRequest) -> Result<()> {
        self.launcher.spawn(req)
    }

    /// [`Launcher::spawn_world`].
    pub(crate) fn spawn_world(&mut self, np: u32, bridge: bool, values: &str, generation: u32) -> Result<Option<(String, String)>> {
        self.launcher.spawn_world(np, bridge, values, generation)
    }

    /// A value left by the world that spawned this one.
    pub(crate) fn parent_value(&mut self, key: &str) -> Result<Option<String>> {
        self.launcher.parent_value(key)
    }
}

/// A PMIx server started this process (its variables are set). Without the
/// `pmix` feature this is never taken: `unclaimed` refuses such a process.
fn pmix_started() -> bool {
    #[cfg(feature = "pmix")]
    return pmix::started_by_pmix();
    #[cfg(not(feature = "pmix"))]
    false
}

impl Bootstrap {
    #[cfg(feature = "pmix")]
    fn from_pmix() -> Result<Self> {
        Ok(Self::over(Box::new(pmix::Client::connect_from_env()?)))
    }

    #[cfg(not(feature = "pmix"))]
    fn from_pmix() -> Result<Self> {
        unreachable!("pmix_started() is false without the pmix feature")
    }
}

/// In a rank: die with the launcher (no orphans), and refuse to start if it is already gone.
pub(crate) fn watch_launcher() -> Result<()> {
    let Some(pid) = fmx_transport::settings::var(ENV_LAUNCHER_PID) else {
        return Ok(());
    };
    let Ok(pid) = pid.parse::<i32>() else {
        return Err(Error::Bootstrap(format!("{ENV_LAUNCHER_PID}={pid:?} is not a pid")));
    };
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| Error::Bootstrap(format!("PR_SET_PDEATHSIG: {e}")))?;
    match rustix::process::getppid().map(|p| i32::from(p.as_raw_nonzero())) {
        Some(parent) if parent == pid => Ok(()),
        // Our parent is outside our PID namespace (a wrapper such as
        // `unshare --pid --fork` started us): there is nothing to compare,
        // and the wrapper's own death signal ties us to it.
        None => Ok(()),
        // A wrapper that forks stands between fmxrun and us: fine while fmxrun
        // lives. Otherwise we were reparented because fmxrun died before the
        // death signal was set.
        Some(_) if rustix::process::Pid::from_raw(pid).is_some_and(|p| launcher_alive(p)) => Ok(()),
        Some(_) => Err(Error::Bootstrap(format!("the launcher (pid {pid}) is gone"))),
    }
}

fn launcher_alive(pid: rustix::process::Pid) -> bool {
    // EPERM: it exists but is not ours to signal.
    matches!(rustix::process::test_kill_process(pid), Ok(()) | Err(rustix::io::Errno::PERM))
}
