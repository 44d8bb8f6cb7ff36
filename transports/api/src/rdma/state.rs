//! What every RDMA endpoint keeps alike, and the eager pool's settings.

use memmap2::MmapMut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::connect::{Connections, CONNECT_REQUEST};
use super::{CTRL_SLOTS, DEFAULT_NEWCOMER_CREDITS, DEFAULT_POOL_SLOTS, DEFAULT_SLOT_BYTES};
use crate::credit::{Class, CreditConfig, Gate};
use crate::own::{OwnQueue, OWN_SLOTS};
use crate::peers::{Peer, PeerList, RdmaPeer};
use crate::settings::{env_limited, limits, ConnectMode};
use crate::{Arrival, MsgHeader, MsgKind, PeerId, ReceiveMemory, RegistrationStats, SendOutcome, TransportError, HEADER_BYTES};

/// The eager pool's settings, alike on every RDMA device.
#[derive(Clone, Debug)]
pub struct EagerConfig {
    /// Our index.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
    /// Eager pool slots (`P`).
    pub pool: u32,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// Newcomer credits (`c0`).
    pub newcomer: u32,
    /// Owed credits that trigger an explicit return (`None`: half the slice).
    pub threshold: Option<u32>,
    /// When connections are made (`FMX_CONNECT`; `None`: the device's default).
    pub connect: Option<ConnectMode>,
    /// Connections made on demand: the eager slots each new connection is
    /// granted (its slice) while the pool (`pool`, then the cap) has room.
    pub conn_slots: u32,
}

impl EagerConfig {
    /// Defaults, overridden by `FMX_POOL_SLOTS`, `FMX_SLOT_BYTES`,
    /// `FMX_NEWCOMER_CREDITS` and `FMX_CREDIT_THRESHOLD`.
    pub fn from_env(rank: u32, size: u32) -> Result<Self, TransportError> {
        Ok(Self {
            rank,
            size,
            pool: env_limited("FMX_POOL_SLOTS", limits::POOL_SLOTS)?.map_or(DEFAULT_POOL_SLOTS, |n| n as u32),
            slot_bytes: env_limited("FMX_SLOT_BYTES", limits::SLOT_BYTES)?.unwrap_or(DEFAULT_SLOT_BYTES),
            newcomer: env_limited("FMX_NEWCOMER_CREDITS", limits::NEWCOMER_CREDITS)?.map_or(DEFAULT_NEWCOMER_CREDITS, |n| n as u32),
            threshold: env_limited("FMX_CREDIT_THRESHOLD", limits::CREDIT_THRESHOLD)?.map(|n| n as u32),
            connect: ConnectMode::from_env()?,
            conn_slots: env_limited("FMX_CONNECTION_SLOTS", limits::CONNECTION_SLOTS)?.map_or(DEFAULT_CONNECTION_SLOTS, |n| n as u32),
        })
    }

    /// Whether connections are made on demand.
    pub fn lazy(&self) -> bool {
        self.connect == Some(ConnectMode::Lazy)
    }

    /// FM's credits for this pool: eagerly, the pool shared by every peer of
    /// the job (checked against its size); lazily, one connection's slice.
    pub fn credits(&self) -> Result<CreditConfig, TransportError> {
        if self.lazy() {
            let slice = self.conn_slots.min(self.pool).max(1);
            return CreditConfig::for_transport(slice, 1, self.newcomer, self.threshold, CTRL_SLOTS, "FMX_CONNECTION_SLOTS");
        }
        CreditConfig::for_transport(self.pool, self.size.saturating_sub(1), self.newcomer, self.threshold, CTRL_SLOTS, "FMX_POOL_SLOTS")
    }

    /// Receive slots there may ever be: eagerly, the eager pool and the
    /// control slots of every peer (all posted at init); lazily, the most
    /// that connections to every peer could be granted ([`Grants`]: the
    /// pool, then the newcomer credits of each connection beyond it), of
    /// which only the connections' are registered and posted.
    pub fn receive_slots(&self) -> usize {
        let peers = self.size.saturating_sub(1);
        if self.lazy() {
            let floor = self.newcomer.clamp(1, self.conn_slots.min(self.pool).max(1));
            return (self.pool + (floor + CTRL_SLOTS) * peers) as usize;
        }
        (self.pool + CTRL_SLOTS * peers) as usize
    }
}

/// Default eager slots granted a connection made on demand.
pub const DEFAULT_CONNECTION_SLOTS: u32 = 8;

