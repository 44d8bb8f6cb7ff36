//! One endpoint made of two: shared memory toward the peers on this node,
//! the network toward the others. Every layer above (eager, rendezvous,
//! credits, active messages, collectives, topologies, bridges) talks to it
//! as to any endpoint; it routes each call by peer.
//!
//! The shared-memory endpoint is a world of this node's ranks only (its
//! own indices, `local`); the network endpoint spans the whole job. Peer ids
//! are translated both ways, in messages, errors and operation ids, so that
//! nothing above ever sees a node-local index.

use std::collections::HashMap;

use fmx_transport::{
    Arrival, Connection, Endpoint, MsgHeader, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome,
    TransportError,
};

/// Operation ids of the network endpoint carry this bit (the local one's never do).
const NET_OP: u64 = 1 << 63;
/// Arrival slots of the network endpoint carry this bit (shared memory's
/// slots and the network's own ones leave it clear).
const NET_SLOT: u64 = 1 << 62;
/// After network traffic (a message in or out, a one-sided operation), the
/// network is polled on every poll for this many polls...
const HOT_POLLS: u32 = 4096;
/// ...and while it is quiet, once the node's endpoint has come up empty
/// this many polls in a row (the rank waits: a network message is what it
/// may wait for)...
const IDLE_POLLS: u32 = 64;
/// ...or, however busy the node is, on one poll in this many. Polling a
/// network provider costs microseconds (libfabric's tcp progress makes
/// system calls): polled on one poll in 256, it made a same-node 8 B round
/// trip 1.16x slower; a shared-memory ping-pong's waits end within a few
/// polls, so they never reach `IDLE_POLLS`.
const QUIET_EVERY: u32 = 4096;

/// Which endpoint serves a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Local(PeerId),
    Net,
}

/// The shared-memory endpoint `L` of this node and the network endpoint `N` of the job.
pub(crate) struct Mixed<L, N> {
    local: L,
    net: N,
    me: PeerId,
    size: u32,
    /// World rank -> index in the local endpoint (`None`: another node).
    to_local: Vec<Option<PeerId>>,
    /// Local index -> world rank.
    to_world: Vec<PeerId>,
    /// Live exposures by key, and how many each endpoint made (a local and a
    /// network key could coincide).
    exposed: HashMap<(u64, u64, u64), (u32, u32)>,
    /// Polls left that poll the network every time (see `HOT_POLLS`).
    net_hot: u32,
    /// Quiet polls so far (see `QUIET_EVERY`).
    quiet: u32,
    /// Polls in a row that found nothing on the node (see `IDLE_POLLS`).
    idle: u32,
}

impl<L: Endpoint, N: Endpoint> Mixed<L, N> {
    /// The endpoint that handed `arrival` out, and the arrival as that endpoint knows it.
    fn inner(&self, arrival: &Arrival) -> (Side, Arrival) {
        let (header, len) = (arrival.header, arrival.len);
        if arrival.slot & NET_SLOT != 0 {
            return (Side::Net, Arrival { peer: arrival.peer, header, slot: arrival.slot & !NET_SLOT, len });
        }
        let l = self.to_local.get(arrival.peer as usize).copied().flatten().unwrap_or(PeerId::MAX);
        (Side::Local(l), Arrival { peer: l, header, slot: arrival.slot, len })
    }

