//! The PMIx client (cargo feature `pmix`): Open MPI's `mpirun`, `srun
//! --mpi=pmix`, PRRTE. Chosen at run time when the process has no
//! `FMX_RENDEZVOUS` and no `PMI_FD` but the PMIx server's variables
//! (`PMIX_NAMESPACE`, `PMIX_RANK`, `PMIX_SERVER_URI*`).
//!
//! Addresses travel by `PMIx_Put`, `PMIx_Commit`, a `PMIx_Fence` that
//! collects data, then `PMIx_Get`. No node-level packing as under PMI-2: a
//! collecting fence already moves one blob per node between the servers,
//! and every get after it is answered from the local server's cache.

use std::time::{Duration, Instant};

use super::pmi::{SpawnRequest, Watch, ENV_PMI_TIMEOUT};
use crate::error::{Error, Result};

/// The environment variable that carries a spawning world's values to the
/// spawned one (`NAME=value` lines).
const ENV_PARENT_VALUES: &str = "FMX_PMIX_PARENT_VALUES";

/// Whether the environment shows a PMIx server that started this process.
pub(crate) fn started_by_pmix() -> bool {
    ["PMIX_NAMESPACE", "PMIX_RANK", "PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// A connected PMIx client.
pub(crate) struct Client {
    pmix: fmx_pmix::Client,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) job: String,
    pub(crate) nodes: Vec<u32>,
    pub(crate) spawned: bool,
    timeout: Duration,
    rounds: u32,
}

fn pmix_error(e: &fmx_pmix::Error) -> Error {
    Error::Bootstrap(format!("PMIx: {e}"))
}

impl Client {
    /// `PMIx_Init`, then rank, size and where every rank runs.
    pub(crate) fn connect_from_env() -> Result<Self> {
        let timeout = super::pmi::timeout_from_env()?;
        let pmix = fmx_pmix::Client::init().map_err(|e| {
            Error::Bootstrap(format!(
                "the environment shows a PMIx launcher (PMIX_* variables) but {e}: is the process manager still running?"
            ))
        })?;
        let rank = pmix.rank();
        let size = pmix.job_size().map_err(|e| pmix_error(&e))?;
        if rank >= size {
            return Err(Error::Bootstrap(format!("PMIx says rank {rank} of a job of {size} processes")));
        }
        let nodes = pmix.nodes(size).map_err(|e| pmix_error(&e))?;
        let job = pmix.nspace().to_string();
        // Open MPI 4.1's mpirun sets neither PMIX_SPAWNED nor PMIX_PARENT_ID in
        // the new job; the variable fmx's own spawn passes is the sure sign.
        let spawned = pmix.spawned() || std::env::var_os(ENV_PARENT_VALUES).is_some();
        Ok(Self { pmix, rank, size, job, nodes, spawned, timeout, rounds: 0 })
    }

    /// Waits for a fence: up to the PMI timeout, or with `watch` as long as
    /// the slowest rank takes, asking every second whether a peer died.
    fn fence(&self, collect: bool, mut watch: Option<&mut Watch>) -> Result<()> {
        let f = self.pmix.fence_start(collect).map_err(|e| pmix_error(&e))?;
        let start = Instant::now();
        let mut next_watch = start + Duration::from_secs(1);
        let mut nap = Duration::from_micros(20);
        loop {
            if let Some(r) = f.poll() {
                return r.map_err(|e| pmix_error(&e));
            }
            let now = Instant::now();
            match watch.as_deref_mut() {
                Some(w) if now >= next_watch => {
                    if let Some(e) = w() {
                        return Err(e);
                    }
                    next_watch = now + Duration::from_secs(1);
                }
                Some(_) => {}
                None if now - start > self.timeout => {
                    return Err(Error::Bootstrap(format!(
                        "PMIx_Fence: not every rank arrived within {} s ({ENV_PMI_TIMEOUT}); a rank may have died or be stuck",
                        self.timeout.as_secs()
                    )));
                }
                None => {}
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// Everyone's blob, in rank order.
    pub(crate) fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.rounds += 1;
        let key = format!("fmx.ag.{}", self.rounds);
        self.pmix.put(&key, blob).map_err(|e| pmix_error(&e))?;
        self.pmix.commit().map_err(|e| pmix_error(&e))?;
        self.fence(true, None)?;
        let secs = self.timeout.as_secs() as u32;
        (0..self.size).map(|r| self.pmix.get_bytes(r, &key, secs).map_err(|e| pmix_error(&e))).collect()
    }

    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.fence(false, None)
    }

    /// The finalize barrier: waits for the slowest rank however long it
    /// works, asking `watch` whether a peer died meanwhile.
    pub(crate) fn finalize_watching(&mut self, mut watch: Watch) -> Result<()> {
        self.fence(false, Some(&mut watch))
    }

    /// A value the spawning world left for this one.
    pub(crate) fn parent_value(&self, key: &str) -> Option<String> {
        let all = std::env::var(ENV_PARENT_VALUES).ok()?;
        all.lines().find_map(|l| l.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v.to_string()))
    }

    /// `PMIx_Spawn` of a new world, the values passed in its environment.
    pub(crate) fn spawn(&mut self, req: &SpawnRequest) -> Result<()> {
        let mut values = String::new();
        for (k, v) in &req.values {
            if k.is_empty() || k.contains(['=', '\n', '\0']) || v.contains(['\n', '\0']) {
                return Err(Error::Launch(format!(
                    "spawn: value {k:?} = {v:?}: keys may not be empty or hold '=', and neither may hold a newline or NUL"
                )));
            }
            values.push_str(&format!("{k}={v}\n"));
        }
        let env = vec![format!("{ENV_PARENT_VALUES}={values}")];
        match self.pmix.spawn(&req.program, &req.args, &env, req.nprocs) {
            Ok(_) => Ok(()),
            Err(e) if e.not_supported() => Err(Error::Launch(format!(
                "spawn is not supported by this PMIx server ({e}); Open MPI's mpirun and Hydra (mpiexec) can spawn"
            ))),
            Err(e) => Err(Error::Launch(format!("spawn: {e}"))),
        }
    }
}

super::launcher::user_bootstrap_of_backend!(Client, nodes: |c| c.nodes.clone(), job_id: |c| super::launcher::job_id_from("pmix", &c.job));

impl super::launcher::Launcher for Client {
    fn name(&self) -> &'static str {
        "PMIx"
    }
    fn finalize_watching(&mut self, watch: Watch) -> Result<()> {
        Client::finalize_watching(self, watch)
    }
    fn spawned(&self) -> bool {
        self.spawned
    }
    fn spawn(&mut self, req: &SpawnRequest) -> Result<()> {
        Client::spawn(self, req)
    }
    fn parent_value(&mut self, key: &str) -> Result<Option<String>> {
        Ok(Client::parent_value(self, key))
    }
}
