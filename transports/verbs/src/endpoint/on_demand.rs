//! Queue pairs made on demand (`FMX_CONNECT=lazy`), on the verbs endpoint:
//! the first operation toward a peer (a send, a rendezvous piece, a credit
//! word), or the peer's request, makes our queue pair toward it, grants and
//! posts its receive slots, and runs the handshake of [`crate::wireup`]
//! over the UD channel. Until the handshake ends the operation is told
//! "not now" (backpressure) and tried again, as with a full send queue.

use std::time::Instant;

use fmx_transport::{PeerId, TransportError};

use super::{connect_with_retry, QpShape, VerbsEndpoint};
use crate::channel::{Channel, UdPeer};
use crate::sys::{ffi, PeerPath, QpTiming};
use crate::wireup::{Action, Kind, QpId, Wireup};

/// What connecting on demand needs besides the endpoint's queues.
pub(crate) struct OnDemand {
    pub(super) wire: Wireup,
    pub(super) channel: Channel,
    /// Every rank's UD queue pair.
    pub(super) ud: Vec<UdPeer>,
    /// Where every rank's port is (the QP number and PSN come from the handshake).
    pub(super) paths: Vec<PeerPath>,
    pub(super) timing: QpTiming,
    pub(super) shape: QpShape,
}

impl VerbsEndpoint {
    /// Whether work requests may go to `peer` now. Lazily, when not yet,
    /// makes the queue pair and starts the handshake if none is under way;
    /// an error when the peer is dead or connecting to it failed.
    #[inline]
    pub(super) fn ready(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        match self.on_demand.as_deref() {
            None => Ok(true),
            Some(od) if od.wire.is_ready(peer) => Ok(true),
            Some(_) => self.connect_to(peer),
        }
    }

    /// Whether our queue pair toward `peer` is connected (making nothing).
    pub(super) fn is_connected(&self, peer: PeerId) -> bool {
        self.on_demand.as_deref().is_none_or(|od| od.wire.is_ready(peer))
    }

    #[cold]
    fn connect_to(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        self.st.peers.alive(peer)?;
        self.open_qp(peer)?;
        let od = self.on_demand.as_deref_mut().expect("connecting on demand");
        if let Some(req) = od.wire.start(peer, Instant::now()) {
            tracing::debug!(rank = self.st.rank, "connecting to rank {peer} on demand");
            self.act(vec![req]);
        }
        Ok(false)
    }

