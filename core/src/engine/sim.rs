//! A simulated fabric for the engine's tests: the ranks of one thread, each
//! with an endpoint, joined by links that hold, reorder and drop what a fault
//! schedule says (quinn-proto tests its state machines the same way, without
//! sockets). One-sided operations copy when they complete, as a device's DMA
//! runs later, and only from exposures their owner has not revoked; the
//! tests ask [`SimNet::busy`] whether anything can still touch a buffer
//! before they give it back.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use fmx_transport::{
    Arrival, Endpoint, MsgHeader, MsgKind, OpStatus, PeerId, PeerState, ReceiveMemory, RemoteKey, SendOutcome, TransportError,
};

/// What the fabric does wrong, drawn from a seed.
#[derive(Clone, Debug)]
pub(crate) struct Faults {
    pub(crate) seed: u64,
    /// Messages in flight per link before the sender gets backpressure.
    pub(crate) slots: usize,
    /// Polls a message may wait at the head of its link (delay; later
    /// messages of the link wait behind it, as every transport keeps a
    /// link's order).
    pub(crate) max_hold: u32,
    /// Polls a one-sided operation may stay pending; their completions come
    /// back in random order, before or after the messages that follow them.
    pub(crate) max_op_polls: u32,
    /// A rank that dies after this many steps (0: as soon as another rank
    /// has a one-sided operation with it in flight): its links drop what it
    /// had in flight from some message on, its exposed memory vanishes.
    pub(crate) death: Option<(u32, u64)>,
    /// Operations with a dead peer never complete until abandoned
    /// (libfabric's shm provider), instead of failing (a device's retries).
    pub(crate) stuck_ops: bool,
    /// The transport offers split rendezvous (both sides copy half).
    pub(crate) split: bool,
    pub(crate) max_eager: usize,
}

struct Msg {
    header: MsgHeader,
    payload: Vec<u8>,
    hold: u32,
}

struct Exposure {
    owner: PeerId,
    addr: usize,
    len: usize,
    writable: bool,
}

struct Op {
    id: u64,
    owner: PeerId,
    peer: PeerId,
    write: bool,
    local: usize,
    len: usize,
    remote: RemoteKey,
    polls_left: u32,
}

struct Net {
    rng: fmx_transport::mutate::Mutator,
    faults: Faults,
    step: u64,
    /// Messages in flight, by (source, destination).
    links: HashMap<(PeerId, PeerId), VecDeque<Msg>>,
    exposures: HashMap<u64, Exposure>,
    next_key: u64,
    ops: Vec<Op>,
    next_op: u64,
    dead: Vec<bool>,
    tally: Tally,
}

/// How often each fault happened (a run that never met one proves nothing about it).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    pub(crate) deaths: u64,
    /// Messages the links dropped when a rank died.
    pub(crate) dropped: u64,
    /// Polls that found a held message at the head of a link.
    pub(crate) held: u64,
    pub(crate) backpressure: u64,
    pub(crate) ops_pending: u64,
    /// Completions reported before an older operation of the same rank.
    pub(crate) out_of_order: u64,
    /// Operations refused because the remote key was revoked or vanished.
    pub(crate) refused: u64,
    pub(crate) split_offers: u64,
    pub(crate) abandoned: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, o: &Tally) {
        self.deaths += o.deaths;
        self.dropped += o.dropped;
        self.held += o.held;
        self.backpressure += o.backpressure;
        self.ops_pending += o.ops_pending;
        self.out_of_order += o.out_of_order;
        self.refused += o.refused;
        self.split_offers += o.split_offers;
        self.abandoned += o.abandoned;
    }
}

