//! What only the device can do.

use super::memory::{Access, Local, Memory, Registration};
use super::sealed::{Core, Sealed};
use super::RdmaState;
use crate::ops::{Operations, Piece};
use crate::pool::RegistrationHook;
use crate::{Arrival, PeerId, RemoteKey, SendOutcome, TransportError, HEADER_BYTES};

/// Whether the device took an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Posted {
    /// Posted.
    Yes,
    /// No room for now (a full queue, no free context): try again after progress.
    Again,
}

/// What only the device can do; the rest of an RDMA endpoint is shared.
pub trait RdmaDevice: Sealed {
    /// The device's part of a peer (a queue pair, an address).
    type Link;
    /// A piece's descriptor of its local memory (an lkey, a libfabric `desc`).
    type Desc: Copy;
    /// A registration of the device (an `ibv_mr`, a `fid_mr`).
    type Mr: Registration<Desc = Self::Desc>;
    /// Registers the bounce buffers' chunks.
    type Hook: RegistrationHook<Handle = Self::Mr>;

    /// The shared state.
    fn state(&self) -> &RdmaState<Self::Link>;

    /// The shared state, to change.
    fn state_mut(&mut self, _: Core) -> &mut RdmaState<Self::Link>;

    /// Sends the encoded header and `payload` to `peer`, whose credit the core
    /// has taken (and gives back unless this answers `Sent`): `Backpressure`
    /// when the device has no room for now.
    fn send_eager(&mut self, _: Core, peer: PeerId, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<SendOutcome, TransportError>;

    /// Reads completions of every kind and appends up to `max` received
    /// messages to `out` ([`RdmaState::arrive`]), leaving them in their slots;
    /// a message only for the device is released at once. Returns how many
    /// it appended.
    fn receive(&mut self, _: Core, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError>;

    /// Posts receive slots `slots`, granted to `peer` ([`RdmaState::grant`]).
    fn post_slots(&mut self, _: Core, peer: PeerId, slots: std::ops::Range<usize>) -> Result<(), TransportError>;

    /// Reposts `arrival`'s slot, then gives its credit back ([`RdmaState::released`]).
    fn release_slot(&mut self, _: Core, arrival: Arrival) -> Result<(), TransportError>;

    /// `Endpoint::abandon`: the device cannot end its operations by itself unless it says so.
    fn abandon_operations(&mut self, _: Core, why: &str) -> bool {
        let _ = why;
        false
    }

    /// `Endpoint::split_rendezvous`.
    fn splits_rendezvous(&self) -> bool {
        true
    }

    /// `Endpoint::large_message_path`.
    fn large_path(&self) -> String;

    /// The one-sided operations in flight.
    fn operations(&mut self, _: Core) -> &mut Operations<Local<Self::Mr>, Self::Desc>;

    /// Registrations, exposures and bounce buffers ([`Memory`] decides which serves).
    fn memory(&mut self, _: Core) -> &mut Memory<Self::Hook>;

    /// Registers `[ptr, ptr+len)` for `access`; an error names `peer` (the
    /// operation's, or ours for an exposure or an owned buffer).
    fn register(&mut self, _: Core, peer: PeerId, ptr: *const u8, len: usize, access: Access) -> Result<Self::Mr, TransportError>;

    /// Exposes through the device's own protocol when it has no RMA (a
    /// libfabric provider without `FI_RMA` serves reads itself); `None`: it has RMA.
    fn expose_without_rma(&mut self, _: Core, ptr: *mut u8, len: usize, writable: bool) -> Option<Result<RemoteKey, TransportError>> {
        let _ = (ptr, len, writable);
        None
    }

    /// Ends an exposure made by `expose_without_rma`; `false`: it was not one.
    fn end_exposure_without_rma(&mut self, _: Core, key: &RemoteKey) -> bool {
        let _ = key;
        false
    }

    /// The largest piece posted as one operation.
    fn max_piece(&self) -> usize;

    /// Posts one piece. An error fails the piece's operation.
    fn post_piece(&mut self, _: Core, piece: &Piece<Self::Desc>) -> Result<Posted, TransportError>;

    /// A finished operation's local side has ended (the device forgets what it kept for `id`).
    fn operation_ended(&mut self, _: Core, id: u64) {
        let _ = id;
    }

    /// Work the device queued itself and retries before new pieces (the
    /// emulated operations of a libfabric provider without RMA).
    fn before_posting(&mut self, _: Core) -> Result<(), TransportError> {
        Ok(())
    }

    /// Reads the send side's completions: frees what they held, marks peers
    /// whose operations failed dead.
    fn progress(&mut self, _: Core) -> Result<(), TransportError>;

    /// Writes our credit word into the mailbox of every owed peer (every
    /// live one when `all`); sets `explicit_due` for those the device has no
    /// room for now.
    fn return_credits(&mut self, _: Core, all: bool) -> Result<(), TransportError>;

    /// Probes `peer` when due (a read or write of its mailbox): a peer on
    /// another host is known dead only when an operation toward it fails.
    fn probe(&mut self, _: Core, peer: PeerId);

    /// Whether a credit word toward a live peer has not left yet.
    fn words_in_flight(&mut self, _: Core) -> bool;
}