    /// `local` serves the world ranks `node` (in its index order, ours
    /// included); `net` serves every rank.
    pub(crate) fn new(local: L, net: N, node: &[PeerId]) -> Result<Self, TransportError> {
        let (me, size) = (net.local_id(), net.num_peers());
        if node.len() != local.num_peers() as usize || node.get(local.local_id() as usize) != Some(&me) {
            return Err(TransportError::Setup {
                what: format!(
                    "the node's endpoint has {} ranks (we are its {}), the node map says {node:?} with us as world rank {me}",
                    local.num_peers(),
                    local.local_id()
                ),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let mut to_local = vec![None; size as usize];
        for (i, &w) in node.iter().enumerate() {
            *to_local.get_mut(w as usize).ok_or_else(|| TransportError::NoSuchPeer { peer: w, size })? = Some(i as PeerId);
        }
        Ok(Self { local, net, me, size, to_local, to_world: node.to_vec(), exposed: HashMap::new(), net_hot: HOT_POLLS, quiet: 0, idle: 0 })
    }

    /// The endpoint serving `peer`.
    pub(crate) fn side(&self, peer: PeerId) -> Result<Side, TransportError> {
        match self.to_local.get(peer as usize) {
            Some(Some(l)) => Ok(Side::Local(*l)),
            Some(None) => Ok(Side::Net),
            None => Err(TransportError::NoSuchPeer { peer, size: self.size }),
        }
    }

    /// The local endpoint's connections (peers made world ranks), then the network's.
    pub(crate) fn connections_by_half(&self) -> [Vec<Connection>; 2] {
        let mut local = self.local.connections();
        for c in &mut local {
            c.peer = self.to_world[c.peer as usize];
        }
        [local, self.net.connections()]
    }

    /// `e` from the local endpoint, its peer made a world rank.
    fn world_error(&self, e: TransportError) -> TransportError {
        let w = |p: PeerId| self.to_world.get(p as usize).copied().unwrap_or(p);
        match e {
            TransportError::NoSuchPeer { peer, .. } => TransportError::NoSuchPeer { peer: w(peer), size: self.size },
            TransportError::PeerGone { peer, reason } => TransportError::PeerGone { peer: w(peer), reason },
            TransportError::RemoteBounds { peer, offset, len, region } => {
                TransportError::RemoteBounds { peer: w(peer), offset, len, region }
            }
            TransportError::Malformed { peer, what } => TransportError::Malformed { peer: w(peer), what },
            TransportError::Completion { op, peer, device, status } => TransportError::Completion { op, peer: w(peer), device, status },
            TransportError::Io { op, peer, source } => TransportError::Io { op, peer: w(peer), source },
            e => e,
        }
    }

    fn record(&mut self, key: &RemoteKey, local: bool) {
        let n = self.exposed.entry((key.addr, key.len, key.key)).or_insert((0, 0));
        if local {
            n.0 += 1;
        } else {
            n.1 += 1;
        }
    }
}

impl<L: Endpoint, N: Endpoint> Endpoint for Mixed<L, N> {
    fn local_id(&self) -> PeerId {
        self.me
    }

    fn num_peers(&self) -> u32 {
        self.size
    }

    fn max_eager(&self) -> usize {
        // One limit for every peer: the engine picks eager or rendezvous by size alone.
        self.local.max_eager().min(self.net.max_eager())
    }

    #[inline]
    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        match self.side(peer)? {
            Side::Local(l) => self.local.try_send(l, header, payload).map_err(|e| self.world_error(e)),
            Side::Net => {
                self.net_hot = HOT_POLLS;
                self.net.try_send(peer, header, payload)
            }
        }
    }

    fn credit(&mut self, peer: PeerId) -> SendOutcome {
        match self.side(peer) {
            Ok(Side::Local(l)) => self.local.credit(l),
            Ok(Side::Net) => self.net.credit(peer),
            Err(_) => SendOutcome::Backpressure,
        }
    }

    #[inline]
    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        let start = out.len();
        let n = match self.local.arrivals(max, out) {
            Ok(n) => n,
            Err(e) => return Err(self.world_error(e)),
        };
        for a in &mut out[start..] {
            a.peer = self.to_world[a.peer as usize];
        }
        if n >= max {
            return Ok(n);
        }
        self.idle = if n == 0 { self.idle + 1 } else { 0 };
        if self.net_hot > 0 {
            self.net_hot -= 1;
        } else {
            self.quiet += 1;
            if self.idle < IDLE_POLLS && self.quiet < QUIET_EVERY {
                return Ok(n);
            }
            (self.idle, self.quiet) = (0, 0);
        }
        let start = out.len();
        let m = self.net.arrivals(max - n, out)?;
        for a in &mut out[start..] {
            a.slot |= NET_SLOT;
        }
        if m > 0 {
            self.net_hot = HOT_POLLS;
        }
        Ok(n + m)
    }

    fn payload(&self, arrival: &Arrival) -> &[u8] {
        match self.inner(arrival) {
            (Side::Net, a) => self.net.payload(&a),
            (Side::Local(_), a) => self.local.payload(&a),
        }
    }

    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError> {
        match self.inner(&arrival) {
            (Side::Net, a) => self.net.release(a),
            (Side::Local(_), a) => self.local.release(a).map_err(|e| self.world_error(e)),
        }
    }

    #[allow(unsafe_code)]
    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        // Without a peer: the network's key, which every rank can use.
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        let key = unsafe { self.net.expose(buf)? };
        self.record(&key, false);
        Ok(key)
    }