impl Net {
    /// Deterministic per seed (the fuzz loops' splitmix64).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.rng.next_u64() % n
        }
    }

    fn gone(peer: PeerId) -> TransportError {
        TransportError::PeerGone { peer, reason: "the simulated process died".into() }
    }

    /// Copies a finished operation's data, if its remote exposure still stands.
    fn copy(&self, op: &Op) -> Result<(), TransportError> {
        let refused = |status: &str| TransportError::Completion {
            op: if op.write { "RDMA write" } else { "RDMA read" },
            peer: op.peer,
            device: "sim".into(),
            status: status.into(),
        };
        let Some(x) = self.exposures.get(&op.remote.key) else {
            return Err(refused("remote access error: the key was revoked"));
        };
        let start = op.remote.addr as usize;
        if x.owner != op.peer || start < x.addr || start + op.len > x.addr + x.len || op.remote.len as usize != op.len {
            return Err(refused("remote access error: outside the exposed region"));
        }
        if op.write && !x.writable {
            return Err(refused("remote access error: the region is read-only"));
        }
        let (from, to) = if op.write { (op.local, start) } else { (start, op.local) };
        #[allow(unsafe_code)]
        // SAFETY: the exposure stands (its owner keeps `addr..addr+len` alive and
        // untouched by itself until it revokes the key, the contract of `expose`),
        // and the local range is the operation's buffer, which its issuer keeps
        // alive until `poll_ops` reports the operation (the contract of
        // `read`/`write`). The two ranges belong to different requests' buffers.
        unsafe {
            std::ptr::copy(from as *const u8, to as *mut u8, op.len)
        };
        Ok(())
    }
}

/// The fabric the simulated ranks share.
#[derive(Clone)]
pub(crate) struct SimNet(Arc<Mutex<Net>>);

impl SimNet {
    pub(crate) fn new(size: u32, faults: Faults) -> Self {
        Self(Arc::new(Mutex::new(Net {
            rng: fmx_transport::mutate::Mutator::new(faults.seed),
            faults,
            step: 0,
            links: HashMap::new(),
            exposures: HashMap::new(),
            next_key: 1,
            ops: Vec::new(),
            next_op: 1,
            dead: vec![false; size as usize],
            tally: Tally::default(),
        })))
    }

    fn net(&self) -> MutexGuard<'_, Net> {
        self.0.lock().expect("the simulated fabric is used by one thread")
    }

    pub(crate) fn endpoint(&self, me: PeerId) -> SimEndpoint {
        SimEndpoint { net: self.clone(), me, size: self.net().dead.len() as u32, held: std::collections::VecDeque::new(), next_slot: 0 }
    }

    /// A random number below `n`, from the schedule's stream.
    pub(crate) fn below(&self, n: u64) -> u64 {
        self.net().below(n)
    }

    /// Advances time one step; the scheduled death happens here. Returns the rank that died now.
    pub(crate) fn step(&self) -> Option<PeerId> {
        let mut n = self.net();
        n.step += 1;
        let (rank, at) = n.faults.death?;
        let now = match at {
            0 => !n.dead[rank as usize] && n.ops.iter().any(|op| op.peer == rank && op.owner != rank),
            at => n.step == at,
        };
        if !now {
            return None;
        }
        drop(n);
        self.kill(rank);
        Some(rank)
    }

    /// Kills `rank` now: its links drop what it had in flight from some
    /// message on, what was sent to it is gone, its exposed memory vanishes.
    pub(crate) fn kill(&self, rank: PeerId) {
        let mut n = self.net();
        n.dead[rank as usize] = true;
        n.tally.deaths += 1;
        // What it sent is lost from some message on; what was sent to it is gone.
        let mut links: Vec<(PeerId, PeerId)> = n.links.keys().copied().filter(|&(s, d)| s == rank || d == rank).collect();
        links.sort_unstable();
        for l in links {
            let len = n.links[&l].len();
            let keep = if l.0 == rank { n.below(len as u64 + 1) as usize } else { 0 };
            n.tally.dropped += (len - keep) as u64;
            n.links.get_mut(&l).expect("listed").truncate(keep);
        }
        n.exposures.retain(|_, x| x.owner != rank);
        n.ops.retain(|op| op.owner != rank);
    }

    pub(crate) fn is_dead(&self, rank: PeerId) -> bool {
        self.net().dead[rank as usize]
    }

    pub(crate) fn tally(&self) -> Tally {
        self.net().tally
    }

    /// What can still read or write `addr..addr+len`: an exposure that stands
    /// or a one-sided operation not yet reported. `None` when nothing can.
    pub(crate) fn busy(&self, addr: usize, len: usize) -> Option<String> {
        let n = self.net();
        let overlaps = |a: usize, l: usize| len > 0 && l > 0 && a < addr + len && addr < a + l;
        if let Some(x) = n.exposures.values().find(|x| overlaps(x.addr, x.len)) {
            return Some(format!("rank {} still exposes {} bytes of it", x.owner, x.len));
        }
        n.ops.iter().find(|op| overlaps(op.local, op.len)).map(|op| {
            format!(
                "rank {}'s RDMA {} of {} bytes with rank {} is still pending on it",
                op.owner,
                if op.write { "write" } else { "read" },
                op.len,
                op.peer
            )
        })
    }

    /// Exposures and pending operations of live ranks (a leak once every request is finished).
    pub(crate) fn leftovers(&self) -> Vec<String> {
        let n = self.net();
        let mut out: Vec<String> =
            n.exposures.values().map(|x| format!("rank {} exposes {} bytes at {:#x}", x.owner, x.len, x.addr)).collect();
        out.extend(
            n.ops.iter().filter(|op| !n.dead[op.owner as usize]).map(|op| format!("rank {} has operation {} pending", op.owner, op.id)),
        );
        out
    }
}

