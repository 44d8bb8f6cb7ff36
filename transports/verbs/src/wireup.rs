//! Queue pairs made on demand (`FMX_CONNECT=lazy`): the handshake that
//! agrees on one RC queue pair between two ranks, over the one UD queue pair
//! each rank creates at init and publishes (its number is in the rank's
//! fixed-size address), in the way InfiniBand's connection manager does it:
//! REQ (the initiator's QP number and PSN), REP (the responder's), RTU (the
//! initiator is ready to receive). UD loses datagrams, so REQ and REP are
//! sent again, backing off, until their answer comes.
//!
//! Pure logic: no verbs call. The endpoint creates the queue pair before it
//! asks to connect or hands a REQ in ([`Wireup::created`]), and does what
//! the answers say (move the QP to RTR/RTS, send a datagram). Tested here
//! with two machines wired to each other in memory, losing and repeating
//! datagrams, and crossing (both sides starting at once: the smaller rank's
//! request wins, the larger rank answers it with the QP it had made for its
//! own request, so one queue pair results on each side).
//!
//! The responder sends nothing on its new queue pair until it is ready
//! ([`Wireup::is_ready`]): the RTU, or the initiator's first message on the
//! queue pair, says the initiator's QP can receive (a packet toward a QP
//! still in INIT is dropped, and would cost the sender an ACK timeout).

use std::time::{Duration, Instant};

use fmx_transport::PeerId;

/// The first wait for an answer; each resend doubles it, up to [`RESEND_MAX`].
pub(crate) const RESEND_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two resends.
pub(crate) const RESEND_MAX: Duration = Duration::from_secs(1);
/// How long a handshake may go unanswered before the connection fails (the
/// peer may be computing outside fmx for a while: it answers at its next call).
pub(crate) const GIVE_UP: Duration = Duration::from_secs(60);

/// A handshake datagram's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// "Connect to my queue pair": the initiator's QP number and PSN.
    Req = 1,
    /// "Mine is connected to yours": the responder's QP number and PSN.
    Rep = 2,
    /// "Mine is connected too": the responder may send.
    Rtu = 3,
}

/// One handshake datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Msg {
    pub(crate) kind: Kind,
    pub(crate) from: PeerId,
    pub(crate) to: PeerId,
    /// The sender's RC queue pair toward the receiver, and its first PSN.
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
}

const MAGIC: u32 = 0x574d_5846; // "FXMW"
/// Bytes of an encoded [`Msg`].
pub(crate) const MSG_BYTES: usize = 20;

impl Msg {
    pub(crate) fn encode(&self) -> [u8; MSG_BYTES] {
        let mut b = [0u8; MSG_BYTES];
        b[0..4].copy_from_slice(&(MAGIC ^ self.kind as u32).to_le_bytes());
        b[4..8].copy_from_slice(&self.from.to_le_bytes());
        b[8..12].copy_from_slice(&self.to.to_le_bytes());
        b[12..16].copy_from_slice(&self.qpn.to_le_bytes());
        b[16..20].copy_from_slice(&self.psn.to_le_bytes());
        b
    }

    /// `None` for anything that is not a handshake datagram.
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let b = b.get(..MSG_BYTES)?;
        let at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let kind = match at(0) ^ MAGIC {
            1 => Kind::Req,
            2 => Kind::Rep,
            3 => Kind::Rtu,
            _ => return None,
        };
        Some(Self { kind, from: at(4), to: at(8), qpn: at(12), psn: at(16) })
    }
}

/// A queue pair's number and first PSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpId {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No queue pair toward the peer.
    Idle,
    /// Our queue pair exists (INIT); nothing sent yet.
    Created { local: QpId },
    /// We sent a REQ and wait for the REP.
    Requesting { local: QpId, resend: Resend },
    /// We answered a REQ (our QP is RTS) and wait for the RTU or the peer's first message.
    Answered { local: QpId, remote: QpId, resend: Resend },
    /// Both queue pairs are connected.
    Ready { local: QpId, remote: QpId },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Resend {
    started: Instant,
    next: Instant,
    wait: Duration,
}

impl Resend {
    fn new(now: Instant) -> Self {
        Self { started: now, next: now + RESEND_FIRST, wait: RESEND_FIRST }
    }

    /// Due now: the next one waits twice as long.
    fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.wait = (self.wait * 2).min(RESEND_MAX);
        self.next = now + self.wait;
        true
    }
}

