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
use crate::peers::{PeerList, RdmaPeer};
use crate::{
    MsgHeader, MsgKind, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome, TransportError, HEADER_BYTES,
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
}

/// What every RDMA endpoint keeps alike.
pub struct RdmaState<P> {
    /// Our index.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
    /// Bytes of a receive slot, header included.
    pub slot_bytes: usize,
    /// The eager pool's shape (FM's credits).
    pub credit: CreditConfig,
    /// Every peer but ourselves.
    pub peers: PeerList<P>,
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

impl<P: RdmaPeer> RdmaState<P> {
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
    /// The device's per-peer record.
    type Peer: RdmaPeer;
    /// What the device keeps for the local side of a one-sided operation
    /// until its report (a registration for the operation, a bounce buffer).
    type Local;
    /// A piece's descriptor of its local memory (an lkey, a libfabric `desc`).
    type Desc: Copy;

    /// The shared state.
    fn state(&mut self) -> &mut RdmaState<Self::Peer>;

    /// The one-sided operations in flight.
    fn operations(&mut self) -> &mut Operations<Self::Local, Self::Desc>;

    /// The largest piece posted as one operation.
    fn max_piece(&self) -> usize;

    /// The local side of an operation on `[local, local+len)` toward `peer`:
    /// the address the device moves from or to (the buffer itself, or a
    /// bounce buffer, filled now for a write), its descriptor, and what to
    /// keep until the report.
    fn local_side(&mut self, peer: PeerId, local: *mut u8, len: usize, read: bool) -> Result<(u64, Self::Desc, Self::Local), TransportError>;

    /// Posts one piece. An error fails the piece's operation.
    fn post_piece(&mut self, piece: &Piece<Self::Desc>) -> Result<Posted, TransportError>;

    /// Ends the local side of a finished operation: copies a bounce buffer
    /// into the user's buffer when a read succeeded, drops a registration.
    fn finish_local(&mut self, id: u64, local: Self::Local, succeeded: bool);

    /// Work the device queued itself and retries before new pieces (the
    /// emulated operations of a libfabric provider without RMA).
    fn before_posting(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Reads the send side's completions: frees what they held, marks peers
    /// whose operations failed dead.
    fn progress(&mut self) -> Result<(), TransportError>;

    /// Writes our credit word into the mailbox of every owed peer (every
    /// live one when `all`); sets `explicit_due` for those the device has no
    /// room for now.
    fn return_credits(&mut self, all: bool) -> Result<(), TransportError>;

    /// Probes `peer` when due (a read or write of its mailbox): a peer on
    /// another host is known dead only when an operation toward it fails.
    fn probe(&mut self, peer: PeerId);

    /// Whether a credit word toward a live peer has not left yet.
    fn words_in_flight(&mut self) -> bool;

    /// `Endpoint::peer_state`.
    fn shared_peer_state(&mut self, peer: PeerId) -> PeerState {
        let st = self.state();
        if peer == st.rank {
            return if st.finalized { PeerState::Finalized } else { PeerState::Alive };
        }
        if peer >= st.size {
            return PeerState::Dead;
        }
        let _ = self.progress(); // completions may tell that it is gone
        let st = self.state();
        if let Some(state) = st.peers.departed(&st.mailbox, peer) {
            return state;
        }
        self.probe(peer); // another host: a failed probe marks it dead
        PeerState::Alive
    }

    /// `Endpoint::reallocate_credits`: once, every peer gets its share.
    fn shared_reallocate_credits(&mut self) -> Result<(), TransportError> {
        let st = self.state();
        if st.reallocated {
            return Ok(());
        }
        st.reallocated = true;
        let credit = st.credit.clone();
        st.peers.reallocate(&credit);
        self.return_credits(true)
    }

    /// `Endpoint::finalize`: tells every peer, through its mailbox word, and
    /// waits (bounded) until those words have left, since after our exit
    /// the device would not send them.
    fn shared_finalize(&mut self) -> Result<(), TransportError> {
        if self.state().finalized {
            return Ok(());
        }
        self.state().finalized = true;
        let deadline = Instant::now() + FINALIZE_WAIT;
        loop {
            self.progress()?;
            self.return_credits(true)?;
            if !self.state().explicit_due || Instant::now() >= deadline {
                break;
            }
            std::thread::yield_now();
        }
        while self.words_in_flight() && Instant::now() < deadline {
            self.progress()?;
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Starts a one-sided operation in pieces of at most [`RdmaDevice::max_piece`];
    /// the pieces the device has no room for wait (never spinning) for the
    /// next [`RdmaDevice::shared_poll_ops`].
    fn shared_one_sided(&mut self, peer: PeerId, remote: &RemoteKey, local: *mut u8, len: usize, read: bool) -> Result<OpStatus, TransportError> {
        let remote = remote.slice(peer, 0, len as u64)?;
        self.state().peers.alive(peer)?;
        if len == 0 {
            return Ok(OpStatus::Done);
        }
        let (base, desc, keep) = self.local_side(peer, local, len, read)?;
        let piece = self.max_piece();
        let id = self.operations().start(peer, base, len, desc, &remote, read, piece, keep);
        self.shared_post_pending()?;
        Ok(OpStatus::Pending(id))
    }

    /// Posts queued pieces while the device takes them; a piece toward a
    /// peer that is gone fails at once.
    fn shared_post_pending(&mut self) -> Result<(), TransportError> {
        self.before_posting()?;
        while let Some(pc) = self.operations().pop() {
            if let Some(reason) = self.state().gone(pc.peer) {
                self.operations().piece_done(pc.op, Some(TransportError::PeerGone { peer: pc.peer, reason }));
                continue;
            }
            match self.post_piece(&pc) {
                Ok(Posted::Yes) => {}
                Ok(Posted::Again) => {
                    self.operations().push_front(pc);
                    return Ok(());
                }
                // Pieces already posted complete later; the operation reports this error then.
                Err(e) => self.operations().piece_done(pc.op, Some(e)),
            }
        }
        Ok(())
    }

    /// `Endpoint::poll_ops`: reads completions, posts what waits, and reports
    /// every finished operation once its local side is ended.
    fn shared_poll_ops<F>(&mut self, mut done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        self.progress()?;
        self.shared_post_pending()?;
        let finished = self.operations().take_done();
        let n = finished.len();
        for f in finished {
            self.finish_local(f.id, f.local, f.result.is_ok());
            done(f.id, f.result);
        }
        Ok(n)
    }
}