/// One simulated rank's endpoint.
pub(crate) struct SimEndpoint {
    net: SimNet,
    me: PeerId,
    size: u32,
    /// Messages handed out and not yet released, by slot.
    held: std::collections::VecDeque<(u64, Vec<u8>)>,
    next_slot: u64,
}

impl SimEndpoint {
    fn check(&self, peer: PeerId) -> Result<(), TransportError> {
        if peer >= self.size {
            return Err(TransportError::NoSuchPeer { peer, size: self.size });
        }
        Ok(())
    }

    fn start_op(&mut self, peer: PeerId, write: bool, local: usize, len: usize, remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        self.check(peer)?;
        let mut n = self.net.net();
        if n.dead[peer as usize] {
            return Err(Net::gone(peer));
        }
        let max = n.faults.max_op_polls;
        let polls_left = n.below(u64::from(max) + 1) as u32;
        let id = n.next_op;
        n.next_op += 1;
        let op = Op { id, owner: self.me, peer, write, local, len, remote: *remote, polls_left };
        if polls_left == 0 {
            let r = n.copy(&op);
            n.tally.refused += u64::from(r.is_err());
            return r.map(|()| OpStatus::Done);
        }
        n.tally.ops_pending += 1;
        n.ops.push(op);
        Ok(OpStatus::Pending(id))
    }

    fn expose_range(&mut self, addr: usize, len: usize, writable: bool) -> RemoteKey {
        let mut n = self.net.net();
        let key = n.next_key;
        n.next_key += 1;
        n.exposures.insert(key, Exposure { owner: self.me, addr, len, writable });
        RemoteKey { addr: addr as u64, len: len as u64, key }
    }
}

impl Endpoint for SimEndpoint {
    fn local_id(&self) -> PeerId {
        self.me
    }

    fn num_peers(&self) -> u32 {
        self.size
    }