/// What the endpoint must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send this datagram to `msg.to`'s UD queue pair.
    Send(Msg),
    /// Move our queue pair toward `peer` to RTR and RTS, toward `remote`.
    Connect { peer: PeerId, remote: QpId },
    /// The connection to `peer` failed.
    Fail { peer: PeerId, why: String },
}

/// The handshake state toward every peer of one endpoint.
#[derive(Debug)]
pub(crate) struct Wireup {
    me: PeerId,
    states: Vec<State>,
    /// Peers in `Requesting` or `Answered` (resends may be due).
    open: usize,
}

impl Wireup {
    pub(crate) fn new(me: PeerId, size: u32) -> Self {
        Self { me, states: vec![State::Idle; size as usize], open: 0 }
    }

    fn state(&self, peer: PeerId) -> State {
        self.states.get(peer as usize).copied().unwrap_or(State::Idle)
    }

    fn set(&mut self, peer: PeerId, s: State) {
        let open = |s: &State| matches!(s, State::Requesting { .. } | State::Answered { .. });
        let was = open(&self.states[peer as usize]);
        self.open = self.open + usize::from(open(&s)) - usize::from(was);
        self.states[peer as usize] = s;
    }

    /// Whether a queue pair toward `peer` exists (or must be created before
    /// [`Wireup::start`] or a REQ from it).
    pub(crate) fn has_qp(&self, peer: PeerId) -> bool {
        self.state(peer) != State::Idle
    }

    /// Our queue pair toward `peer` was created (and is in INIT).
    pub(crate) fn created(&mut self, peer: PeerId, local: QpId) {
        if self.state(peer) == State::Idle && peer != self.me && (peer as usize) < self.states.len() {
            self.set(peer, State::Created { local });
        }
    }

    /// Whether messages may go to `peer` on the queue pair.
    pub(crate) fn is_ready(&self, peer: PeerId) -> bool {
        matches!(self.state(peer), State::Ready { .. })
    }

    /// Whether some handshake waits for an answer (then [`Wireup::tick`] is worth calling).
    pub(crate) fn any_open(&self) -> bool {
        self.open > 0
    }

    /// We want to reach `peer` (its queue pair was [`Wireup::created`]):
    /// the REQ, unless a handshake is already under way.
    pub(crate) fn start(&mut self, peer: PeerId, now: Instant) -> Option<Action> {
        let State::Created { local } = self.state(peer) else { return None };
        self.set(peer, State::Requesting { local, resend: Resend::new(now) });
        Some(Action::Send(self.msg(Kind::Req, peer, local)))
    }

    fn msg(&self, kind: Kind, to: PeerId, local: QpId) -> Msg {
        Msg { kind, from: self.me, to, qpn: local.qpn, psn: local.psn }
    }

