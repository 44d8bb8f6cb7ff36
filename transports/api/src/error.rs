//! The one error type of the transport layer.

use crate::PeerId;

/// What went wrong below the communicator. Backpressure is not an error
/// (see [`crate::SendOutcome`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer index is outside the job.
    #[error("peer {peer} does not exist: the job has {size} processes")]
    NoSuchPeer {
        /// The index asked for.
        peer: PeerId,
        /// The number of processes in the job.
        size: u32,
    },
    /// An eager payload larger than the transport's slots.
    #[error("eager payload of {len} bytes exceeds the slot size {max} bytes")]
    EagerTooLarge {
        /// Payload bytes asked for.
        len: usize,
        /// The largest eager payload.
        max: usize,
    },
    /// The peer process is gone (it exited, crashed or was killed).
    #[error("peer {peer} is gone: {reason}")]
    PeerGone {
        /// The peer index.
        peer: PeerId,
        /// How it was noticed.
        reason: String,
    },
    /// A one-sided operation addressed memory the peer did not expose.
    #[error("remote access to peer {peer} out of bounds: {len} bytes at offset {offset} of an exposed region of {region} bytes")]
    RemoteBounds {
        /// The peer index.
        peer: PeerId,
        /// Offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Size of the exposed region.
        region: u64,
    },
    /// A malformed header or control message arrived.
    #[error("malformed message from peer {peer}: {what}")]
    Malformed {
        /// The sending peer.
        peer: PeerId,
        /// What was wrong.
        what: &'static str,
    },
    /// The transport was built without the feature that provides it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Setting up the transport failed (files, mappings, devices).
    #[error("{what}: {source}")]
    Setup {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The device reported a failed work request (retry exceeded, remote
    /// access error, receiver not ready, flushed after an earlier error).
    #[error("{op} with peer {peer} failed on device {device}: {status}")]
    Completion {
        /// The operation (send, RDMA write, RDMA read).
        op: &'static str,
        /// The peer index.
        peer: PeerId,
        /// The device name.
        device: String,
        /// The completion status, as the device named it.
        status: String,
    },
    /// A one-sided or send operation failed in the OS or the device.
    #[error("{op} with peer {peer} failed: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The peer index.
        peer: PeerId,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