    fn max_eager(&self) -> usize {
        self.net.net().faults.max_eager
    }

    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        self.check(peer)?;
        let mut guard = self.net.net();
        let n = &mut *guard; // disjoint borrows of the fields
        if n.dead[peer as usize] {
            return Err(Net::gone(peer));
        }
        if header.kind == MsgKind::Eager && payload.len() > n.faults.max_eager {
            return Err(TransportError::EagerTooLarge { len: payload.len(), max: n.faults.max_eager });
        }
        let slots = n.faults.slots;
        let max_hold = u64::from(n.faults.max_hold);
        let hold = n.below(max_hold + 1) as u32;
        let link = n.links.entry((self.me, peer)).or_default();
        if link.len() >= slots {
            n.tally.backpressure += 1;
            return Ok(SendOutcome::Backpressure);
        }
        n.tally.split_offers += u64::from(header.kind == MsgKind::Cts);
        let mut h = *header;
        h.payload_len = payload.len() as u32;
        link.push_back(Msg { header: h, payload: payload.to_vec(), hold });
        Ok(SendOutcome::Sent)
    }

    fn credit(&mut self, peer: PeerId) -> SendOutcome {
        let n = self.net.net();
        match n.links.get(&(self.me, peer)) {
            Some(l) if l.len() >= n.faults.slots => SendOutcome::Backpressure,
            _ => SendOutcome::Sent,
        }
    }

    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        // Sources in a random order each poll: links never keep order between them.
        let mut sources: Vec<PeerId> = (0..self.size).collect();
        let mut got = Vec::new();
        let mut held = 0;
        {
            let mut n = self.net.net();
            for i in (1..sources.len()).rev() {
                let j = n.below(i as u64 + 1) as usize;
                sources.swap(i, j);
            }
            for src in sources {
                let Some(link) = n.links.get_mut(&(src, self.me)) else { continue };
                while got.len() < max {
                    match link.front_mut() {
                        Some(m) if m.hold > 0 => {
                            m.hold -= 1;
                            held += 1;
                            break;
                        }
                        Some(_) => got.push((src, link.pop_front().expect("just seen"))),
                        None => break,
                    }
                }
            }
            n.tally.held += held;
        }
        let n = got.len();
        for (src, m) in got {
            self.next_slot += 1;
            out.push(Arrival { peer: src, header: m.header, slot: self.next_slot, len: m.payload.len() });
            self.held.push_back((self.next_slot, m.payload));
        }
        Ok(n)
    }

    fn payload(&self, arrival: &Arrival) -> &[u8] {
        self.held.iter().find(|(s, _)| *s == arrival.slot).map_or(&[], |(_, p)| p)
    }

    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError> {
        match self.held.front() {
            Some((s, _)) if *s == arrival.slot => {
                self.held.pop_front();
                Ok(())
            }
            _ => Err(TransportError::Unsupported(format!("release of slot {} out of order", arrival.slot))),
        }
    }

    #[allow(unsafe_code)]
    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        Ok(self.expose_range(buf.as_ptr() as usize, buf.len(), false))
    }

    #[allow(unsafe_code)]
    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        Ok(self.expose_range(buf.as_mut_ptr() as usize, buf.len(), true))
    }

    fn revoke(&mut self, key: &RemoteKey) {
        self.net.net().exposures.remove(&key.key);
    }

    #[allow(unsafe_code)]
    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        self.start_op(peer, false, local.as_mut_ptr() as usize, local.len(), remote)
    }

    #[allow(unsafe_code)]
    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        self.start_op(peer, true, local.as_ptr() as usize, local.len(), remote)
    }

    fn abandon(&mut self, why: &str) -> bool {
        // Nothing more is reported for the abandoned operations: like closing
        // a libfabric endpoint, which flushes them.
        let me = self.me;
        let mut n = self.net.net();
        let before = n.ops.len();
        n.ops.retain(|op| op.owner != me);
        let _ = why;
        n.tally.abandoned += (before - n.ops.len()) as u64;
        before != n.ops.len()
    }

    fn poll_ops<F>(&mut self, mut done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        let mut finished = Vec::new();
        {
            let mut n = self.net.net();
            let stuck = n.faults.stuck_ops;
            let mut i = 0;
            while i < n.ops.len() {
                let op = &n.ops[i];
                if op.owner != self.me {
                    i += 1;
                    continue;
                }
                let outcome = if n.dead[op.peer as usize] {
                    if stuck {
                        i += 1;
                        continue;
                    }
                    Some(Err(Net::gone(op.peer)))
                } else if op.polls_left > 1 {
                    n.ops[i].polls_left -= 1;
                    None
                } else {
                    Some(n.copy(op))
                };
                match outcome {
                    Some(r) => {
                        let op = n.ops.swap_remove(i); // swap_remove: completions come back out of order
                        let older = n.ops.iter().any(|o| o.owner == self.me && o.id < op.id);
                        n.tally.out_of_order += u64::from(older);
                        n.tally.refused += u64::from(matches!(r, Err(TransportError::Completion { .. })));
                        finished.push((op.id, r));
                    }
                    None => i += 1,
                }
            }
        }
        let count = finished.len();
        for (id, r) in finished {
            done(id, r);
        }
        Ok(count)
    }

    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        if self.net.is_dead(peer) {
            PeerState::Dead
        } else {
            PeerState::Alive
        }
    }

    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    fn receive_memory(&self) -> ReceiveMemory {
        ReceiveMemory::default()
    }

    fn split_rendezvous(&self) -> bool {
        self.net.net().faults.split
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}
