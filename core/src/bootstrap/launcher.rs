//! The one trait under every way of starting fmx. fmxrun, PMI-1 and PMI-2
//! (Hydra, Slurm), PMIx (mpirun, srun --mpi=pmix), a world of one and the
//! program's own bootstrap all implement the public [`UserBootstrap`] (rank,
//! size, nodes, job id, allgather, barrier); [`Launcher`] adds what a process
//! manager can do beyond it, with the defaults of one that cannot.

use std::rc::Rc;

use super::pmi::{SpawnRequest, Watch};
use super::{Link, UserBootstrap};
use crate::error::{Error, Result};

/// A [`UserBootstrap`] method's error.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error of a [`UserBootstrap`] method as fmx's own: the built-in
/// bootstraps return fmx errors (given back as they are), anything else
/// is named as the bootstrap's failure in `call`.
pub(crate) fn fmx_error(e: BoxError, call: &str) -> Error {
    match e.downcast::<Error>() {
        Ok(e) => *e,
        Err(e) => Error::Bootstrap(format!("the bootstrap failed in {call}: {e}")),
    }
}

/// [`UserBootstrap`] for a built-in backend: `rank` and `size` fields,
/// inherent `allgather` and `barrier` that return fmx errors, and the node
/// map and job id given as `|this| expression`.
macro_rules! user_bootstrap_of_backend {
    ($ty:ty, nodes: |$n:ident| $nodes:expr, job_id: |$j:ident| $job:expr) => {
        impl $crate::bootstrap::UserBootstrap for $ty {
            fn rank(&self) -> u32 {
                self.rank
            }
            fn size(&self) -> u32 {
                self.size
            }
            fn nodes(&self) -> Vec<u32> {
                let $n = self;
                $nodes
            }
            fn job_id(&self) -> String {
                let $j = self;
                $job
            }
            fn allgather(&mut self, blob: &[u8]) -> std::result::Result<Vec<Vec<u8>>, $crate::bootstrap::launcher::BoxError> {
                Ok(<$ty>::allgather(self, blob)?)
            }
            fn barrier(&mut self) -> std::result::Result<(), $crate::bootstrap::launcher::BoxError> {
                Ok(<$ty>::barrier(self)?)
            }
        }
    };
}
pub(crate) use user_bootstrap_of_backend;

/// What a process manager adds to [`UserBootstrap`]. The defaults are those
/// of a bootstrap with no process manager behind it.
pub(crate) trait Launcher: UserBootstrap {
    /// Which launcher this is (`Fmx::launcher`).
    fn name(&self) -> &'static str;

    /// The last collective call: a barrier unless the launcher has its own.
    fn finalize(&mut self) -> Result<()> {
        self.barrier().map_err(|e| fmx_error(e, "barrier"))
    }

    /// [`Launcher::finalize`] whose barrier waits for the slowest rank however
    /// long it works, asking `watch` whether a peer died meanwhile (a PMI
    /// reply otherwise has `FMX_PMI_TIMEOUT`; fmxrun watches the ranks itself).
    fn finalize_watching(&mut self, _watch: Watch) -> Result<()> {
        self.finalize()
    }

    /// Whether this world was started by another one's spawn request.
    fn spawned(&self) -> bool {
        false
    }

    /// Asks the process manager to start a new world (one caller).
    fn spawn(&mut self, _req: &SpawnRequest) -> Result<()> {
        Err(Error::Launch(format!("spawn: {} started this process, with no process manager to ask", self.name())))
    }

    /// Asks fmxrun to start a world of `np` ranks (collective); with
    /// `bridge`, the bridge's address and job id come back.
    fn spawn_world(&mut self, _np: u32, _bridge: bool, _values: &str, _generation: u32) -> Result<Option<(String, String)>> {
        Err(Error::Launch(format!(
            "spawn_world: {} started this process; only fmxrun and Hydra (mpiexec, PMI-1) can start a world connected to this one",
            self.name()
        )))
    }

    /// A value the spawning world left for this one.
    fn parent_value(&mut self, _key: &str) -> Result<Option<String>> {
        Ok(None)
    }

    /// Where the launcher's failure notice arrives (fmxrun only: under Hydra,
    /// Slurm and mpirun the process manager ends the job on a failure itself).
    fn link(&self) -> Option<Rc<Link>> {
        None
    }

    /// Tells the launcher that this process is failing with exit code `code`
    /// (best effort, never blocks long).
    fn abort(&self, _code: i32, _why: &str) {}
}

/// A process that no launcher started: a world of one.
pub(crate) struct Single;

impl UserBootstrap for Single {
    fn rank(&self) -> u32 {
        0
    }
    fn size(&self) -> u32 {
        1
    }
    fn nodes(&self) -> Vec<u32> {
        vec![0]
    }
    fn job_id(&self) -> String {
        format!("single{}", std::process::id())
    }
    fn allgather(&mut self, blob: &[u8]) -> std::result::Result<Vec<Vec<u8>>, BoxError> {
        Ok(vec![blob.to_vec()])
    }
    fn barrier(&mut self) -> std::result::Result<(), BoxError> {
        Ok(())
    }
}

impl Launcher for Single {
    fn name(&self) -> &'static str {
        "single"
    }
    fn spawn(&mut self, _req: &SpawnRequest) -> Result<()> {
        Err(Error::Launch("spawn: this process was started alone, with no process manager to ask".into()))
    }
    fn spawn_world(&mut self, _np: u32, _bridge: bool, _values: &str, _generation: u32) -> Result<Option<(String, String)>> {
        Err(Error::Launch("spawn_world: this process was started alone; start it with fmxrun, which acts as the process manager".into()))
    }
}

/// A job id made of what a process manager calls its job: `prefix` and the
/// name with everything but ASCII letters and digits made `_`.
pub(crate) fn job_id_from(prefix: &str, name: &str) -> String {
    format!("{prefix}{}", name.replace(|ch: char| !ch.is_ascii_alphanumeric(), "_"))
}