/// The receive slots granted each peer: which slots are its (eager slice
/// and control reserve), handed out in the order peers connect. Eagerly
/// every peer gets `slice` at init. Lazily a connection gets the
/// configured slice while the pool has room, and beyond it only the
/// newcomer credits (at least one slot, as eagerly a pool must give every
/// peer one): memory grows with the peers a process talks to, by a slice
/// each up to the pool and by a slot or two beyond it.
#[derive(Debug)]
pub struct Grants {
    /// The data slots granted each peer (0: none yet).
    slice: Vec<u32>,
    /// Data slots granted so far.
    data: u32,
    /// Connections granted so far.
    peers: u32,
    /// The next free slot index.
    next: usize,
    /// Slots set apart for no peer ([`Grants::reserve`]).
    reserved: usize,
    pool: u32,
    full: u32,
    floor: u32,
}

impl Grants {
    fn new(cfg: &EagerConfig, credit: &CreditConfig) -> Self {
        let floor = if cfg.lazy() { credit.newcomer.clamp(1, credit.slice) } else { credit.slice };
        Self { slice: vec![0; cfg.size as usize], data: 0, peers: 0, next: 0, reserved: 0, pool: cfg.pool, full: credit.slice, floor }
    }

    /// Grants `peer` its slots (once): the range of slot indices to post,
    /// its data slots first, then its control slots. `None` when it has them.
    pub fn grant(&mut self, peer: PeerId) -> Option<std::ops::Range<usize>> {
        let s = self.slice.get_mut(peer as usize).filter(|s| **s == 0)?;
        *s = if self.data + self.full <= self.pool { self.full } else { self.floor };
        self.data += *s;
        self.peers += 1;
        let n = (*s + CTRL_SLOTS) as usize;
        self.next += n;
        Some(self.next - n..self.next)
    }

    /// Sets `n` slots apart for no peer in particular (a device whose
    /// first messages from unconnected peers land in any posted slot).
    pub fn reserve(&mut self, n: usize) -> std::ops::Range<usize> {
        self.reserved += n;
        self.next += n;
        self.next - n..self.next
    }

