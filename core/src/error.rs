//! The one error type of `fmx`.

use fmx_transport::TransportError;

/// Everything that can fail in fmx, with the context that names the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rank outside the communicator.
    #[error("{what}: rank {rank} does not exist in a communicator of size {size}")]
    InvalidRank {
        /// Which argument.
        what: &'static str,
        /// The rank given.
        rank: i64,
        /// The communicator's size.
        size: u32,
    },
    /// A negative or oversized tag.
    #[error("tag {tag} is invalid: tags are 0..={max}")]
    InvalidTag {
        /// The tag given.
        tag: i64,
        /// The largest tag.
        max: u32,
    },
    /// A count or displacement that does not fit the buffer or the communicator.
    #[error("{what}: {detail}")]
    InvalidCount {
        /// Which argument.
        what: &'static str,
        /// What is wrong, with the numbers.
        detail: String,
    },
    /// The message is longer than the receive buffer.
    #[error("message truncated: rank {source_rank} sent {sent} bytes (tag {tag}) but the receive buffer holds {capacity} bytes")]
    Truncated {
        /// Sender's rank in the communicator.
        source_rank: u32,
        /// Tag of the message.
        tag: u32,
        /// Bytes sent.
        sent: u64,
        /// Bytes the buffer holds.
        capacity: u64,
    },
    /// The message length is not a multiple of the receive element size.
    #[error("received {bytes} bytes from rank {source_rank}, not a whole number of {elem_size}-byte elements")]
    PartialElement {
        /// Sender's rank.
        source_rank: u32,
        /// Bytes received.
        bytes: u64,
        /// Size of the element type.
        elem_size: usize,
    },
    /// A peer process is gone while an operation needed it.
    ///
    /// With `pending` (ULFM's `MPI_ERR_PROC_FAILED_PENDING`) the operation is
    /// a receive from any source that other members may still complete: a
    /// [`crate::Scope::wait_mut`] may wait for it again, and it reports each
    /// departed member once.
    #[error("{} is gone while {during}: {reason}{}", who(*rank, *world_rank), if *pending { " (the receive from any source is still pending: it may be waited for again)" } else { "" })]
    PeerGone {
        /// Rank in the communicator of the operation (`u32::MAX` when the
        /// rank is not a member of it).
        rank: u32,
        /// Rank in the world.
        world_rank: u32,
        /// What we were doing.
        during: String,
        /// How it was noticed.
        reason: String,
        /// The operation is still pending (a wildcard receive).
        pending: bool,
    },
    /// The job is failing because of a process this operation does not name
    /// (a rank of another world of a malleable job), or its launcher is gone.
    #[error("the job is failing while {during}: {who} {reason}")]
    JobFailed {
        /// What we were doing.
        during: String,
        /// Which process failed first ("rank 2 of world 1", "the launcher (fmxrun)").
        who: String,
        /// What happened to it.
        reason: String,
    },
    /// The library was finalized.
    #[error("fmx was finalized: {0} is not allowed after finalize")]
    Finalized(&'static str),
    /// A blocking call inside an active-message handler (handlers may not block on the network).
    #[error("{0} inside an active-message handler: handlers may not block on the network (reply through Replies)")]
    InHandler(&'static str),
    /// `init` called twice in one process.
    #[error("fmx is already initialized in this process")]
    AlreadyInitialized,
    /// The launcher's environment is wrong or the bootstrap failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// Bootstrap I/O failed.
    #[error("bootstrap: {what}: {source}")]
    BootstrapIo {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(TransportError),
    /// A request handle that does not belong to this scope or was already completed.
    #[error("request {0} is not pending in this scope")]
    StaleRequest(u32),
    /// Ranks disagreed on a collective's arguments.
    #[error("collective {op}: {detail}")]
    CollectiveMismatch {
        /// The collective.
        op: &'static str,
        /// What disagreed.
        detail: String,
    },
    /// A graph topology's arguments are wrong or disagree between processes.
    #[error("{op}: {detail}")]
    InvalidGraph {
        /// The constructor or neighbourhood collective.
        op: &'static str,
        /// What is wrong: which rank, which edge, which count.
        detail: String,
    },
    /// Launching processes failed.
    #[error("launch: {0}")]
    Launch(String),
    /// An intercommunicator's arguments are wrong, or it is used outside its window.
    #[error("{op}: {detail}")]
    Intercomm {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A reconfiguration (spawn, redistribution, checkpoint) failed.
    #[error("reconfiguration: {0}")]
    Reconfig(String),
}

impl From<TransportError> for Error {
    /// A peer the transport found gone is [`Error::PeerGone`] like any other.
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::PeerGone { peer, reason } => {
                crate::log::peer_lost(peer, &reason, "a transport operation");
                Self::PeerGone { rank: peer, world_rank: peer, during: "a transport operation".into(), reason, pending: false }
            }
            e => Self::Transport(e),
        }
    }
}

impl Error {
    /// The error as a finished operation reports it: a wildcard receive
    /// that was given up is no longer pending.
    pub(crate) fn settled(self) -> Self {
        match self {
            Self::PeerGone { rank, world_rank, during, reason, .. } => Self::PeerGone { rank, world_rank, during, reason, pending: false },
            e => e,
        }
    }
}

fn who(rank: u32, world_rank: u32) -> String {
    if rank == u32::MAX {
        format!("world rank {world_rank} (not in this communicator)")
    } else if rank == world_rank {
        format!("rank {rank}")
    } else {
        format!("rank {rank} (world rank {world_rank})")
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
