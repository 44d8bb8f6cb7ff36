//! The progress engine: requests, matching, the eager and rendezvous
//! protocols, and the wait loop. Caller-driven (FM's extract): nothing moves
//! unless a library call polls.
//!
//! Protocols, chosen by size:
//! - **eager** (message fits a transport slot): the payload is copied into the
//!   receiver's slot; the send completes at once. The receiver copies it out
//!   into the matched buffer, or into the unexpected queue.
//! - **rendezvous** (larger): the sender exposes its buffer and sends an RTS
//!   with the key; the receiver, once matched, reads the data with one
//!   one-sided operation straight into the user's buffer (single copy) and
//!   answers FIN, which completes the send.
//!
//! Sends to a peer whose slots are full wait in a per-peer FIFO, so later
//! sends never overtake them.

pub(crate) mod matching;
#[cfg(test)]
mod pair_tests;
pub(crate) mod requests;
#[cfg(test)]
pub(crate) mod sim;

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use fmx_transport::lend::{LendTable, Lent};
use fmx_transport::{Arrival, Endpoint, MsgHeader, MsgKind, OpStatus, PeerState, RemoteKey, SendOutcome, TransportError};

use crate::bootstrap::Link;
use crate::error::{Error, Result};
use crate::failure::Failure;
use crate::select::Transport;
use matching::{Body, Matching, Posted, Stored, Unexpected};
use requests::Requests;
pub(crate) use requests::{RawStatus, ReqId, WaitsOn};

/// Messages handled per poll.
const POLL_BATCH: usize = 32;
/// Empty polls spent spinning before a waiter starts yielding the core.
const SPIN_POLLS: u32 = 128;
/// The same when more ranks than cores share the host: yield almost at once,
/// so that the peer we wait for gets the core.
const SPIN_POLLS_OVERSUBSCRIBED: u32 = 2;
/// Rendezvous messages from this size on are copied by both sides at once:
/// the receiver reads the first half while the sender writes the second
/// (two cores share the copy of one message).
const SPLIT_MIN: u64 = 128 << 10;
/// How often a waiter that gets nothing checks whether its peers are alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);
/// A wildcard receive waiting this long connects (on demand) to every
/// member it could hear from ([`Engine::connect_waited_on`]): a member that
/// finalized without a word to us must be reported, and a receive from any
/// source has no one peer to ask first.
const WILDCARD_CONNECTS_AFTER: Duration = Duration::from_secs(2);

/// The send queue of `dest` for messages of `kind`.
#[inline]
fn queue(dest: u32, kind: MsgKind) -> usize {
    let lane = match kind {
        MsgKind::Eager | MsgKind::Rts => 0,
        MsgKind::Cts | MsgKind::Fin | MsgKind::Credit | MsgKind::Internal => 1,
    };
    2 * dest as usize + lane
}

/// Context (communicator) and tag packed into the header's match bits.
#[inline]
pub(crate) fn match_bits(ctx: u32, tag: u32) -> u64 {
    (u64::from(ctx) << 32) | u64::from(tag)
}

fn split_bits(bits: u64) -> (u32, u32) {
    ((bits >> 32) as u32, bits as u32)
}

enum Payload {
    None,
    Lent(Lent),
    /// Data the engine owns (active-message replies), sent when credits allow.
    Owned(Vec<u8>),
    Key([u8; RemoteKey::BYTES]),
}

struct Outgoing {
    header: MsgHeader,
    payload: Payload,
    /// Eager send request to complete once the message is in the slot.
    completes: Option<ReqId>,
    /// When it began to wait for a credit (for FMX_LOG's credit-stall events).
    since: Instant,
}

/// A send that waited this long for a credit is logged (info).
const CREDIT_STALL_LOG: Duration = Duration::from_millis(100);

/// What a received message asks of the transport (run right after the
/// message is handled and released).
enum Action {
    Read {
        req: ReqId,
        peer: u32,
        key: RemoteKey,
        cookie: u64,
        buf: Lent,
        tag: u32,
    },
    /// The receiver agreed to a split copy: write our second half into its buffer.
    WriteHalf {
        req: ReqId,
        peer: u32,
        key: RemoteKey,
        recv_cookie: u64,
    },
    Revoke(RemoteKey),
}

/// How long cancelling a request waits for its in-flight one-sided operation:
/// longer than a device's retry budget, after which the operation has failed.
const INFLIGHT_DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// The same when the job is failing or the operation's peer is gone.
const ABANDON_AFTER: Duration = Duration::from_secs(1);

/// A rendezvous read or write the transport reported as pending.
struct InflightOp {
    req: ReqId,
    peer: u32,
    fin: MsgHeader,
    status: RawStatus,
    /// Half of a split transfer: the request needs both halves.
    part: bool,
}

pub(crate) struct Engine {
    pub(crate) tp: Transport,
    me: u32,
    max_eager: usize,
    reqs: Requests,
    matching: Matching,
    /// Sends waiting for credits: two FIFOs per peer, data (eager, RTS) and
    /// control (CTS, FIN), so that control never waits behind exhausted data credits.
    outq: Vec<VecDeque<Outgoing>>,
    queued: usize,
    /// Messages received in the current progress round (a buffer kept for reuse).
    arrived: Vec<Arrival>,
    /// One-sided operations the transport finishes asynchronously (verbs): on
    /// completion the request completes (or half-completes) and the FIN goes out.
    inflight: HashMap<u64, InflightOp>,
    /// A fatal protocol error found inside a poll callback.
    poison: Option<Error>,
    spin_polls: u32,
    /// Called while a wait idles: progresses the process's other engines
    /// (a world and a bridge), as MPI's progress covers every communicator.
    on_idle: Option<fn()>,
    /// Where the launcher's notice of the job's first failure arrives.
    link: Option<Rc<Link>>,
    /// That failure, once known: no wait may idle any more.
    failure: Option<Failure>,
}

