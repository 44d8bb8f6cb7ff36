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
//! device ([`RdmaDevice::shared_peer_state`], [`RdmaDevice::shared_finalize`],
//! ...) are written once, here, over that trait.
//!
//! The trait is sealed: its methods run inside an endpoint's invariants
//! (which completions are read, which words are in flight), so only fmx's
//! transports implement it (through [`sealed::Sealed`], hidden from the docs).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::credit::{Class, CreditConfig, Gate};
use crate::ops::{Operations, Piece};
use crate::own::{OwnQueue, OWN_SLOTS};
use crate::peers::{Peer, PeerList, RdmaPeer};
use crate::{
    Endpoint, MsgHeader, MsgKind, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome, TransportError,
    HEADER_BYTES,
};

/// Default eager pool per process, in receive slots (`P`), shared by all peers.
pub const DEFAULT_POOL_SLOTS: u32 = 64;
/// Default bytes per receive slot (header included).
pub const DEFAULT_SLOT_BYTES: usize = 8 << 10;
/// Default newcomer credits (`c0`).
pub const DEFAULT_NEWCOMER_CREDITS: u32 = 2;
/// Control slots per peer (CTS, FIN) beside its data slice.
pub const CTRL_SLOTS: u32 = 2;

/// How long finalize waits for its last credit words to leave.
const FINALIZE_WAIT: Duration = Duration::from_secs(2);

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

use sealed::Core;

/// The token the core passes to the device.
const CORE: Core = Core(());

/// What every RDMA endpoint keeps alike; `L` is the device's part of a peer.
pub struct RdmaState<L> {
    /// Our index.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
    /// Bytes of a receive slot, header included.
    pub slot_bytes: usize,
    /// The eager pool's shape (FM's credits).
    pub credit: CreditConfig,
    /// Every peer but ourselves.
    pub peers: PeerList<Peer<L>>,
    /// Messages to ourselves.
    pub own: OwnQueue,
    /// Some peer is owed an explicit credit return.
    pub explicit_due: bool,
    /// Every peer got its share of the pool (after the job's shape was known).
    pub reallocated: bool,
    /// We called finalize: our mailbox words say so.
    pub finalized: bool,
    /// Registrations by kind (the total is `registrations`).
    pub stats: RegistrationStats,
    /// Registrations made, shared with the pools' registration hooks.
    pub registrations: Arc<AtomicU64>,
    /// One word per peer: its cumulative credit returns, written by its device.
    pub mailbox: MmapMut,
}

/// What [`RdmaState::admit`] decided about an eager send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Answer the caller now (a message to ourselves went in or met
    /// backpressure; or the peer has no credit for us).
    Answer(SendOutcome),
    /// A credit of this class is there: gather the device's resources, then
    /// take it with [`RdmaState::take_credit`].
    Go(Class),
}

impl<L> RdmaState<L> {
    /// The largest eager payload.
    pub fn max_eager(&self) -> usize {
        self.slot_bytes - HEADER_BYTES
    }

