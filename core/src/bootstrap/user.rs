//! A bootstrap the program supplies: fmx inside a job that something else
//! started (an MPI job, a scheduler's own wire-up), as NCCL and UCC are
//! bootstrapped. fmx needs only who is who, an allgather of bytes and a
//! barrier; spawning and failure notices stay with whatever started the job.

use super::launcher::Launcher;
use super::pmi::SpawnRequest;

/// What a program gives [`crate::init_with_bootstrap`] so that fmx can start
/// inside its job. Every method but the first three is collective: all ranks
/// call it, in the same order.
pub trait UserBootstrap {
    /// This process's rank, below [`UserBootstrap::size`].
    fn rank(&self) -> u32;
    /// The number of processes.
    fn size(&self) -> u32;
    /// The node of every rank, in rank order: ranks with the same number
    /// share a host (and shared memory). All zeros when every rank is on this host.
    fn nodes(&self) -> Vec<u32>;
    /// A name unique to this job among the jobs on each host, made of ASCII
    /// letters, digits and `_` (shared-memory files are named after it).
    fn job_id(&self) -> String;
    /// Every rank's `blob`, in rank order (collective).
    fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error + Send + Sync>>;
    /// Returns once every rank has called it (collective).
    fn barrier(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// The program's bootstrap, checked once, its errors made fmx errors.
pub(crate) struct User {
    inner: Box<dyn UserBootstrap>,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) nodes: Vec<u32>,
    pub(crate) job: String,
}

impl User {
    pub(crate) fn new(inner: Box<dyn UserBootstrap>) -> crate::Result<Self> {
        let (rank, size, nodes, job) = (inner.rank(), inner.size(), inner.nodes(), inner.job_id());
        let bad = |what: String| Err(crate::Error::Bootstrap(format!("the program's bootstrap {what}")));
        if size == 0 || rank >= size {
            return bad(format!("says rank {rank} of {size} processes: the rank must be below the size"));
        }
        if nodes.len() != size as usize {
            return bad(format!("gives the nodes of {} ranks for a job of {size}", nodes.len()));
        }
        if job.is_empty() || job.len() > 64 || !job.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad(format!("gives job id {job:?}: 1 to 64 ASCII letters, digits or '_' (it names shared-memory files)"));
        }
        Ok(Self { inner, rank, size, nodes, job })
    }

    pub(crate) fn allgather(&mut self, blob: &[u8]) -> crate::Result<Vec<Vec<u8>>> {
        let all =
            self.inner.allgather(blob).map_err(|e| crate::Error::Bootstrap(format!("the program's bootstrap failed in allgather: {e}")))?;
        if all.len() != self.size as usize {
            return Err(crate::Error::Bootstrap(format!(
                "the program's bootstrap's allgather returned {} blobs for a job of {}",
                all.len(),
                self.size
            )));
        }
        Ok(all)
    }

    pub(crate) fn barrier(&mut self) -> crate::Result<()> {
        self.inner.barrier().map_err(|e| crate::Error::Bootstrap(format!("the program's bootstrap failed in barrier: {e}")))
    }
}

super::launcher::user_bootstrap_of_backend!(User, nodes: |u| u.nodes.clone(), job_id: |u| format!("user{}", u.job));

impl Launcher for User {
    fn name(&self) -> &'static str {
        "program"
    }
    fn spawn(&mut self, _req: &SpawnRequest) -> crate::Result<()> {
        Err(crate::Error::Launch("spawn: fmx was started through the program's bootstrap, which has no process manager to ask".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::{User, UserBootstrap};

    struct Fixed {
        rank: u32,
        size: u32,
        nodes: usize,
        job: &'static str,
    }

    impl UserBootstrap for Fixed {
        fn rank(&self) -> u32 {
            self.rank
        }
        fn size(&self) -> u32 {
            self.size
        }
        fn nodes(&self) -> Vec<u32> {
            vec![0; self.nodes]
        }
        fn job_id(&self) -> String {
            self.job.into()
        }
        fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Box<dyn std::error::Error + Send + Sync>> {
            Ok(vec![blob.to_vec()]) // one blob whatever the size: wrong for size 2
        }
        fn barrier(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            Ok(())
        }
    }

    fn check(b: Fixed) -> Result<User, String> {
        User::new(Box::new(b)).map_err(|e| e.to_string())
    }

    #[test]
    fn what_a_programs_bootstrap_gets_wrong_is_named() {
        let e = check(Fixed { rank: 2, size: 2, nodes: 2, job: "j" }).err().unwrap();
        assert!(e.contains("says rank 2 of 2 processes"), "{e}");
        let e = check(Fixed { rank: 0, size: 3, nodes: 2, job: "j" }).err().unwrap();
        assert!(e.contains("the nodes of 2 ranks for a job of 3"), "{e}");
        let e = check(Fixed { rank: 0, size: 1, nodes: 1, job: "a/b" }).err().unwrap();
        assert!(e.contains("job id \"a/b\""), "{e}");
        let mut u = check(Fixed { rank: 1, size: 2, nodes: 2, job: "job_7" }).unwrap();
        let e = u.allgather(b"x").err().unwrap().to_string();
        assert!(e.contains("returned 1 blobs for a job of 2"), "{e}");
    }
}
