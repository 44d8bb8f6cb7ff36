//! The endpoint core the RDMA transports (verbs, libfabric) share above
//! their device, in the way libfabric's util layer sits under rxm: what a
//! message, a credit and a peer's life mean is decided here once; how bytes
//! reach the wire (a queue pair, an `fi_tsend`) is the device's.
//!
//! A transport keeps an [`RdmaState`] (the job's shape, FM's credits per
//! peer, the mailbox peers write their credit returns into, the messages to
//! ourselves, registration counts) and implements [`RdmaDevice`] for the
//! few things only its device can do: read completions, write a mailbox word,
//! probe a peer. The `Endpoint` methods that are the same on every RDMA
//! device are written once, here ([`endpoint`]: `Endpoint` is implemented for
//! every [`RdmaDevice`]).
//!
//! The trait is sealed: its methods run inside an endpoint's invariants
//! (which completions are read, which words are in flight, which memory a
//! device may touch), so only fmx's transports implement it (through
//! [`sealed::Sealed`], hidden from the docs), and only this core calls it
//! (each method takes a [`sealed::Core`] token that only this crate makes).

use memmap2::MmapMut;

use crate::TransportError;

pub mod connect;
mod device;
pub mod endpoint;
pub mod memory;
mod registry;
mod state;

pub use device::{Posted, RdmaDevice};
pub use memory::{Access, Local, Memory, Registration, DEFAULT_BOUNCE_BYTES};
pub use registry::{Region, Registry};
pub use state::{Admit, EagerConfig, RdmaState};

/// Default eager pool per process, in receive slots (`P`), shared by all peers.
pub const DEFAULT_POOL_SLOTS: u32 = 64;
/// Default bytes per receive slot (header included).
pub const DEFAULT_SLOT_BYTES: usize = 8 << 10;
/// Default newcomer credits (`c0`).
pub const DEFAULT_NEWCOMER_CREDITS: u32 = 2;
/// Control slots per peer (CTS, FIN) beside its data slice.
pub const CTRL_SLOTS: u32 = 2;

/// Maps `bytes` of anonymous memory (at least `min`) for an endpoint's
/// buffers; the error names `what` they are for.
pub fn anonymous(bytes: usize, min: usize, what: &str) -> Result<MmapMut, TransportError> {
    MmapMut::map_anon(bytes.max(min)).map_err(setup_error(what))
}

/// An error of endpoint setup that names what failed.
pub fn setup_error(what: &str) -> impl Fn(std::io::Error) -> TransportError + '_ {
    move |e| TransportError::Setup { what: what.to_owned(), source: e }
}

#[doc(hidden)]
pub mod sealed {
    /// Only fmx's RDMA transports implement [`super::RdmaDevice`].
    pub trait Sealed {}

    /// Proof that a call comes from the core: only this crate makes one, so
    /// only the shared core calls a device's methods (which hold raw memory
    /// and in-flight state that safe code outside must not reach).
    #[derive(Clone, Copy)]
    pub struct Core(pub(super) ());
}

#[cfg(test)]
mod tests;