    /// The first half of `try_send`, the same on every RDMA device: checks the
    /// size, serves a message to ourselves, and applies FM's send rule to the
    /// peer (reading the credits it returned when ours are short).
    pub fn admit(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<Admit, TransportError> {
        let max = self.max_eager();
        if payload.len() > max {
            return Err(TransportError::EagerTooLarge { len: payload.len(), max });
        }
        if peer == self.rank {
            return Ok(Admit::Answer(self.own.push(header, payload)));
        }
        let class = Class::of(header.kind);
        if self.peers.alive(peer)?.credits().peek(class) == Gate::Backpressure {
            self.peers.read_mailbox(&self.mailbox, peer);
        }
        Ok(match self.peers.alive(peer)?.credits().peek(class) {
            Gate::Go => Admit::Go(class),
            Gate::Backpressure => Admit::Answer(SendOutcome::Backpressure),
            Gate::NotAllowed => Admit::Answer(SendOutcome::NotAllowed),
        })
    }

    /// Takes the credit [`RdmaState::admit`] saw and returns the header as it
    /// goes on the wire, encoded, carrying the credits we return piggybacked.
    pub fn take_credit(&mut self, peer: PeerId, class: Class, header: &MsgHeader) -> Result<[u8; HEADER_BYTES], TransportError> {
        let credits = self.peers.alive(peer)?.credits();
        let gate = credits.try_take(class);
        debug_assert_eq!(gate, Gate::Go, "admit saw a credit");
        let mut h = *header;
        (h.credits, h.ctrl_credits) = credits.piggyback();
        let mut bytes = [0u8; HEADER_BYTES];
        h.encode(&mut bytes);
        Ok(bytes)
    }

    /// `Endpoint::credit`: whether an eager message to `peer` would go now.
    pub fn credit(&mut self, peer: PeerId) -> SendOutcome {
        if peer == self.rank {
            return self.own.credit();
        }
        self.peers.credit(&self.mailbox, peer)
    }

    /// Takes a received message out of its slot: checks the sender, decodes
    /// the header, takes the credits it returns, and hands it to `sink`
    /// unless it carried only credits. Returns the class of the slot, whose
    /// credit goes back to the sender once the device has reposted it.
    pub fn deliver<F>(&mut self, peer: PeerId, bytes: &[u8], undecodable: &'static str, sink: &mut F) -> Result<Class, TransportError>
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]),
    {
        let Some(Some(p)) = self.peers.get_mut(peer as usize) else {
            return Err(TransportError::Malformed { peer, what: "eager message from a rank that is not a peer" });
        };
        let h = MsgHeader::decode(bytes).map_err(|_| TransportError::Malformed { peer, what: undecodable })?;
        p.credits().on_receive(h.credits, h.ctrl_credits);
        if !matches!(h.kind, MsgKind::Credit | MsgKind::Internal) {
            sink(peer, &h, &bytes[HEADER_BYTES..]);
        }
        Ok(Class::of(h.kind))
    }

    /// The slot `peer` sent into is free again (reposted): its credit goes
    /// back, with the next message or an explicit return.
    pub fn released(&mut self, peer: PeerId, class: Class) {
        if let Some(Some(p)) = self.peers.get_mut(peer as usize) {
            p.credits().on_release(class);
        }
        self.explicit_due = true;
    }

    /// The peers owed a credit return now (every live one when `all`), with
    /// the word to write into their mailbox.
    pub fn owed_returns(&mut self, all: bool) -> Vec<PeerId> {
        let credit = &self.credit;
        (0..self.size)
            .filter(|&r| match self.peers.get_mut(r as usize) {
                Some(Some(p)) => p.life().failure().is_none() && (all || p.credits().wants_explicit(credit)),
                _ => false,
            })
            .collect()
    }

    /// The mailbox word that returns our credits to `peer` (and tells whether
    /// we finalized); counts them as returned.
    pub fn return_word(&mut self, peer: PeerId) -> u64 {
        let finalized = self.finalized;
        let p = self.peers[peer as usize].as_mut().expect("owed_returns names peers");
        let (d, k) = p.credits().explicit();
        crate::credit::mailbox::encode(d, k, finalized)
    }

    /// Counts a registration made for one operation.
    pub fn count_per_operation(&mut self) {
        self.stats.per_operation += 1;
        self.registrations.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a registration of any other kind.
    pub fn count_registration(&self) {
        self.registrations.fetch_add(1, Ordering::Relaxed);
    }

    /// `Endpoint::registration_stats`.
    pub fn registration_stats(&self) -> RegistrationStats {
        RegistrationStats { registrations: self.registrations.load(Ordering::Relaxed), ..self.stats }
    }

    /// `Endpoint::receive_memory`: slots never resize on these devices.
    pub fn receive_memory(&self) -> ReceiveMemory {
        ReceiveMemory::fixed(&self.credit, self.size.saturating_sub(1), self.slot_bytes, OWN_SLOTS)
    }

    /// Why `peer` cannot be reached (`None` while it lives).
    pub fn gone(&self, peer: PeerId) -> Option<String> {
        match self.peers.get(peer as usize) {
            Some(Some(p)) => p.life().failure().map(str::to_owned),
            _ => Some("not a peer of this endpoint".to_owned()),
        }
    }

    /// Marks `peer` dead for `reason` (the first reason stays).
    pub fn mark_dead(&mut self, peer: PeerId, reason: String, flushed: bool) {
        if let Some(Some(p)) = self.peers.get_mut(peer as usize) {
            p.life_mut().mark_dead(reason, flushed);
        }
    }
}

/// Whether the device took an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Posted {
    /// Posted.
    Yes,
    /// No room for now (a full queue, no free context): try again after progress.
    Again,
}

