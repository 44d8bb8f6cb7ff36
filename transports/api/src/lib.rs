//! # fmx-transport: the boundary every fmx transport implements
//!
//! fmx layers one way: application -> `fmx` (matching, collectives, topology) ->
//! this crate -> one transport (`fmx-shm`, `fmx-verbs`, `fmx-ofi`). A transport
//! knows peers by index ([`PeerId`]) and moves bytes; it never sees
//! communicators, tags or topologies. The [`MsgHeader`]'s `match_bits` and
//! `cookie` are opaque to it.
//!
//! The boundary is shaped after what RDMA hardware does without copies:
//! - **eager** messages go into receiver-owned slots, one slot per message
//!   ([`Endpoint::try_send`]); when the receiver has no free slot for us the
//!   call answers [`SendOutcome::Backpressure`] (not an error) and writes nothing;
//! - **rendezvous** moves a large buffer in one one-sided operation: the owner
//!   exposes it ([`Endpoint::expose`]) and sends the [`RemoteKey`] in a small
//!   control message; the peer then [`Endpoint::read`]s or [`Endpoint::write`]s
//!   it directly (RDMA READ/WRITE, `fi_read`/`fi_write`, `process_vm_readv`);
//! - **receiving**: [`Endpoint::arrivals`] returns received messages as
//!   [`Arrival`]s that stay in their slots (zero-copy for the matcher, read
//!   with [`Endpoint::payload`]) until [`Endpoint::release`] gives the slot
//!   and its credit back; the endpoint is free for other calls meanwhile.
//!
//! Also here: the RDMA endpoint core that verbs and libfabric share
//! ([`rdma`]), the [`header`] codec, the [`pool`] of registered memory
//! (memmap2, optional 2 MiB huge pages with a clean fallback, a registration
//! hook per transport), the [`lend`] table through which the core hands
//! borrowed user buffers to in-flight operations soundly, and a [`loopback`]
//! endpoint (a world of one process) used when no launcher started us.
//!
//! ## Thread safety
//! Endpoints are driven by one thread at a time (`&mut self`); they are `Send`
//! so that a progress thread may own them.

#![warn(missing_docs)]

pub mod credit;
pub mod endpoint;
pub mod error;
pub mod header;
pub mod lend;
pub mod liveness;
pub mod loopback;
pub mod mutate;
pub mod ops;
pub mod own;
pub mod peers;
pub mod pool;
pub mod rdma;
pub mod settings;
pub mod sweep;

pub use endpoint::{Arrival, Connection, Endpoint, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome};
pub use error::TransportError;
pub use header::{MsgHeader, MsgKind, HEADER_BYTES};
