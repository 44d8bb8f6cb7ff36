//! Who we are and how to reach the others: rank, size, and the exchange of
//! endpoint addresses, from whichever launcher started the process.
//!
//! Backends, picked from the environment: `fmxrun` (`FMX_RENDEZVOUS` set);
//! otherwise a lone process is a world of one.

mod fmxrun;
pub(crate) mod wire;

pub use fmxrun::ENV_RENDEZVOUS;

use crate::error::Result;

/// The bootstrap of this process.
pub(crate) enum Bootstrap {
    /// Started alone: a world of one.
    Single,
    /// Started by fmxrun.
    Fmxrun(fmxrun::Client),
}

impl Bootstrap {
    /// Picks the backend from the environment.
    pub(crate) fn from_env() -> Result<Self> {
        if std::env::var_os(ENV_RENDEZVOUS).is_some() {
            Ok(Self::Fmxrun(fmxrun::Client::connect_from_env()?))
        } else {
            Ok(Self::Single)
        }
    }

    pub(crate) fn rank(&self) -> u32 {
        match self {
            Self::Single => 0,
            Self::Fmxrun(c) => c.rank,
        }
    }

    pub(crate) fn size(&self) -> u32 {
        match self {
            Self::Single => 1,
            Self::Fmxrun(c) => c.size,
        }
    }

    /// A job id unique on this host (names shared-memory files).
    pub(crate) fn job_id(&self) -> String {
        match self {
            Self::Single => format!("single{}", std::process::id()),
            Self::Fmxrun(c) => c.job.clone(),
        }
    }

    /// Transport asked for by the launcher, if any.
    pub(crate) fn transport_hint(&self) -> Option<String> {
        std::env::var("FMX_TRANSPORT").ok().filter(|s| !s.is_empty())
    }

    /// Everyone's blob, in rank order.
    pub(crate) fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self {
            Self::Single => Ok(vec![blob.to_vec()]),
            Self::Fmxrun(c) => c.allgather(blob),
        }
    }

    pub(crate) fn barrier(&mut self) -> Result<()> {
        match self {
            Self::Single => Ok(()),
            Self::Fmxrun(c) => c.barrier(),
        }
    }

    pub(crate) fn finalize(&mut self) -> Result<()> {
        match self {
            Self::Single => Ok(()),
            Self::Fmxrun(c) => c.finalize(),
        }
    }
}