/// A registration that a lookup can hit.
pub trait Region {
    /// The first address it covers.
    fn start(&self) -> u64;
    /// Whether `[addr, addr+len)` lies inside.
    fn covers(&self, addr: u64, len: usize) -> bool;
}

/// Registration by ownership, not by interception: buffers the core
/// allocates and keeps (registered buffers) are registered once, for their
/// lifetime, and looked up here by address. Nothing else is cached, so no
/// malloc/munmap hook is needed and a freed-and-reused address can never hit
/// a stale registration: plain slices are registered per operation or
/// copied through bounce buffers.
pub struct Registry<M> {
    regions: BTreeMap<u64, M>,
}

impl<M> Default for Registry<M> {
    fn default() -> Self {
        Self { regions: BTreeMap::new() }
    }
}

impl<M: Region> Registry<M> {
    /// Keeps a registration until [`Registry::remove`].
    pub fn insert(&mut self, region: M) {
        self.regions.insert(region.start(), region);
    }

    /// Deregisters the buffer starting at `addr` (before its memory is freed).
    pub fn remove(&mut self, addr: u64) {
        self.regions.remove(&addr);
    }

    /// The registration covering `[addr, addr+len)`, if one does.
    pub fn find(&self, addr: u64, len: usize) -> Option<&M> {
        let (_, region) = self.regions.range(..=addr).next_back()?;
        region.covers(addr, len).then_some(region)
    }

    /// Deregisters everything.
    pub fn clear(&mut self) {
        self.regions.clear();
    }
}

/// What only the device can do; the rest of an RDMA endpoint is shared.
pub trait RdmaDevice: sealed::Sealed {
    /// The device's part of a peer (a queue pair, an address).
    type Link;
    /// What the device keeps for the local side of a one-sided operation
    /// until its report (a registration for the operation, a bounce buffer).
    type Local;
    /// A piece's descriptor of its local memory (an lkey, a libfabric `desc`).
    type Desc: Copy;

    /// The shared state.
    fn state(&self) -> &RdmaState<Self::Link>;

    /// The shared state, to change.
    fn state_mut(&mut self, _: Core) -> &mut RdmaState<Self::Link>;

    /// Sends the encoded header and `payload` to `peer`, whose credit the core
    /// has taken (and gives back unless this answers `Sent`): `Backpressure`
    /// when the device has no room for now.
    fn send_eager(&mut self, _: Core, peer: PeerId, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<SendOutcome, TransportError>;

    /// Reads completions of every kind, hands up to `max` received messages
    /// to `sink` through [`RdmaState::deliver`], and reposts their slots
    /// ([`RdmaState::released`]). Returns how many it handed.
    fn receive<F>(&mut self, _: Core, max: usize, sink: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]);

    /// A key through which peers read (or, when `writable`, write) `[ptr, ptr+len)`.
    fn expose_region(&mut self, _: Core, ptr: *mut u8, len: usize, writable: bool) -> Result<RemoteKey, TransportError>;

    /// Ends the exposure behind `key` (copying a bounce buffer peers wrote into).
    fn end_exposure(&mut self, _: Core, key: &RemoteKey);

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

    /// `Endpoint::register_owned`.
    fn register_buffer(&mut self, _: Core, region: &[u8]) -> Result<(), TransportError>;

    /// `Endpoint::deregister_owned`.
    fn deregister_buffer(&mut self, _: Core, region: &[u8]);

    /// The one-sided operations in flight.
    fn operations(&mut self, _: Core) -> &mut Operations<Self::Local, Self::Desc>;

    /// The largest piece posted as one operation.
    fn max_piece(&self) -> usize;

