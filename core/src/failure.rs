//! The job's first failure, as the launcher tells every rank: ULFM's
//! "revoke" as a notification.
//!
//! fmxrun is the parent of every process, so it sees a death at once (and
//! hears a rank that panics, or that leaves without finalizing while others
//! wait for it). It sends the first failure to every rank. From then on a
//! wait that idles fails with an error naming that rank, even a wait on a
//! live peer: that peer may itself have given up, and the job is ending
//! (fmxrun kills what is left after its grace period). What has already
//! arrived still completes.

use crate::bootstrap::wire::Notice;
use crate::error::Error;

#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// The notice of the job's first failure from the group's server
    /// (fmxrun, or a bridge's rendezvous under Hydra: named here).
    Notice(Notice, &'static str),
    /// The connection to that server closed: it died or was killed.
    LauncherGone(&'static str),
}

impl Failure {
    /// The error an operation that can no longer complete gets (in the
    /// engine's ranks: the communicator localizes it).
    pub(crate) fn error(&self, during: &str) -> Error {
        match self {
            Self::Notice(n, server) => match n.member {
                Some(m) => {
                    let reason = format!("{server} reports that it {} (the job's first failure; every rank is told)", n.reason);
                    crate::log::peer_lost(m, &reason, during);
                    Error::PeerGone { rank: m, world_rank: m, during: during.to_owned(), reason, pending: false }
                }
                None => Error::JobFailed {
                    during: during.to_owned(),
                    who: if n.generation == 0 {
                        format!("rank {} of the first world", n.rank)
                    } else {
                        format!("rank {} of world {}", n.rank, n.generation)
                    },
                    reason: n.reason.clone(),
                },
            },
            Self::LauncherGone(server) => Error::JobFailed {
                during: during.to_owned(),
                who: if *server == "fmxrun" { "the launcher (fmxrun)".into() } else { (*server).into() },
                reason: "closed its connection: it died or was killed".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_names_the_member_or_its_world() {
        let n = Notice { member: Some(3), generation: 0, rank: 3, reason: "was killed by signal 9 (SIGKILL)".into() };
        match Failure::Notice(n, "fmxrun").error("receiving") {
            Error::PeerGone { rank: 3, world_rank: 3, pending: false, reason, .. } => assert!(reason.contains("signal 9"), "{reason}"),
            e => panic!("{e:?}"),
        }
        let n = Notice { member: None, generation: 2, rank: 1, reason: "panicked".into() };
        let e = Failure::Notice(n, "fmxrun").error("a barrier").to_string();
        assert!(e.contains("rank 1 of world 2 panicked") && e.contains("a barrier"), "{e}");
        assert!(Failure::LauncherGone("fmxrun").error("x").to_string().contains("fmxrun"));
    }
}