    /// The data slots granted `peer` (0: none yet).
    pub fn slice_of(&self, peer: PeerId) -> u32 {
        self.slice.get(peer as usize).copied().unwrap_or(0)
    }
}

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
    /// The next peer a liveness check probes besides the one asked about.
    pub probe_cursor: u32,
    /// We called finalize: our mailbox words say so.
    pub finalized: bool,
    /// A peer first spoke to us after we finalized: it is owed our mailbox
    /// word, which says so (every reachable peer gets it again: one word each).
    pub finalize_news: bool,
    /// Registrations by kind (the total is `registrations`).
    pub stats: RegistrationStats,
    /// Registrations made, shared with the pools' registration hooks.
    pub registrations: Arc<AtomicU64>,
    /// One word per peer: its cumulative credit returns, written by its device.
    pub mailbox: MmapMut,
    /// The receive slots, `slot_bytes` each (registered by the device).
    pub recv: MmapMut,
    /// Receive slots handed to the core and not yet released, by index.
    held: Vec<bool>,
    /// Which peers are connected, and since when.
    pub conns: Connections,
    /// Which receive slots each peer was granted.
    pub grants: Grants,
    /// Slots granted that the device has yet to post, with their peer.
    pub posts_due: Vec<(PeerId, std::ops::Range<usize>)>,
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
    /// The state of a new endpoint, before its peers are connected.
    pub fn new(cfg: &EagerConfig, credit: CreditConfig, registrations: Arc<AtomicU64>, mailbox: MmapMut, recv: MmapMut) -> Self {
        Self {
            rank: cfg.rank,
            size: cfg.size,
            slot_bytes: cfg.slot_bytes,
            credit,
            peers: PeerList::new(Vec::new()),
            own: OwnQueue::default(),
            explicit_due: false,
            reallocated: false,
            probe_cursor: 0,
            finalized: false,
            finalize_news: false,
            stats: RegistrationStats::default(),
            registrations,
            mailbox,
            recv,
            held: Vec::new(),
            conns: Connections::new(cfg.size, cfg.lazy()),
            grants: Grants::new(cfg, &credit),
            posts_due: Vec::new(),
        }
    }

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

    /// A message of `len` bytes (header included) in receive slot `slot`:
    /// checks the sender, decodes the header and takes the credits it
    /// returns. The device hands it to the core unless
    /// [`RdmaState::for_core`] says it carried only credits, and reposts the
    /// slot when it is released.
    pub fn arrive(&mut self, peer: PeerId, slot: u64, len: usize, undecodable: &'static str) -> Result<Arrival, TransportError> {
        let start = slot as usize * self.slot_bytes;
        let bytes = self.recv.get(start..start + len).ok_or(TransportError::Malformed { peer, what: "a receive beyond its slot" })?;
        let header = MsgHeader::decode(bytes).map_err(|_| TransportError::Malformed { peer, what: undecodable })?;
        let Some(Some(p)) = self.peers.get_mut(peer as usize) else {
            return Err(TransportError::Malformed { peer, what: "eager message from a rank that is not a peer" });
        };
        p.credits().on_receive(header.credits, header.ctrl_credits);
        self.first_contact(peer);
        if header.kind == MsgKind::Internal && header.match_bits == CONNECT_REQUEST {
            self.conns.accept_later(peer);
        }
        let i = slot as usize;
        if self.held.len() <= i {
            self.held.resize(i + 1, false);
        }
        self.held[i] = true;
        Ok(Arrival { peer, header, slot, len: len - HEADER_BYTES })
    }

    /// A message of `len` payload bytes that arrived in slot `slot` without
    /// its header (a device carried the header outside the slot, in
    /// immediate data): moves the payload to where a header-led message
    /// keeps it and writes `header` before it, so that [`RdmaState::arrive`]
    /// reads it like any other. Returns the length with the header.
    pub fn restore_header(&mut self, peer: PeerId, slot: u64, len: usize, header: &MsgHeader) -> Result<usize, TransportError> {
        let start = slot as usize * self.slot_bytes;
        if len + HEADER_BYTES > self.slot_bytes {
            return Err(TransportError::Malformed { peer, what: "a headerless message too long for its slot" });
        }
        let bytes = self
            .recv
            .get_mut(start..start + HEADER_BYTES + len)
            .ok_or(TransportError::Malformed { peer, what: "a receive beyond the slots" })?;
        bytes.copy_within(..len, HEADER_BYTES);
        header.encode((&mut bytes[..HEADER_BYTES]).try_into().expect("header bytes"));
        Ok(len + HEADER_BYTES)
    }

    /// Whether the core sees `arrival` (else the device releases it at once).
    pub fn for_core(arrival: &Arrival) -> bool {
        !matches!(arrival.header.kind, MsgKind::Credit | MsgKind::Internal)
    }

    /// The state with its peers connected (ourselves as `None`).
    #[must_use]
    pub fn with_peers(mut self, peers: Vec<Option<Peer<L>>>) -> Self {
        self.set_peers(peers);
        self
    }

    /// Installs the peers (ourselves as `None`): eagerly, they are connected
    /// now and granted their slots (for the device to post: [`RdmaState::take_posts`]);
    /// lazily, each at its first contact.
    pub fn set_peers(&mut self, peers: Vec<Option<Peer<L>>>) {
        self.peers = PeerList::new(peers);
        if !self.conns.lazy() {
            for r in 0..self.size {
                self.grant(r);
            }
        }
        self.connected_now();
    }

    /// Grants `peer` its receive slots, once (a device that makes a queue
    /// pair per connection grants when it makes it, before any message can
    /// come); the device posts them ([`RdmaState::take_posts`]).
    pub fn grant(&mut self, peer: PeerId) {
        if peer != self.rank {
            if let Some(slots) = self.grants.grant(peer) {
                self.posts_due.push((peer, slots));
            }
        }
    }

    /// The granted slots the device has yet to post, with their peer.
    pub fn take_posts(&mut self) -> Vec<(PeerId, std::ops::Range<usize>)> {
        std::mem::take(&mut self.posts_due)
    }

    /// Eager mode: notes every installed peer as connected now (a device
    /// whose connections become usable after a handshake calls it once that
    /// ends). Lazily, nothing is connected before its first message.
    pub fn connected_now(&mut self) {
        if !self.conns.lazy() {
            self.conns.all_made_now(self.peers.iter().map(Option::is_some));
        }
    }

    /// The first message to or from `peer` (lazy mode): it is connected
    /// now, and gets its credit slice if the job's shape is already known.
    pub fn first_contact(&mut self, peer: PeerId) {
        if !self.conns.touch(peer) {
            return;
        }
        if self.finalized {
            self.finalize_news = true;
            self.explicit_due = true;
        }
        self.grant(peer);
        if self.reallocated {
            self.give_slice(peer);
        }
    }

    /// `Endpoint::reallocate_credits`: every connected peer gets its slice
    /// now (eagerly: all of them); a peer connected later gets it then.
    pub fn reallocate(&mut self) {
        self.reallocated = true;
        for r in 0..self.size {
            if r != self.rank && self.conns.reachable(r) {
                self.give_slice(r);
            }
        }
    }

    /// Grants `peer` the data slots it was given ([`Grants`]); a slice
    /// smaller than the configured one makes its returns fall due sooner.
    fn give_slice(&mut self, peer: PeerId) {
        let slice = self.grants.slice_of(peer);
        let credit = CreditConfig { slice, ..self.credit };
        if let Some(Some(p)) = self.peers.get_mut(peer as usize) {
            p.credits().reallocate(&credit);
            if slice < self.credit.slice {
                p.credits().set_peer_window(slice);
            }
        }
    }

    /// Whether `peer` may be asked something outside a message (a credit
    /// word, a probe): always eagerly; lazily, once it is connected, so that
    /// no such word opens a connection nobody asked for.
    pub fn reachable(&self, peer: PeerId) -> bool {
        self.conns.reachable(peer)
    }

    /// `Endpoint::connections`: every connected peer, in rank order.
    pub fn connections(&self) -> Vec<crate::Connection> {
        self.conns.list()
    }

    /// The payload of a message handed out of receive slot `arrival.slot`
    /// and not yet released (empty for any other).
    pub fn payload(&self, arrival: &Arrival) -> &[u8] {
        if !self.holds(arrival.slot) {
            return &[];
        }
        let start = arrival.slot as usize * self.slot_bytes + HEADER_BYTES;
        self.recv.get(start..start + arrival.len).unwrap_or(&[])
    }

    /// Whether receive slot `slot` holds a message handed out and not yet released.
    pub fn holds(&self, slot: u64) -> bool {
        self.held.get(slot as usize).copied().unwrap_or(false)
    }

    /// Ends the hold on `slot`: an error when it held nothing (a second
    /// release would repost a slot twice and give its credit twice).
    pub fn unhold(&mut self, arrival: &Arrival) -> Result<(), TransportError> {
        match self.held.get_mut(arrival.slot as usize) {
            Some(h) if *h => {
                *h = false;
                Ok(())
            }
            _ => Err(TransportError::Unsupported(format!(
                "releasing a message from rank {} that this endpoint does not hold (release each arrival once)",
                arrival.peer
            ))),
        }
    }

    /// The slot `peer` sent into is free again (reposted): its credit goes
    /// back, with the next message or an explicit return.
    pub fn released(&mut self, peer: PeerId, class: Class) {
        if let Some(Some(p)) = self.peers.get_mut(peer as usize) {
            p.credits().on_release(class);
        }
        self.explicit_due = true;
    }

    /// Whether `peer` is owed an explicit credit return now.
    pub fn owes(&self, peer: PeerId) -> bool {
        let credit = &self.credit;
        match self.peers.get(peer as usize) {
            Some(Some(p)) => p.credits.wants_explicit(credit),
            _ => false,
        }
    }

    /// The peers owed a credit return now (every live one when `all`), with
    /// the word to write into their mailbox.
    pub fn owed_returns(&mut self, all: bool) -> Vec<PeerId> {
        let credit = &self.credit;
        let conns = &self.conns;
        (0..self.size)
            .filter(|&r| match self.peers.get_mut(r as usize) {
                Some(Some(p)) => p.life().failure().is_none() && (all || p.credits().wants_explicit(credit)) && conns.reachable(r),
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

    /// `Endpoint::receive_memory`: eagerly the pool and every peer's control
    /// slots; lazily what the connections were granted.
    pub fn receive_memory(&self) -> ReceiveMemory {
        if !self.conns.lazy() {
            return ReceiveMemory::fixed(&self.credit, self.size.saturating_sub(1), self.slot_bytes, OWN_SLOTS);
        }
        let (data, peers) = (self.grants.data as usize * self.slot_bytes, self.grants.peers as usize);
        ReceiveMemory {
            eager_pool: data,
            per_peer: self.credit.slice as usize * self.slot_bytes,
            control: self.credit.ctrl as usize * peers * self.slot_bytes,
            first_contact: self.grants.reserved * self.slot_bytes,
            own: OWN_SLOTS * self.slot_bytes,
            eager_resident: data,
        }
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