    /// The local side of an operation on `[local, local+len)` toward `peer`:
    /// the address the device moves from or to (the buffer itself, or a
    /// bounce buffer, filled now for a write), its descriptor, and what to
    /// keep until the report.
    fn local_side(
        &mut self,
        _: Core,
        peer: PeerId,
        local: *mut u8,
        len: usize,
        read: bool,
    ) -> Result<(u64, Self::Desc, Self::Local), TransportError>;

    /// Posts one piece. An error fails the piece's operation.
    fn post_piece(&mut self, _: Core, piece: &Piece<Self::Desc>) -> Result<Posted, TransportError>;

    /// Ends the local side of a finished operation: copies a bounce buffer
    /// into the user's buffer when a read succeeded, drops a registration.
    fn finish_local(&mut self, _: Core, id: u64, local: Self::Local, succeeded: bool);

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

/// `Endpoint::peer_state`.
fn shared_peer_state<D: RdmaDevice>(d: &mut D, peer: PeerId) -> PeerState {
    let st = d.state_mut(CORE);
    if peer == st.rank {
        return if st.finalized { PeerState::Finalized } else { PeerState::Alive };
    }
    if peer >= st.size {
        return PeerState::Dead;
    }
    let _ = d.progress(CORE); // completions may tell that it is gone
    let st = d.state_mut(CORE);
    if let Some(state) = st.peers.departed(&st.mailbox, peer) {
        return state;
    }
    d.probe(CORE, peer); // another host: a failed probe marks it dead
    PeerState::Alive
}

/// `Endpoint::reallocate_credits`: once, every peer gets its share.
fn shared_reallocate_credits<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    let st = d.state_mut(CORE);
    if st.reallocated {
        return Ok(());
    }
    st.reallocated = true;
    let credit = st.credit;
    st.peers.reallocate(&credit);
    d.return_credits(CORE, true)
}

/// `Endpoint::finalize`: tells every peer, through its mailbox word, and
/// waits (bounded) until those words have left, since after our exit
/// the device would not send them.
fn shared_finalize<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    if d.state_mut(CORE).finalized {
        return Ok(());
    }
    d.state_mut(CORE).finalized = true;
    let deadline = Instant::now() + FINALIZE_WAIT;
    loop {
        d.progress(CORE)?;
        d.return_credits(CORE, true)?;
        if !d.state_mut(CORE).explicit_due || Instant::now() >= deadline {
            break;
        }
        std::thread::yield_now();
    }
    while d.words_in_flight(CORE) && Instant::now() < deadline {
        d.progress(CORE)?;
        std::thread::yield_now();
    }
    Ok(())
}

/// Starts a one-sided operation in pieces of at most [`RdmaDevice::max_piece`];
/// the pieces the device has no room for wait (never spinning) for the
/// next `Endpoint::poll_ops`.
fn shared_one_sided<D: RdmaDevice>(
    d: &mut D,
    peer: PeerId,
    remote: &RemoteKey,
    local: *mut u8,
    len: usize,
    read: bool,
) -> Result<OpStatus, TransportError> {
    let remote = remote.slice(peer, 0, len as u64)?;
    d.state_mut(CORE).peers.alive(peer)?;
    if len == 0 {
        return Ok(OpStatus::Done);
    }
    let (base, desc, keep) = d.local_side(CORE, peer, local, len, read)?;
    let piece = d.max_piece();
    let id = d.operations(CORE).start(peer, base, len, desc, &remote, read, piece, keep);
    shared_post_pending(d)?;
    Ok(OpStatus::Pending(id))
}

/// Posts queued pieces while the device takes them; a piece toward a
/// peer that is gone fails at once.
fn shared_post_pending<D: RdmaDevice>(d: &mut D) -> Result<(), TransportError> {
    d.before_posting(CORE)?;
    while let Some(pc) = d.operations(CORE).pop() {
        if let Some(reason) = d.state_mut(CORE).gone(pc.peer) {
            d.operations(CORE).piece_done(pc.op, Some(TransportError::PeerGone { peer: pc.peer, reason }));
            continue;
        }
        match d.post_piece(CORE, &pc) {
            Ok(Posted::Yes) => {}
            Ok(Posted::Again) => {
                d.operations(CORE).push_front(pc);
                return Ok(());
            }
            // Pieces already posted complete later; the operation reports this error then.
            Err(e) => d.operations(CORE).piece_done(pc.op, Some(e)),
        }
    }
    Ok(())
}