/// Empty polls a wait spins before it yields the core, unless
/// `FMX_SPIN_POLLS` says otherwise: fewer when this host runs more ranks
/// than it has cores (`oversubscribed`), so a waiting rank gives its core
/// to the one it waits for.
pub(crate) fn default_spin_polls(oversubscribed: bool) -> u32 {
    if oversubscribed {
        SPIN_POLLS_OVERSUBSCRIBED
    } else {
        SPIN_POLLS
    }
}

impl Engine {
    /// An engine over `tp` whose waits spin `spin_polls` empty polls before
    /// they start yielding the core (see [`default_spin_polls`]).
    pub(crate) fn new(tp: Transport, spin_polls: u32, link: Option<Rc<Link>>) -> Self {
        let size = tp.num_peers();
        Self {
            me: tp.local_id(),
            max_eager: tp.max_eager(),
            tp,
            reqs: Requests::default(),
            matching: Matching::default(),
            outq: (0..2 * size).map(|_| VecDeque::new()).collect(),
            queued: 0,
            arrived: Vec::new(),
            inflight: HashMap::new(),
            poison: None,
            spin_polls,
            on_idle: None,
            link,
            failure: None,
        }
    }

    /// Sets what runs while a wait idles (see `on_idle`).
    pub(crate) fn set_idle_hook(&mut self, hook: fn()) {
        self.on_idle = Some(hook);
    }

    pub(crate) fn world_rank(&self) -> u32 {
        self.me
    }

    /// Sends `data` to world rank `dest` at once when it is eager and nothing
    /// waits before it: a blocking send that completes inline needs no
    /// request and no lend. `false`: it did not go out (the caller takes the
    /// request path, which queues it).
    #[inline]
    pub(crate) fn send_inline(&mut self, ctx: u32, tag: u32, dest: u32, data: &[u8]) -> Result<bool> {
        Ok(data.len() <= self.max_eager && self.try_send_now(ctx, tag, dest, data)? == SendOutcome::Sent)
    }

    /// Receives into `buf` at once from an eager message that already
    /// arrived and that a receive of (ctx, src, tag) takes: a blocking
    /// receive that completes inline needs no request and no lend. `None`:
    /// no such message (or a rendezvous offer), and nothing was taken.
    #[inline]
    pub(crate) fn recv_arrived(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, buf: &mut [u8]) -> Option<RawStatus> {
        let (src, tag, data) = self.matching.take_unexpected_eager(ctx, src, tag)?;
        let n = buf.len().min(data.len());
        buf[..n].copy_from_slice(&data[..n]);
        Some(RawStatus { src, tag, sent: data.len() as u64, capacity: buf.len() as u64 })
    }

    /// Starts a send of the lent buffer `buf` to world rank `dest`.
    pub(crate) fn start_send(&mut self, lend: &LendTable, ctx: u32, tag: u32, dest: u32, buf: Lent) -> Result<ReqId> {
        let req = self.reqs.insert(WaitsOn::Peer(dest), "sending");
        let started = self.start_send_as(req, lend, ctx, tag, dest, buf);
        if started.is_err() {
            // Nothing may stay exposed, or queued, for a send the caller was told failed.
            self.discard(req);
        }
        started.map(|()| req)
    }

    fn start_send_as(&mut self, req: ReqId, lend: &LendTable, ctx: u32, tag: u32, dest: u32, buf: Lent) -> Result<()> {
        let data = lend.get(buf).ok_or(Error::StaleRequest(0))?;
        let bits = match_bits(ctx, tag);
        if data.len() <= self.max_eager {
            if self.send_inline(ctx, tag, dest, data)? {
                self.reqs.complete(req, RawStatus { src: self.me, tag, sent: data.len() as u64, capacity: data.len() as u64 });
            } else {
                let header = MsgHeader::eager(bits, data.len(), 0);
                self.enqueue(dest, Outgoing { header, payload: Payload::Lent(buf), completes: Some(req), since: Instant::now() });
            }
        } else {
            #[allow(unsafe_code)]
            // SAFETY: `data` is lent (`buf`): the lend scope that lent it does not
            // end before this request is finished or withdrawn (scopes complete or
            // discard every request; a blocking send waits), and both paths revoke
            // the key first: the FIN (the peer is done) or `withdraw`.
            let key = unsafe { self.tp.expose_to(dest, data)? };
            if let Some(r) = self.reqs.get_mut(req) {
                r.exposed = Some(key);
                r.buf = Some(buf);
                r.partial = Some(RawStatus { src: self.me, tag, sent: data.len() as u64, capacity: data.len() as u64 });
            }
            tracing::debug!(rank = self.me, "rendezvous: offering {} bytes to rank {dest}", data.len());
            let header = MsgHeader::control(MsgKind::Rts, bits, data.len() as u64, req.cookie(), RemoteKey::BYTES);
            self.send_control(dest, header, Payload::Key(key.encode()))?;
        }
        Ok(())
    }