    /// Makes our queue pair toward `peer` (once): in INIT, with the receive
    /// slots granted to the connection registered and posted, before any
    /// message can come on it. A failure marks the peer dead, named.
    fn open_qp(&mut self, peer: PeerId) -> Result<(), TransportError> {
        let od = self.on_demand.as_deref().expect("connecting on demand");
        if od.wire.has_qp(peer) {
            return Ok(());
        }
        let (shape, port) = (od.shape, od.timing.port);
        let made = shape.create(&self.pd, &self.send_cq, &self.recv_cq, self.srq.as_ref()).and_then(|qp| qp.to_init(port).map(|()| qp));
        let qp = match made {
            Ok(qp) => qp,
            Err(source) => {
                self.st.mark_dead(peer, format!("making a queue pair toward rank {peer} failed: {source}"), false);
                return Err(TransportError::Io { op: "make a queue pair on demand", peer, source });
            }
        };
        let qpn = qp.qpn();
        let p = self.st.peers.alive(peer)?;
        let id = QpId { qpn, psn: p.link.psn };
        p.link.qp = Some(qp);
        let at = self.qpn_to_peer.partition_point(|&(q, _)| q < qpn);
        self.qpn_to_peer.insert(at, (qpn, peer));
        self.on_demand.as_deref_mut().expect("connecting on demand").wire.created(peer, id);
        self.st.grant(peer);
        for (p, slots) in self.st.take_posts() {
            if let Err(e) = self.post_granted(p, slots) {
                self.st.mark_dead(p, format!("posting the receive slots of the connection to rank {p} failed: {e}"), false);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Registers and posts receive slots `slots`, granted to `peer`.
    pub(super) fn post_granted(&mut self, peer: PeerId, slots: std::ops::Range<usize>) -> Result<(), TransportError> {
        if self.regions.register(&self.pd, peer, slots.clone())? {
            self.st.registrations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for slot in slots {
            self.post_slot(slot, peer)?;
        }
        Ok(())
    }

    /// Posts receive slot `slot` (of `peer`) to the shared receive queue, or to the peer's queue pair.
    pub(super) fn post_slot(&self, slot: usize, peer: PeerId) -> Result<(), TransportError> {
        let Some((addr, lkey)) = self.regions.slot(slot) else {
            return Err(TransportError::Malformed { peer, what: "a receive slot outside every registration" });
        };
        let len = self.st.slot_bytes as u32;
        let posted = match (&self.srq, self.st.peers.get(peer as usize)) {
            // SAFETY: the slot lies in a registered stretch of the receive
            // region, which the endpoint owns until its queues are destroyed.
            (Some(srq), _) => unsafe { srq.post_recv(slot as u64, addr, len, lkey) },
            (None, Some(Some(p))) => match &p.link.qp {
                // SAFETY: as above, on the queue pair of the peer that owns the slot.
                Some(qp) => unsafe { qp.post_recv(slot as u64, addr, len, lkey) },
                None => return Ok(()),
            },
            (None, _) => return Ok(()),
        };
        posted.map_err(|source| TransportError::Io { op: "post a receive slot", peer, source })
    }

    /// A completion of the UD channel: a handshake datagram, checked to
    /// come from the rank it names.
    pub(super) fn on_datagram(&mut self, wc: &ffi::ibv_wc) {
        let od = self.on_demand.as_deref_mut().expect("connecting on demand");
        let Some((m, src_qp)) = od.channel.received(wc) else { return };
        if !Channel::from_peer(m.from, src_qp, &od.ud) {
            tracing::debug!(rank = self.st.rank, "dropped a wire-up datagram naming rank {} from UD QP {src_qp:#x}", m.from);
            return;
        }
        if self.st.peers.alive(m.from).is_err() {
            return;
        }
        if m.kind == Kind::Req && self.open_qp(m.from).is_err() {
            return; // the peer is marked dead, with the reason
        }
        let od = self.on_demand.as_deref_mut().expect("connecting on demand");
        let actions = od.wire.on_msg(&m, Instant::now());
        self.act(actions);
    }

    /// Resends the handshake datagrams that are due; fails those unanswered too long.
    pub(super) fn tick_wireup(&mut self) {
        let Some(od) = self.on_demand.as_deref_mut() else { return };
        if !od.wire.any_open() {
            return;
        }
        let peers = &self.st.peers;
        let alive = |p: PeerId| matches!(peers.get(p as usize), Some(Some(x)) if x.life.failure().is_none());
        let actions = od.wire.tick(Instant::now(), alive);
        self.act(actions);
    }

    /// Does what the handshake asks.
    fn act(&mut self, actions: Vec<Action>) {
        for a in actions {
            let od = self.on_demand.as_deref_mut().expect("connecting on demand");
            match a {
                Action::Send(m) => {
                    let to = od.ud[m.to as usize];
                    // Not sent now (no buffer): the handshake sends it again.
                    let _ = od.channel.send(&m, &to);
                }
                Action::Connect { peer, remote } => {
                    let path = PeerPath { qpn: remote.qpn, psn: remote.psn, ..od.paths[peer as usize] };
                    let timing = od.timing;
                    let Some(Some(p)) = self.st.peers.get(peer as usize) else { continue };
                    let Some(qp) = p.link.qp.as_ref() else { continue };
                    match connect_with_retry(|| qp.to_rts(timing, p.link.psn, &path)) {
                        Ok(()) => tracing::debug!(
                            rank = self.st.rank,
                            "queue pair to rank {peer} connected on demand: remote QPN {:#x}",
                            remote.qpn
                        ),
                        Err(e) => self.st.mark_dead(peer, format!("connecting the queue pair to rank {peer} failed: {e}"), false),
                    }
                }
                Action::Fail { peer, why } => self.st.mark_dead(peer, format!("connecting to rank {peer} failed: {why}"), false),
            }
        }
    }
}