/// `Endpoint::poll_ops`: reads completions, posts what waits, and reports
/// every finished operation once its local side is ended.
fn shared_poll_ops<D: RdmaDevice, F>(d: &mut D, mut done: F) -> Result<usize, TransportError>
where
    F: FnMut(u64, Result<(), TransportError>),
{
    d.progress(CORE)?;
    shared_post_pending(d)?;
    let finished = d.operations(CORE).take_done();
    let n = finished.len();
    for f in finished {
        d.finish_local(CORE, f.id, f.local, f.result.is_ok());
        done(f.id, f.result);
    }
    Ok(n)
}

/// The endpoint every RDMA device is: the shared core with the device's parts.
impl<D: RdmaDevice + Send> Endpoint for D {
    fn local_id(&self) -> PeerId {
        self.state().rank
    }

    fn num_peers(&self) -> u32 {
        self.state().size
    }

    fn max_eager(&self) -> usize {
        self.state().max_eager()
    }

    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        let st = self.state_mut(CORE);
        let class = match st.admit(peer, header, payload)? {
            Admit::Answer(outcome) => return Ok(outcome),
            Admit::Go(class) => class,
        };
        // The credit and the piggybacked returns count only if the send goes out.
        let saved = st.peers.alive(peer)?.credits.clone();
        let wire = st.take_credit(peer, class, header)?;
        let out = self.send_eager(CORE, peer, &wire, payload);
        if !matches!(out, Ok(SendOutcome::Sent)) {
            if let Some(Some(p)) = self.state_mut(CORE).peers.get_mut(peer as usize) {
                p.credits = saved;
            }
        }
        out
    }

    fn credit(&mut self, peer: PeerId) -> SendOutcome {
        self.state_mut(CORE).credit(peer)
    }

    fn poll<F>(&mut self, max: usize, mut sink: F) -> Result<usize, TransportError>
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]),
    {
        let st = self.state_mut(CORE);
        let rank = st.rank;
        let mut n = st.own.drain(rank, max, &mut sink);
        n += self.receive(CORE, max - n, &mut sink)?;
        shared_post_pending(self)?;
        if self.state().explicit_due {
            self.return_credits(CORE, false)?;
        }
        Ok(n)
    }

    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        // Not writable: the region is only read through this pointer.
        self.expose_region(CORE, buf.as_ptr().cast_mut(), buf.len(), false)
    }

    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        self.expose_region(CORE, buf.as_mut_ptr(), buf.len(), true)
    }

    fn revoke(&mut self, key: &RemoteKey) {
        self.end_exposure(CORE, key);
    }

    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        shared_one_sided(self, peer, remote, local.as_mut_ptr(), local.len(), true)
    }

    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        // A write only reads `local`; the pointer is not written through.
        shared_one_sided(self, peer, remote, local.as_ptr().cast_mut(), local.len(), false)
    }

    fn abandon(&mut self, why: &str) -> bool {
        self.abandon_operations(CORE, why)
    }

    fn poll_ops<F>(&mut self, done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        shared_poll_ops(self, done)
    }

    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        shared_peer_state(self, peer)
    }

    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        shared_reallocate_credits(self)
    }

    fn receive_memory(&self) -> ReceiveMemory {
        self.state().receive_memory()
    }

    fn split_rendezvous(&self) -> bool {
        self.splits_rendezvous()
    }

    fn large_message_path(&self) -> String {
        self.large_path()
    }

    fn register_owned(&mut self, region: &[u8]) -> Result<(), TransportError> {
        self.register_buffer(CORE, region)
    }

    fn deregister_owned(&mut self, region: &[u8]) {
        self.deregister_buffer(CORE, region);
    }

    fn registration_stats(&self) -> RegistrationStats {
        self.state().registration_stats()
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        shared_finalize(self)
    }
}