    #[allow(unsafe_code)]
    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        let key = unsafe { self.net.expose_mut(buf)? };
        self.record(&key, false);
        Ok(key)
    }

    #[allow(unsafe_code)]
    unsafe fn expose_to(&mut self, peer: PeerId, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        let side = self.side(peer)?;
        let key = match side {
            // SAFETY: the caller's promise (see the trait) is passed on unchanged.
            Side::Local(l) => unsafe { self.local.expose_to(l, buf) }.map_err(|e| self.world_error(e))?,
            // SAFETY: the caller's promise (see the trait) is passed on unchanged.
            Side::Net => unsafe { self.net.expose_to(peer, buf)? },
        };
        self.record(&key, side != Side::Net);
        Ok(key)
    }

    #[allow(unsafe_code)]
    unsafe fn expose_mut_to(&mut self, peer: PeerId, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        let side = self.side(peer)?;
        let key = match side {
            // SAFETY: the caller's promise (see the trait) is passed on unchanged.
            Side::Local(l) => unsafe { self.local.expose_mut_to(l, buf) }.map_err(|e| self.world_error(e))?,
            // SAFETY: the caller's promise (see the trait) is passed on unchanged.
            Side::Net => unsafe { self.net.expose_mut_to(peer, buf)? },
        };
        self.record(&key, side != Side::Net);
        Ok(key)
    }

    fn revoke(&mut self, key: &RemoteKey) {
        let id = (key.addr, key.len, key.key);
        let Some(n) = self.exposed.get_mut(&id) else { return };
        if n.0 > 0 {
            n.0 -= 1;
            self.local.revoke(key);
        } else {
            n.1 -= 1;
            self.net.revoke(key);
        }
        if *n == (0, 0) {
            self.exposed.remove(&id);
        }
    }

    #[allow(unsafe_code)]
    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        match self.side(peer)? {
            // SAFETY: the caller's promise (see the trait) is passed on unchanged.
            Side::Local(l) => unsafe { self.local.read(l, remote, local) }.map_err(|e| self.world_error(e)),
            Side::Net => {
                self.net_hot = HOT_POLLS;
                // SAFETY: as above; the id is tagged so that `poll_ops`
                // reports it as it was given (the buffer's promise follows it).
                unsafe { self.net.read(peer, remote, local) }.map(tag_net)
            }
        }
    }

    #[allow(unsafe_code)]
    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        match self.side(peer)? {
            // SAFETY: the caller's promise (see the trait) is passed on unchanged.
            Side::Local(l) => unsafe { self.local.write(l, local, remote) }.map_err(|e| self.world_error(e)),
            Side::Net => {
                self.net_hot = HOT_POLLS;
                // SAFETY: as for `read`.
                unsafe { self.net.write(peer, local, remote) }.map(tag_net)
            }
        }
    }

    fn abandon(&mut self, why: &str) -> bool {
        let local = self.local.abandon(why);
        let net = self.net.abandon(why);
        local || net
    }

    fn poll_ops<F>(&mut self, mut done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        let mut local = Vec::new();
        let n = self.local.poll_ops(|id, r| local.push((id, r))).map_err(|e| self.world_error(e))?;
        for (id, r) in local {
            done(id, r.map_err(|e| self.world_error(e)));
        }
        Ok(n + self.net.poll_ops(|id, r| done(id | NET_OP, r))?)
    }

    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        match self.side(peer) {
            Ok(Side::Local(l)) => self.local.peer_state(l),
            Ok(Side::Net) => self.net.peer_state(peer),
            Err(_) => PeerState::Dead,
        }
    }

    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        self.local.reallocate_credits().map_err(|e| self.world_error(e))?;
        self.net.reallocate_credits()
    }

    fn receive_memory(&self) -> ReceiveMemory {
        let (a, b) = (self.local.receive_memory(), self.net.receive_memory());
        ReceiveMemory {
            eager_pool: a.eager_pool + b.eager_pool,
            per_peer: a.per_peer.max(b.per_peer),
            control: a.control + b.control,
            first_contact: a.first_contact + b.first_contact,
            own: a.own + b.own,
            eager_resident: a.eager_resident + b.eager_resident,
        }
    }

    fn connects_on_demand(&self, peer: PeerId) -> bool {
        matches!(self.side(peer), Ok(Side::Net)) && self.net.connects_on_demand(peer)
    }

    fn preconnect(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        match self.side(peer)? {
            Side::Local(_) => Ok(true),
            Side::Net => self.net.preconnect(peer),
        }
    }

    fn connections(&self) -> Vec<Connection> {
        let [mut local, net] = self.connections_by_half();
        local.extend(net);
        local
    }

    fn publish_receive_shares(&mut self, weights: &[u64]) -> Result<bool, TransportError> {
        // Only the node's endpoint resizes; it weighs its own ranks.
        let local: Vec<u64> = self.to_world.iter().map(|&w| weights.get(w as usize).copied().unwrap_or(0)).collect();
        self.local.publish_receive_shares(&local).map_err(|e| self.world_error(e))
    }

    fn adopt_receive_shares(&mut self) {
        self.local.adopt_receive_shares();
    }

    fn settle_receive_shares(&mut self) -> bool {
        self.local.settle_receive_shares()
    }

    fn split_rendezvous(&self) -> bool {
        self.local.split_rendezvous() && self.net.split_rendezvous()
    }

    fn split_rendezvous_to(&self, peer: PeerId) -> bool {
        match self.side(peer) {
            Ok(Side::Local(l)) => self.local.split_rendezvous_to(l),
            Ok(Side::Net) => self.net.split_rendezvous_to(peer),
            Err(_) => false,
        }
    }

    fn large_message_path(&self) -> String {
        format!("on this node: {}; to other nodes: {}", self.local.large_message_path(), self.net.large_message_path())
    }

    fn register_owned(&mut self, region: &[u8]) -> Result<(), TransportError> {
        self.local.register_owned(region).map_err(|e| self.world_error(e))?;
        self.net.register_owned(region)
    }

    fn deregister_owned(&mut self, region: &[u8]) {
        self.local.deregister_owned(region);
        self.net.deregister_owned(region);
    }

    fn registration_stats(&self) -> RegistrationStats {
        let (a, b) = (self.local.registration_stats(), self.net.registration_stats());
        RegistrationStats {
            registrations: a.registrations + b.registrations,
            per_operation: a.per_operation + b.per_operation,
            owned_hits: a.owned_hits + b.owned_hits,
            bounced: a.bounced + b.bounced,
        }
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        let local = self.local.finalize().map_err(|e| self.world_error(e));
        let net = self.net.finalize();
        local.and(net)
    }
}

fn tag_net(s: OpStatus) -> OpStatus {
    match s {
        OpStatus::Pending(id) => OpStatus::Pending(id | NET_OP),
        done => done,
    }
}