    /// Starts a receive into the lent buffer `buf`; `src`/`tag` `None` are
    /// wildcards. A collective's receive (`coll`) is watched for a peer that
    /// is in another collective (see `check_liveness`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start_recv(
        &mut self,
        lend: &mut LendTable,
        ctx: u32,
        src: Option<u32>,
        tag: Option<u32>,
        buf: Lent,
        waits_on: WaitsOn,
        coll: bool,
    ) -> Result<ReqId> {
        let req = self.reqs.insert(waits_on, "receiving");
        if let (true, Some(t), Some(r)) = (coll, tag, self.reqs.get_mut(req)) {
            r.coll = Some((ctx, t));
        }
        match self.matching.take_unexpected(ctx, src, tag) {
            None => self.matching.post(Posted { req, ctx, src, tag, buf }),
            Some(u) => match u.body {
                Body::Eager(data) => deliver(&mut self.reqs, lend, req, buf, u.src, u.tag, &data),
                Body::Rts { key, cookie } => {
                    self.run_one(Action::Read { req, peer: u.src, key, cookie, buf, tag: u.tag }, lend)?;
                }
            },
        }
        Ok(req)
    }

    /// Status of the earliest message that a receive of (ctx, src, tag) would match, without receiving it.
    pub(crate) fn probe(&mut self, lend: &mut LendTable, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Result<Option<RawStatus>> {
        self.progress(lend)?;
        Ok(self.matching.peek_unexpected(ctx, src, tag).map(|u| RawStatus { src: u.src, tag: u.tag, sent: u.len, capacity: u.len }))
    }

    fn enqueue(&mut self, dest: u32, o: Outgoing) {
        self.outq[queue(dest, o.header.kind)].push_back(o);
        self.queued += 1;
    }

    fn send_control(&mut self, dest: u32, header: MsgHeader, payload: Payload) -> Result<()> {
        if self.outq[queue(dest, header.kind)].is_empty() {
            let bytes: &[u8] = match &payload {
                Payload::Key(k) => k,
                _ => &[],
            };
            if self.tp.try_send(dest, &header, bytes)? == SendOutcome::Sent {
                return Ok(());
            }
        }
        self.enqueue(dest, Outgoing { header, payload, completes: None, since: Instant::now() });
        Ok(())
    }

    /// Sends what waits for slots, in order per peer; returns how many went out.
    fn flush_queued(&mut self, lend: &LendTable) -> Result<usize> {
        let mut sent = 0;
        for q in 0..self.outq.len() {
            let dest = (q / 2) as u32;
            while let Some(o) = self.outq[q].front() {
                let bytes: &[u8] = match &o.payload {
                    Payload::None => &[],
                    Payload::Key(k) => k,
                    Payload::Owned(v) => v,
                    Payload::Lent(l) => match lend.get(*l) {
                        Some(b) => b,
                        None => {
                            // The scope that lent the data ended (it was cancelled): drop it.
                            if let Some(r) = o.completes {
                                self.reqs.fail(r, Error::StaleRequest(r.index()));
                            }
                            self.outq[q].pop_front();
                            self.queued -= 1;
                            continue;
                        }
                    },
                };
                match self.tp.try_send(dest, &o.header, bytes) {
                    Ok(SendOutcome::Sent) => {}
                    Ok(_) => break,
                    Err(e) => {
                        if self.gone(dest).is_none() && !matches!(e, TransportError::PeerGone { .. }) {
                            return Err(e.into());
                        }
                        // `dest` is gone: what waits for it fails; traffic with the others goes on.
                        self.drop_queue(q, &e);
                        break;
                    }
                }
                let waited = o.since.elapsed();
                if waited >= CREDIT_STALL_LOG {
                    tracing::info!(rank = self.me, "a send to rank {dest} waited {} ms for a credit (FM's send rule)", waited.as_millis());
                }
                if let Some(r) = o.completes {
                    let len = o.header.len;
                    let tag = split_bits(o.header.match_bits).1;
                    self.reqs.complete(r, RawStatus { src: self.me, tag, sent: len, capacity: len });
                }
                self.outq[q].pop_front();
                self.queued -= 1;
                sent += 1;
            }
        }
        Ok(sent)
    }

    /// Drops send queue `q` (its destination is gone), failing the sends that wait in it.
    fn drop_queue(&mut self, q: usize, why: &TransportError) {
        let dest = (q / 2) as u32;
        let state = self.gone(dest).unwrap_or(PeerState::Dead);
        let reason = why.to_string();
        for o in std::mem::take(&mut self.outq[q]) {
            self.queued -= 1;
            if let Some(r) = o.completes {
                let what = self.reqs.get(r).map_or("sending", |x| x.what);
                let e = match peer_gone(dest, what, state, false) {
                    Error::PeerGone { rank, world_rank, during, .. } => {
                        Error::PeerGone { rank, world_rank, during, reason: reason.clone(), pending: false }
                    }
                    e => e,
                };
                self.reqs.fail(r, e);
            }
        }
    }

    /// Sends a FIN: a peer that is gone waits for nothing any more.
    fn send_fin(&mut self, peer: u32, fin: MsgHeader) -> Result<()> {
        match self.send_control(peer, fin, Payload::None) {
            Err(Error::PeerGone { .. }) => Ok(()),
            r => r,
        }
    }

    /// One round of progress: queued sends, received messages (and the reads,
    /// writes and revokes they ask for), finished one-sided operations.
    #[inline]
    pub(crate) fn progress(&mut self, lend: &mut LendTable) -> Result<usize> {
        let mut n = 0;
        if self.queued > 0 {
            n += self.flush_queued(lend)?;
        }
        n += self.receive(lend)?;
        if !self.inflight.is_empty() {
            n += self.finish_inflight()?;
        }
        Ok(n)
    }

    /// Completes the requests whose one-sided operations the transport finished.
    fn finish_inflight(&mut self) -> Result<usize> {
        let mut done = Vec::new();
        self.tp.poll_ops(|id, r| done.push((id, r)))?;
        let n = done.len();
        for (id, r) in done {
            if let Some(op) = self.inflight.remove(&id) {
                self.settle(op, r)?;
            }
        }
        Ok(n)
    }

    /// Records what a one-sided operation's outcome means for its request: now
    /// when it is done or failed, at completion when it is pending.
    fn after_one_sided(&mut self, r: std::result::Result<OpStatus, TransportError>, op: InflightOp) -> Result<()> {
        match r {
            Ok(OpStatus::Pending(id)) => {
                self.inflight.insert(id, op);
                Ok(())
            }
            Ok(OpStatus::Done) => self.settle(op, Ok(())),
            Err(e) => self.settle(op, Err(e)),
        }
    }

    /// A finished one-sided operation: (half-)completes or fails its request,
    /// and sends the FIN the peer waits for whatever happened.
    fn settle(&mut self, op: InflightOp, r: std::result::Result<(), TransportError>) -> Result<()> {
        match r {
            Ok(()) if op.part => self.reqs.part_done(op.req, op.status),
            Ok(()) => self.reqs.complete(op.req, op.status),
            Err(e) => {
                let e = self.because_gone(op.peer, op.req, e);
                self.reqs.fail(op.req, e);
            }
        }
        self.send_fin(op.peer, op.fin)
    }

    /// Handles a batch of received messages, each while it still sits in
    /// its slot, releasing it before running what it asks for. Every message
    /// is handled and released even when one fails (a slot never released
    /// would hold its sender's credit for ever); the first error is returned.
    #[inline]
    fn receive(&mut self, lend: &mut LendTable) -> Result<usize> {
        let mut arrived = std::mem::take(&mut self.arrived);
        let got = self.tp.arrivals(POLL_BATCH, &mut arrived);
        if arrived.is_empty() {
            // The common case while waiting: nothing came.
            self.arrived = arrived;
            return Ok(got?);
        }
        let mut first: Option<Error> = None;
        for a in arrived.drain(..) {
            let Self { tp, matching, reqs, poison, .. } = self;
            let action = on_message(matching, reqs, poison, lend, a.peer, &a.header, tp.payload(&a));
            if let Err(e) = self.tp.release(a) {
                first.get_or_insert(e.into());
            }
            if let Some(action) = action {
                if let Err(e) = self.run_one(action, lend) {
                    first.get_or_insert(e);
                }
            }
        }
        self.arrived = arrived;
        let n = got?;
        if let Some(e) = self.poison.take().or(first) {
            return Err(e);
        }
        Ok(n)
    }

    fn run_one(&mut self, action: Action, lend: &mut LendTable) -> Result<()> {
        match action {
            Action::Revoke(key) => self.tp.revoke(&key),
            Action::Read { req, peer, key, cookie, buf, tag } => {
                let fin = MsgHeader::control(MsgKind::Fin, 0, key.len, cookie, 0);
                let Some(dst) = lend.get_mut(buf) else {
                    self.reqs.fail(req, Error::StaleRequest(req.index()));
                    return self.send_fin(peer, fin);
                };
                let status = RawStatus { src: peer, tag, sent: key.len, capacity: dst.len() as u64 };
                let split = key.len >= SPLIT_MIN && dst.len() as u64 >= key.len && self.tp.split_rendezvous_to(peer);
                let n = dst.len().min(key.len as usize);
                tracing::debug!(
                    rank = self.me,
                    "rendezvous: reading {n} of {} bytes from rank {peer}{}",
                    key.len,
                    if split { " (split: it writes half)" } else { "" }
                );
                let mine = if split {
                    // Expose our buffer; the sender writes the second half while we read the first.
                    let half = (n / 2) & !63;
                    #[allow(unsafe_code)]
                    // SAFETY: `dst` is the lent receive buffer; as for a send's
                    // exposure, its lend scope outlives the request, which the
                    // peer's FIN or `withdraw` revokes the key of first, and the
                    // engine touches `dst` only through the read below meanwhile.
                    let rkey = unsafe { self.tp.expose_mut_to(peer, &mut dst[..n])? };
                    if let Some(r) = self.reqs.get_mut(req) {
                        r.exposed = Some(rkey);
                        r.parts_left = 2;
                        r.partial = Some(status);
                    }
                    let cts = MsgHeader::control(MsgKind::Cts, req.cookie(), key.len, cookie, RemoteKey::BYTES);
                    if let Err(e) = self.send_control(peer, cts, Payload::Key(rkey.encode())) {
                        // No half will come: the receive fails, and nothing stays exposed.
                        self.reqs.fail(req, e);
                        self.withdraw(req);
                        return Ok(());
                    }
                    half
                } else {
                    n
                };
                #[allow(unsafe_code)]
                // SAFETY: `dst` is lent: its scope ends only after this request
                // is finished or withdrawn, and `cancel` waits for (or the
                // transport abandons) the pending read recorded in `inflight`
                // before a request's buffer is given back.
                let r = key.slice(peer, 0, mine as u64).and_then(|k| unsafe { self.tp.read(peer, &k, &mut dst[..mine]) });
                self.after_one_sided(r, InflightOp { req, peer, fin, status, part: split })?;
            }
            Action::WriteHalf { req, peer, key, recv_cookie } => {
                let fin = MsgHeader::control(MsgKind::Fin, 0, key.len, recv_cookie, 0);
                let src = self.reqs.get(req).and_then(|r| match (&r.owned, r.buf) {
                    (Some(v), _) => Some(&v[..]),
                    (None, Some(b)) => lend.get(b),
                    (None, None) => None,
                });
                let r = match src {
                    Some(src) => {
                        let n = src.len().min(key.len as usize);
                        let half = (n / 2) & !63;
                        #[allow(unsafe_code)]
                        // SAFETY: `src` is the send's lent buffer or the vector the
                        // request owns; either lives until the request is finished
                        // or withdrawn, and `cancel` waits for (or abandons) the
                        // pending write recorded in `inflight` first.
                        let r =
                            key.slice(peer, half as u64, (n - half) as u64).and_then(|k| unsafe { self.tp.write(peer, &src[half..n], &k) });
                        r
                    }
                    None => Err(fmx_transport::TransportError::Malformed { peer, what: "CTS for a send that is no longer pending" }),
                };
                let status = RawStatus { src: self.me, tag: 0, sent: key.len, capacity: key.len };
                self.after_one_sided(r, InflightOp { req, peer, fin, status, part: true })?;
            }
        }
        Ok(())
    }

    pub(crate) fn is_pending(&self, id: ReqId) -> bool {
        self.reqs.is_pending(id)
    }

    /// Frees a finished request and returns its outcome.
    pub(crate) fn take(&mut self, id: ReqId) -> Option<Result<RawStatus>> {
        if !self.reqs.is_pending(id) {
            // A failed rendezvous may still expose the buffer (a split receive
            // whose read failed): the peer must not write into it once it is given back.
            self.withdraw(id);
        }
        self.reqs.take(id)
    }

    /// Drives progress until `done`: polls, spins a little when idle, then
    /// yields the core (a peer may share it), and runs `check` every
    /// `LIVENESS_EVERY` of idleness so that a dead peer ends the wait.
    fn progress_until(
        &mut self,
        lend: &mut LendTable,
        done: impl Fn(&Self) -> bool,
        mut check: impl FnMut(&mut Self, &mut LendTable) -> Result<()>,
    ) -> Result<()> {
        let mut idle = 0u32;
        // Read the clock only once the wait idles: a wait that a poll or two
        // ends (a ping-pong) never pays for it.
        let mut last_check: Option<Instant> = None;
        while !done(self) {
            if self.progress(lend)? > 0 {
                idle = 0;
                continue;
            }
            idle += 1;
            if idle < self.spin_polls {
                continue;
            }
            std::thread::yield_now();
            if let Some(hook) = self.on_idle {
                hook();
            }
            let since = *last_check.get_or_insert_with(Instant::now);
            if since.elapsed() >= LIVENESS_EVERY {
                last_check = Some(Instant::now());
                check(self, lend)?;
            }
        }
        Ok(())
    }

    /// Drives progress until `id` is finished, failing it if the peers it needs are gone.
    pub(crate) fn wait(&mut self, lend: &mut LendTable, id: ReqId) -> Result<()> {
        self.progress_until(lend, |e| !e.reqs.is_pending(id), |e, l| e.check_liveness(l, id))
    }

    /// Drives progress until every request of `ids` is finished (liveness
    /// checked for the first one still pending).
    pub(crate) fn wait_all(&mut self, lend: &mut LendTable, ids: &[ReqId]) -> Result<()> {
        self.progress_until(
            lend,
            |e| ids.iter().all(|&id| !e.reqs.is_pending(id)),
            |e, l| match ids.iter().copied().find(|&id| e.reqs.is_pending(id)) {
                Some(id) => e.check_liveness(l, id),
                None => Ok(()),
            },
        )
    }

    /// The job's first failure, if the launcher has told it (cheap once known).
    pub(crate) fn job_failure(&mut self) -> Option<&Failure> {
        if self.failure.is_none() {
            self.failure = self.link.as_ref().and_then(|l| l.failure());
        }
        self.failure.as_ref()
    }

    /// Drives progress until one request of `ids` is finished (liveness
    /// checked for every one still pending).
    pub(crate) fn wait_any(&mut self, lend: &mut LendTable, ids: &[ReqId]) -> Result<()> {
        self.progress_until(
            lend,
            |e| ids.iter().any(|&id| !e.reqs.is_pending(id)),
            |e, l| ids.iter().try_for_each(|&id| e.check_liveness(l, id)),
        )
    }

    /// Fails (or, for a wildcard, reports) a wait that can no longer be
    /// completed by the peers it waits on. What they sent before going may
    /// still be in our slots, so progress runs once first.
    fn check_liveness(&mut self, lend: &mut LendTable, id: ReqId) -> Result<()> {
        let Some(r) = self.reqs.get(id) else {
            return Ok(());
        };
        let (what, waits_on) = (r.what, r.waits_on.clone());
        if self.job_failure().is_some() {
            self.progress(lend)?;
            if self.reqs.is_pending(id) {
                let e = self.failure.as_ref().map(|f| f.error(what)).expect("checked above");
                self.reqs.fail(id, e);
                self.cancel(id); // failed first: what the cancel settles cannot replace the reason
            }
            return Ok(());
        }
        let coll = self.reqs.get(id).and_then(|r| r.coll);
        match waits_on {
            WaitsOn::Peer(peer) => {
                if let Some((ctx, tag)) = coll {
                    // Messages between two ranks on a context never overtake each
                    // other, so a collective message from `peer` with another tag
                    // that is already here means `peer` is not in this collective.
                    if let Some(other) = self.matching.first_tag_from(ctx, peer).filter(|&t| t != tag) {
                        self.reqs.fail(
                            id,
                            Error::CollectiveMismatch {
                                op: crate::coll::util::coll_name(tag),
                                detail: format!(
                                    "world rank {peer} sent a message of {} while this rank waits for its message of {}: \
                                 the ranks called different collectives, or the same one with different roots or counts",
                                    crate::coll::util::coll_name(other),
                                    crate::coll::util::coll_name(tag)
                                ),
                            },
                        );
                        self.cancel(id);
                        return Ok(());
                    }
                }
                self.connect_waited_on(peer);
                if let Some(state) = self.gone(peer) {
                    self.progress_all(lend)?;
                    if self.reqs.is_pending(id) {
                        self.reqs.fail(id, peer_gone(peer, what, state, false));
                        self.cancel(id); // failed first: what the cancel settles cannot replace the reason
                    }
                }
            }
            WaitsOn::AnyOf(members) => {
                let me = self.me;
                let since = self.reqs.get_mut(id).map(|r| *r.idle_since.get_or_insert_with(Instant::now));
                if since.is_some_and(|s| s.elapsed() >= WILDCARD_CONNECTS_AFTER) {
                    for &p in members.iter() {
                        self.connect_waited_on(p);
                    }
                }
                let reported = self.reqs.get(id).map(|r| r.reported.clone()).unwrap_or_default();
                let newly =
                    members.iter().copied().filter(|&p| p != me && !reported.contains(&p)).find_map(|p| self.gone(p).map(|s| (p, s)));
                if let Some((peer, state)) = newly {
                    self.progress_all(lend)?;
                    if let Some(r) = self.reqs.get_mut(id).filter(|r| matches!(r.state, requests::State::Pending)) {
                        r.reported.push(peer);
                        let all_gone = members.iter().all(|&p| p == me || r.reported.contains(&p));
                        if !all_gone {
                            // ULFM's PROC_FAILED_PENDING: the others may still send.
                            return Err(peer_gone(peer, what, state, true));
                        }
                        self.reqs.fail(id, peer_gone(peer, what, state, false));
                        self.cancel(id); // failed first: what the cancel settles cannot replace the reason
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes everything that has arrived, not one poll's batch: before a
    /// wait fails on a peer found gone (or finalized), what that peer sent
    /// before it left must have been matched. Over verbs the peer's
    /// finalized word can be read while many of its earlier messages still
    /// wait in the completion queue (seen in the two-kernel cluster: a
    /// bridge's receive failed with "finalized without a matching operation").
    pub(crate) fn progress_all(&mut self, lend: &mut LendTable) -> Result<()> {
        for _ in 0..PROGRESS_ALL_ROUNDS {
            if self.progress(lend)? == 0 {
                break;
            }
        }
        Ok(())
    }

    /// A wait on `peer` idles: with connections made on demand, connect to
    /// it. A peer that finalized without ever speaking to us tells us so
    /// over the connection (its mailbox word), instead of leaving the wait
    /// (and the finalize barrier the peer waits in) without end; a peer
    /// still working will talk to us anyway, on the same connection.
    fn connect_waited_on(&mut self, peer: u32) {
        if peer != self.me && self.tp.connects_on_demand(peer) {
            // A failure to connect shows as the peer gone.
            let _ = self.tp.preconnect(peer);
        }
    }

    /// Why an operation waiting on `waits_on` cannot complete now: the job's
    /// failure, or a departed peer (for a wildcard: any departed member).
    pub(crate) fn blocked(&mut self, waits_on: &WaitsOn, what: &str) -> Option<Error> {
        if let Some(f) = self.job_failure() {
            return Some(f.error(what));
        }
        let me = self.me;
        let (peer, state) = match waits_on {
            WaitsOn::Peer(p) => self.gone(*p).map(|s| (*p, s)),
            WaitsOn::AnyOf(ps) => ps.iter().copied().filter(|&p| p != me).find_map(|p| self.gone(p).map(|s| (p, s))),
        }?;
        Some(peer_gone(peer, what, state, false))
    }

    /// A one-sided operation's failure as the request reports it: when its
    /// peer is gone (the device's error is the consequence: a reset
    /// connection, a flushed queue), an error that names the peer as gone,
    /// whichever of the two the transport saw first.
    fn because_gone(&mut self, peer: u32, req: ReqId, e: TransportError) -> Error {
        if matches!(e, TransportError::PeerGone { .. }) {
            return e.into();
        }
        match self.gone(peer) {
            Some(state) => {
                let what = self.reqs.get(req).map_or("a one-sided operation", |r| r.what);
                match peer_gone(peer, what, state, false) {
                    Error::PeerGone { rank, world_rank, during, reason, pending } => {
                        Error::PeerGone { rank, world_rank, during, reason: format!("{reason} ({e})"), pending }
                    }
                    other => other,
                }
            }
            None => e.into(),
        }
    }

    /// The first peer whose process is gone without finalizing, as the error of `during`.
    pub(crate) fn dead_peer(&mut self, during: &str) -> Option<Error> {
        let me = self.me;
        (0..self.tp.num_peers()).filter(|&p| p != me).find_map(|p| match self.tp.peer_state(p) {
            PeerState::Dead => Some(peer_gone(p, during, PeerState::Dead, false)),
            _ => None,
        })
    }

    fn gone(&mut self, peer: u32) -> Option<PeerState> {
        match self.tp.peer_state(peer) {
            PeerState::Alive => None,
            s => Some(s),
        }
    }

    /// Withdraws a pending operation (its scope is ending with an error).
    pub(crate) fn cancel(&mut self, id: ReqId) {
        self.matching.cancel(id);
        // A device may still be writing into (or reading) the request's buffer:
        // it must finish (or fail) before the buffer's borrow can end. When the
        // job is failing or the peer is gone it may never finish (libfabric's
        // shm provider never completes a read from a killed peer): after a
        // short wait the transport abandons it, if it can.
        let peers: Vec<u32> = self.inflight.values().filter(|op| op.req == id).map(|op| op.peer).collect();
        if peers.is_empty() {
            return self.withdraw(id);
        }
        let failing = self.job_failure().is_some() || peers.iter().any(|&p| self.gone(p).is_some());
        let limit = if failing { ABANDON_AFTER } else { INFLIGHT_DRAIN_LIMIT };
        let deadline = Instant::now() + limit;
        while self.inflight.values().any(|op| op.req == id) && Instant::now() < deadline {
            if self.finish_inflight().is_err() {
                break;
            }
            std::thread::yield_now();
        }
        if failing && self.inflight.values().any(|op| op.req == id) && self.tp.abandon("the job is failing: a peer is gone") {
            let _ = self.finish_inflight();
        }
        self.withdraw(id);
    }

    /// Revokes a request's exposure and drops its queued sends.
    fn withdraw(&mut self, id: ReqId) {
        if let Some(key) = self.reqs.get_mut(id).and_then(|r| r.exposed.take()) {
            self.tp.revoke(&key);
        }
        if self.queued == 0 {
            return; // nothing queued: no need to look through every peer's queue
        }
        for q in &mut self.outq {
            let before = q.len();
            q.retain(|o| o.completes != Some(id));
            self.queued -= before - q.len();
        }
    }

    /// Frees a request whatever its state.
    pub(crate) fn discard(&mut self, id: ReqId) {
        self.cancel(id);
        self.reqs.discard(id);
    }

    /// Drives progress until no send waits for credits; fails if a peer we
    /// still owe messages is gone, or the job is failing.
    pub(crate) fn drain_queued(&mut self, lend: &mut LendTable) -> Result<()> {
        const DURING: &str = "finalizing (sends still queued)";
        self.progress_until(
            lend,
            |e| e.queued == 0,
            |e, _| {
                if let Some(f) = e.job_failure() {
                    return Err(f.error(DURING));
                }
                let dests: Vec<u32> = (0..e.outq.len()).filter(|&q| !e.outq[q].is_empty()).map(|q| (q / 2) as u32).collect();
                match dests.into_iter().find_map(|p| e.gone(p).map(|s| (p, s))) {
                    Some((peer, state)) => Err(peer_gone(peer, DURING, state, false)),
                    None => Ok(()),
                }
            },
        )
    }

    /// Sends an eager-sized message whose data the engine keeps: now if credits
    /// allow, else queued behind earlier sends to `dest` (never blocks).
    pub(crate) fn send_owned(&mut self, ctx: u32, tag: u32, dest: u32, data: Vec<u8>) -> Result<()> {
        if data.len() > self.max_eager {
            // Rendezvous from the vector we now own (its heap buffer does not move);
            // the request frees itself, and the vector, when the receiver says FIN.
            #[allow(unsafe_code)]
            // SAFETY: the vector moves into the request below, and its heap buffer
            // does not move with it; the request drops it only when the receiver's
            // FIN says it read everything, or after `withdraw` revoked the key.
            let key = unsafe { self.tp.expose_to(dest, &data)? };
            let len = data.len() as u64;
            let req = self.reqs.insert(WaitsOn::Peer(dest), "sending an active message");
            if let Some(r) = self.reqs.get_mut(req) {
                r.exposed = Some(key);
                r.owned = Some(data);
            }
            let header = MsgHeader::control(MsgKind::Rts, match_bits(ctx, tag), len, req.cookie(), RemoteKey::BYTES);
            let sent = self.send_control(dest, header, Payload::Key(key.encode()));
            if sent.is_err() {
                self.discard(req); // revokes the key before the vector is dropped
            }
            return sent;
        }
        let header = MsgHeader::eager(match_bits(ctx, tag), data.len(), 0);
        if self.outq[queue(dest, MsgKind::Eager)].is_empty() && self.tp.try_send(dest, &header, &data)? == SendOutcome::Sent {
            return Ok(());
        }
        self.enqueue(dest, Outgoing { header, payload: Payload::Owned(data), completes: None, since: Instant::now() });
        Ok(())
    }

    /// Whether an eager message to `dest` would go out now.
    pub(crate) fn can_send_now(&mut self, dest: u32) -> SendOutcome {
        if !self.outq[queue(dest, MsgKind::Eager)].is_empty() {
            return SendOutcome::Backpressure;
        }
        self.tp.credit(dest)
    }

    /// Takes the earliest unexpected eager message on `ctx` (any source, any tag):
    /// (source, tag, data). Rendezvous offers stay queued (see `has_unexpected_rts`).
    pub(crate) fn take_unexpected_eager(&mut self, ctx: u32) -> Option<(u32, u32, Vec<u8>)> {
        self.matching.take_unexpected_eager(ctx, None, None).map(|(src, tag, d)| (src, tag, d.into_vec()))
    }

    /// The earliest unexpected message on `ctx`, if it is a rendezvous offer: (source, tag, length).
    pub(crate) fn peek_unexpected_rts(&self, ctx: u32) -> Option<(u32, u32, u64)> {
        let u = self.matching.peek_unexpected(ctx, None, None)?;
        matches!(u.body, Body::Rts { .. }).then_some((u.src, u.tag, u.len))
    }

    /// Sends an eager message now or not at all (no queueing).
    #[inline]
    pub(crate) fn try_send_now(&mut self, ctx: u32, tag: u32, dest: u32, data: &[u8]) -> Result<SendOutcome> {
        if data.len() > self.max_eager {
            return Err(Error::InvalidCount {
                what: "try_send",
                detail: format!("{} bytes exceed the eager limit of {} bytes of this transport", data.len(), self.max_eager),
            });
        }
        if !self.outq[queue(dest, MsgKind::Eager)].is_empty() {
            return Ok(SendOutcome::Backpressure); // earlier sends to `dest` go first
        }
        Ok(self.tp.try_send(dest, &MsgHeader::eager(match_bits(ctx, tag), data.len(), 0), data)?)
    }
}

/// Bounds [`Engine::progress_all`] (each round takes up to `POLL_BATCH` arrivals).
const PROGRESS_ALL_ROUNDS: usize = 4096;

/// The error for `peer` departed (in `state`) while `what` waited on it.
fn peer_gone(peer: u32, what: &str, state: PeerState, pending: bool) -> Error {
    let reason = match state {
        PeerState::Finalized => "it finalized without a matching operation",
        _ => "its process exited or was killed",
    };
    crate::log::peer_lost(peer, reason, what);
    Error::PeerGone { rank: peer, world_rank: peer, during: what.to_owned(), reason: reason.into(), pending }
}

/// Completes receive `req` with eager `data` from `src`.
fn deliver(reqs: &mut Requests, lend: &mut LendTable, req: ReqId, buf: Lent, src: u32, tag: u32, data: &[u8]) {
    match lend.get_mut(buf) {
        Some(dst) => {
            let n = dst.len().min(data.len());
            dst[..n].copy_from_slice(&data[..n]);
            reqs.complete(req, RawStatus { src, tag, sent: data.len() as u64, capacity: dst.len() as u64 });
        }
        None => reqs.fail(req, Error::StaleRequest(req.index())),
    }
}

#[allow(clippy::too_many_arguments)]
#[inline]
fn on_message(
    matching: &mut Matching,
    reqs: &mut Requests,
    poison: &mut Option<Error>,
    lend: &mut LendTable,
    peer: u32,
    h: &MsgHeader,
    payload: &[u8],
) -> Option<Action> {
    let (ctx, tag) = split_bits(h.match_bits);
    match h.kind {
        MsgKind::Eager => match matching.take_posted(peer, ctx, tag) {
            Some(p) => deliver(reqs, lend, p.req, p.buf, peer, tag, payload),
            None => matching.arrive(Unexpected { src: peer, ctx, tag, len: h.len, body: Body::Eager(Stored::new(payload)) }),
        },
        MsgKind::Rts => {
            let Some(key) = RemoteKey::decode(payload) else {
                *poison = Some(fmx_transport::TransportError::Malformed { peer, what: "RTS without a remote key" }.into());
                return None;
            };
            match matching.take_posted(peer, ctx, tag) {
                Some(p) => return Some(Action::Read { req: p.req, peer, key, cookie: h.cookie, buf: p.buf, tag }),
                None => matching.arrive(Unexpected { src: peer, ctx, tag, len: h.len, body: Body::Rts { key, cookie: h.cookie } }),
            }
        }
        MsgKind::Fin => {
            // The peer is done with its part of a rendezvous (read our buffer, or wrote its half of ours).
            let req = ReqId::from_cookie(h.cookie);
            if let Some(r) = reqs.get_mut(req) {
                let key = r.exposed.take();
                reqs.part_done(req, RawStatus { src: peer, tag: 0, sent: h.len, capacity: h.len });
                return key.map(Action::Revoke);
            }
        }
        MsgKind::Cts => {
            let req = ReqId::from_cookie(h.cookie);
            let Some(key) = RemoteKey::decode(payload) else {
                *poison = Some(fmx_transport::TransportError::Malformed { peer, what: "CTS without a remote key" }.into());
                return None;
            };
            if let Some(r) = reqs.get_mut(req) {
                // Two parts now: our write of the second half, and the receiver's FIN.
                r.parts_left += 1;
                return Some(Action::WriteHalf { req, peer, key, recv_cookie: h.match_bits });
            }
        }
        MsgKind::Credit | MsgKind::Internal => {}
    }
    None
}

/// The world ranks of a group, shared by requests that wait on any of them.
pub(crate) type Members = Rc<[u32]>;