    /// A datagram from `m.from` (already checked to come from that rank's UD
    /// queue pair). A REQ needs our queue pair: [`Wireup::created`] first.
    pub(crate) fn on_msg(&mut self, m: &Msg, now: Instant) -> Vec<Action> {
        let peer = m.from;
        if m.to != self.me || peer == self.me || peer as usize >= self.states.len() {
            return Vec::new();
        }
        let remote = QpId { qpn: m.qpn, psn: m.psn };
        match (m.kind, self.state(peer)) {
            // A crossing REQ from a larger rank while ours is out: ours wins, it answers ours.
            (Kind::Req, State::Requesting { .. }) if peer > self.me => Vec::new(),
            (Kind::Req, State::Created { local } | State::Requesting { local, .. }) => {
                self.set(peer, State::Answered { local, remote, resend: Resend::new(now) });
                vec![Action::Connect { peer, remote }, Action::Send(self.msg(Kind::Rep, peer, local))]
            }
            // Our REP was lost (or is late): the same answer again.
            (Kind::Req, State::Answered { local, remote: r, .. } | State::Ready { local, remote: r }) if r == remote => {
                vec![Action::Send(self.msg(Kind::Rep, peer, local))]
            }
            (Kind::Rep, State::Requesting { local, .. }) => {
                self.set(peer, State::Ready { local, remote });
                vec![Action::Connect { peer, remote }, Action::Send(self.msg(Kind::Rtu, peer, local))]
            }
            // Our RTU was lost: again.
            (Kind::Rep, State::Ready { local, remote: r }) if r == remote => vec![Action::Send(self.msg(Kind::Rtu, peer, local))],
            (Kind::Rtu, State::Answered { local, remote: r, .. }) if r == remote => {
                self.set(peer, State::Ready { local, remote });
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// A message from `peer` arrived on its queue pair: its QP is connected
    /// (the RTU may still be on its way, or lost).
    pub(crate) fn on_arrival(&mut self, peer: PeerId) {
        if let State::Answered { local, remote, .. } = self.state(peer) {
            self.set(peer, State::Ready { local, remote });
        }
    }

    /// Resends what is due; a handshake unanswered for [`GIVE_UP`] fails.
    /// `alive(peer)`: whether the peer may still answer (a dead one fails now).
    pub(crate) fn tick(&mut self, now: Instant, alive: impl Fn(PeerId) -> bool) -> Vec<Action> {
        let mut out = Vec::new();
        if self.open == 0 {
            return out;
        }
        for peer in 0..self.states.len() as PeerId {
            let (kind, local, mut resend) = match self.state(peer) {
                State::Requesting { local, resend } => (Kind::Req, local, resend),
                State::Answered { local, resend, .. } => (Kind::Rep, local, resend),
                _ => continue,
            };
            let waited = now.saturating_duration_since(resend.started);
            if waited >= GIVE_UP || !alive(peer) {
                self.set(peer, State::Idle);
                let why = if alive(peer) {
                    format!("no answer from rank {peer} to our connection request for {} s", waited.as_secs())
                } else {
                    format!("rank {peer} is gone")
                };
                out.push(Action::Fail { peer, why });
                continue;
            }
            if resend.due(now) {
                out.push(Action::Send(self.msg(kind, peer, local)));
            }
            match &mut self.states[peer as usize] {
                State::Requesting { resend: r, .. } | State::Answered { resend: r, .. } => *r = resend,
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks' machines and the endpoint's part: queue pairs (made on
    /// demand) and their connections, datagrams in flight.
    struct Pair {
        w: [Wireup; 2],
        qps: [Option<QpId>; 2],
        connected: [Option<QpId>; 2],
        wire: Vec<Msg>,
    }

    impl Pair {
        fn new() -> Self {
            Self { w: [Wireup::new(0, 2), Wireup::new(1, 2)], qps: [None; 2], connected: [None; 2], wire: Vec::new() }
        }

        fn qp(&mut self, side: usize) {
            if !self.w[side].has_qp(1 - side as u32) {
                let id = QpId { qpn: 100 + side as u32, psn: 7 + side as u32 };
                self.qps[side] = Some(id);
                self.w[side].created(1 - side as u32, id);
            }
        }

        fn act(&mut self, side: usize, actions: Vec<Action>) {
            for a in actions {
                match a {
                    Action::Send(m) => self.wire.push(m),
                    Action::Connect { remote, .. } => {
                        assert!(self.connected[side].is_none() || self.connected[side] == Some(remote), "a QP connects once");
                        self.connected[side] = Some(remote);
                    }
                    Action::Fail { why, .. } => panic!("failed: {why}"),
                }
            }
        }

        fn start(&mut self, side: usize, now: Instant) {
            self.qp(side);
            let a = self.w[side].start(1 - side as u32, now).into_iter().collect();
            self.act(side, a);
        }

        /// Delivers what is on the wire (dropping datagrams for which `drop` says so).
        fn deliver(&mut self, now: Instant, mut drop: impl FnMut(&Msg) -> bool) {
            for m in std::mem::take(&mut self.wire) {
                if drop(&m) {
                    continue;
                }
                let side = m.to as usize;
                if m.kind == Kind::Req {
                    self.qp(side);
                }
                let a = self.w[side].on_msg(&m, now);
                self.act(side, a);
            }
        }

        fn settled(&self) -> bool {
            self.w[0].is_ready(1)
                && self.w[1].is_ready(0)
                && self.connected[0] == self.qps[1]
                && self.connected[1] == self.qps[0]
                && !self.w[0].any_open()
                && !self.w[1].any_open()
        }
    }

    #[test]
    fn req_rep_rtu_connects_both_queue_pairs_once() {
        let t = Instant::now();
        let mut p = Pair::new();
        p.start(1, t);
        assert!(!p.w[1].is_ready(0));
        p.deliver(t, |_| false); // REQ
        assert!(!p.w[0].is_ready(1), "the responder waits for the RTU before it sends");
        p.deliver(t, |_| false); // REP
        assert!(p.w[1].is_ready(0), "the initiator is ready once its QP is connected");
        p.deliver(t, |_| false); // RTU
        assert!(p.settled());
        assert!(p.wire.is_empty());
    }

    #[test]
    fn crossing_requests_make_one_connection_the_smaller_rank_s() {
        let t = Instant::now();
        let mut p = Pair::new();
        p.start(0, t);
        p.start(1, t);
        for _ in 0..4 {
            p.deliver(t, |_| false);
        }
        assert!(p.settled(), "{:?}", p.w);
        // Rank 1 answered rank 0's request with the QP made for its own.
        assert_eq!(p.connected[0], Some(QpId { qpn: 101, psn: 8 }));
    }

    #[test]
    fn lost_datagrams_are_sent_again_until_answered() {
        let t = Instant::now();
        for lose in [Kind::Req, Kind::Rep, Kind::Rtu] {
            let mut p = Pair::new();
            p.start(1, t);
            let mut lost = false;
            let mut now = t;
            for _ in 0..20 {
                p.deliver(now, |m| {
                    let l = m.kind == lose && !lost;
                    lost |= l;
                    l
                });
                now += RESEND_MAX;
                let a0 = p.w[0].tick(now, |_| true);
                let a1 = p.w[1].tick(now, |_| true);
                p.act(0, a0);
                p.act(1, a1);
                if p.settled() {
                    break;
                }
            }
            assert!(lost && p.settled(), "losing a {lose:?}: {:?}", p.w);
        }
    }

    #[test]
    fn an_arrival_on_the_queue_pair_stands_for_a_lost_rtu() {
        let t = Instant::now();
        let mut p = Pair::new();
        p.start(1, t);
        p.deliver(t, |_| false);
        p.deliver(t, |_| false);
        p.wire.clear(); // the RTU is lost
        p.w[0].on_arrival(1);
        assert!(p.settled());
    }

    #[test]
    fn duplicates_and_strangers_change_nothing() {
        let t = Instant::now();
        let mut p = Pair::new();
        p.start(1, t);
        let req = p.wire[0];
        p.deliver(t, |_| false);
        p.deliver(t, |_| false);
        p.deliver(t, |_| false);
        assert!(p.settled());
        // A late duplicate REQ gets the same REP, whose duplicate RTU is ignored.
        p.qp(0);
        let a = p.w[0].on_msg(&req, t);
        assert!(matches!(a.as_slice(), [Action::Send(Msg { kind: Kind::Rep, .. })]), "{a:?}");
        p.act(0, a);
        p.deliver(t, |_| false);
        p.deliver(t, |_| false);
        assert!(p.settled() && p.wire.is_empty());
        // Not for us, from ourselves, from outside the job, a different QP: nothing.
        for m in [Msg { to: 5, ..req }, Msg { from: 0, to: 0, ..req }, Msg { from: 9, ..req }, Msg { qpn: 999, ..req }] {
            assert!(p.w[0].on_msg(&m, t).is_empty(), "{m:?}");
        }
        assert!(p.settled());
    }

    #[test]
    fn an_unanswered_request_fails_naming_the_peer_and_a_dead_one_at_once() {
        let t = Instant::now();
        let mut w = Wireup::new(0, 3);
        w.created(2, QpId { qpn: 1, psn: 1 });
        assert!(w.start(2, t).is_some());
        assert!(w.tick(t + Duration::from_secs(30), |_| true).iter().all(|a| matches!(a, Action::Send(_))));
        let a = w.tick(t + GIVE_UP, |_| true);
        assert!(matches!(&a[..], [Action::Fail { peer: 2, why }] if why.contains("rank 2")), "{a:?}");
        assert!(!w.any_open());
        w.created(1, QpId { qpn: 2, psn: 2 });
        let _ = w.start(1, t);
        let a = w.tick(t, |p| p != 1);
        assert!(matches!(&a[..], [Action::Fail { peer: 1, why }] if why.contains("gone")), "{a:?}");
    }

    #[test]
    fn datagrams_round_trip_and_others_are_refused() {
        let m = Msg { kind: Kind::Rep, from: 3, to: 4, qpn: 0x12_3456, psn: 0xab_cdef };
        assert_eq!(Msg::decode(&m.encode()), Some(m));
        assert_eq!(Msg::decode(&[0u8; MSG_BYTES]), None);
        assert_eq!(Msg::decode(&m.encode()[..10]), None);
    }
}
