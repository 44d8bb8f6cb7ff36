//! Connections made on demand (`FMX_CONNECT=lazy`), alike on every RDMA
//! device: which peers this endpoint has exchanged a message with, and when.
//!
//! FM's send rule already says who may speak first: a process may send to a
//! smaller ID at once (its newcomer credits), but to a larger ID only after
//! that one has spoken. Eagerly, the join at init makes everyone speak to
//! everyone. Lazily, nothing happens at init; the first data message toward
//! a larger ID finds the rule closed ("connecting"), sends a
//! [`CONNECT_REQUEST`] in the control reserve, and the larger ID answers with
//! a [`CONNECT_ACCEPT`] that carries its grant. Toward a smaller ID the first
//! data message is itself the connection. A peer's credit slice is given at
//! its first contact (once the job's shape is known), not at init.
//!
//! Crossing connects need nothing special: a request only ever goes from the
//! smaller to the larger ID, so when both start at once the smaller one's
//! request and the larger one's first data message cross, each is taken as
//! first contact, and one connection results.

use std::time::Instant;

use crate::settings::ConnectMode;
use crate::{Connection, PeerId, TransportError};

/// The error when rank `peer` was started in the other mode than we (`lazy`):
/// every rank of a job must connect alike.
pub fn mode_mismatch(peer: PeerId, me: PeerId, lazy: bool) -> TransportError {
    let mode = |l: bool| if l { ConnectMode::Lazy.name() } else { ConnectMode::Eager.name() };
    TransportError::Setup {
        what: format!(
            "rank {peer} connects {} but rank {me} connects {}: set FMX_CONNECT alike for the whole job",
            mode(!lazy),
            mode(lazy)
        ),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    }
}

/// `match_bits` of the internal message a smaller ID sends to open the way.
pub const CONNECT_REQUEST: u64 = 0x636f_6e6e_0001;
/// `match_bits` of the answer from the larger ID (it carries the grant).
pub const CONNECT_ACCEPT: u64 = 0x636f_6e6e_0002;

/// The connection state of every peer of one endpoint.
#[derive(Debug)]
pub struct Connections {
    lazy: bool,
    /// When each peer's connection was made (`None`: not connected).
    made: Vec<Option<Instant>>,
    /// A connect request went to the peer.
    requested: Vec<bool>,
    /// Peers whose request waits for our answer (no control credit or device room yet).
    accepts_due: Vec<PeerId>,
}

impl Connections {
    /// No peer connected yet, in a job of `size`.
    pub fn new(size: u32, lazy: bool) -> Self {
        let n = size as usize;
        Self { lazy, made: vec![None; n], requested: vec![false; n], accepts_due: Vec::new() }
    }

    /// Whether connections are made on demand.
    pub fn lazy(&self) -> bool {
        self.lazy
    }

    /// Whether a connection to `peer` exists.
    pub fn is_made(&self, peer: PeerId) -> bool {
        self.made.get(peer as usize).is_some_and(Option::is_some)
    }

    /// Whether `peer` may be sent something outside a message (a credit
    /// word, a probe, a slice): always eagerly; lazily, once connected.
    pub fn reachable(&self, peer: PeerId) -> bool {
        !self.lazy || self.is_made(peer)
    }

    /// Eager mode: every listed peer is connected now.
    pub fn all_made_now(&mut self, peers: impl Iterator<Item = bool>) {
        let now = Instant::now();
        self.made = peers.map(|p| p.then_some(now)).collect();
    }

    /// The first message to or from `peer` (lazy mode): notes the
    /// connection; `true` when this call made it.
    pub fn touch(&mut self, peer: PeerId) -> bool {
        match self.made.get_mut(peer as usize) {
            Some(m @ None) if self.lazy => {
                *m = Some(Instant::now());
                true
            }
            _ => false,
        }
    }

    /// Whether a connect request toward `peer` should go now (lazy, not sent yet).
    pub fn wants_request(&self, peer: PeerId) -> bool {
        self.lazy && !self.requested.get(peer as usize).copied().unwrap_or(true)
    }

    /// The request toward `peer` went.
    pub fn requested(&mut self, peer: PeerId) {
        if let Some(r) = self.requested.get_mut(peer as usize) {
            *r = true;
        }
    }

    /// `peer`'s request arrived: our answer is due.
    pub fn accept_later(&mut self, peer: PeerId) {
        if !self.accepts_due.contains(&peer) {
            self.accepts_due.push(peer);
        }
    }

    /// The answers due now (the caller puts back those that could not go).
    pub fn take_accepts(&mut self) -> Vec<PeerId> {
        std::mem::take(&mut self.accepts_due)
    }

    /// Every connection, in rank order.
    pub fn list(&self) -> Vec<Connection> {
        self.made.iter().enumerate().filter_map(|(peer, m)| Some(Connection { peer: peer as PeerId, made_at: (*m)? })).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_connections_are_made_once_by_first_contact_and_requested_once() {
        let mut c = Connections::new(4, true);
        assert!(c.list().is_empty());
        assert!(c.wants_request(3));
        c.requested(3);
        assert!(!c.wants_request(3), "one request per peer");
        assert!(c.touch(3) && !c.touch(3), "the first contact makes it, the second does not");
        assert!(c.is_made(3) && !c.is_made(1));
        assert_eq!(c.list().iter().map(|x| x.peer).collect::<Vec<_>>(), vec![3]);
        c.accept_later(2);
        c.accept_later(2);
        assert_eq!(c.take_accepts(), vec![2]);
        assert!(c.take_accepts().is_empty());
        assert!(!c.wants_request(9), "not a peer");
    }

    #[test]
    fn eager_connections_come_from_init_alone() {
        let mut c = Connections::new(3, false);
        assert!(!c.touch(1) && !c.wants_request(2));
        c.all_made_now([true, false, true].into_iter());
        assert_eq!(c.list().iter().map(|x| x.peer).collect::<Vec<_>>(), vec![0, 2]);
    }
}
