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
    #[error("rank {rank} (world rank {world_rank}) is gone while {during}: {reason}")]
    PeerGone {
        /// Rank in the communicator of the operation.
        rank: u32,
        /// Rank in the world.
        world_rank: u32,
        /// What we were doing.
        during: String,
        /// How it was noticed.
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
    Transport(#[from] TransportError),
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

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
