//! The peers of an RDMA endpoint (verbs, libfabric). Each transport keeps its
//! own way to reach a peer (a queue pair, an address); what they keep alike is
//! here, once: FM's credits toward the peer, whether it lives, and the
//! mailbox word where it returns credits (written by its RDMA, read here).

use std::ops::{Deref, DerefMut};

use memmap2::MmapMut;

use crate::credit::{mailbox, Class, Gate, PeerCredits};
use crate::liveness::PeerLife;
use crate::{PeerId, PeerState, SendOutcome, TransportError};

/// What a transport's per-peer record shares with the others.
pub trait RdmaPeer {
    /// Credits toward the peer.
    fn credits(&mut self) -> &mut PeerCredits;
    /// Whether the peer lives.
    fn life(&self) -> &PeerLife;
    /// The same, to record what was learnt of it.
    fn life_mut(&mut self) -> &mut PeerLife;
}

/// A peer of an RDMA endpoint: what every device keeps of it, and the
/// device's own way to reach it (`link`: a queue pair, an address).
pub struct Peer<L> {
    /// FM's credits toward the peer.
    pub credits: PeerCredits,
    /// Whether it lives.
    pub life: PeerLife,
    /// Where our credit returns go: the address of our word in its mailbox.
    pub mailbox_addr: u64,
    /// The key of its mailbox (an rkey, a `fi_mr_key`).
    pub mailbox_key: u64,
    /// The device's part.
    pub link: L,
}

impl<L> RdmaPeer for Peer<L> {
    fn credits(&mut self) -> &mut PeerCredits {
        &mut self.credits
    }
    fn life(&self) -> &PeerLife {
        &self.life
    }
    fn life_mut(&mut self) -> &mut PeerLife {
        &mut self.life
    }
}

/// The peers of one endpoint, by index; `None` for ourselves. Derefs to the
/// vector, so that a transport reaches its own fields as before.
pub struct PeerList<P> {
    peers: Vec<Option<P>>,
}

impl<P> Deref for PeerList<P> {
    type Target = Vec<Option<P>>;
    fn deref(&self) -> &Self::Target {
        &self.peers
    }
}

impl<P> DerefMut for PeerList<P> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.peers
    }
}

impl<P: RdmaPeer> PeerList<P> {
    /// The list of `peers` (ourselves as `None`).
    pub fn new(peers: Vec<Option<P>>) -> Self {
        Self { peers }
    }

    /// The live peer `peer`: an error names it when it is gone or not in the job.
    pub fn alive(&mut self, peer: PeerId) -> Result<&mut P, TransportError> {
        let size = self.peers.len() as u32;
        match self.peers.get_mut(peer as usize) {
            Some(Some(p)) => match p.life().failure() {
                Some(reason) => Err(TransportError::PeerGone { peer, reason: reason.to_owned() }),
                None => Ok(p),
            },
            _ => Err(TransportError::NoSuchPeer { peer, size }),
        }
    }

    /// Takes the credits `peer` returned through its word of our `mailbox`.
    pub fn read_mailbox(&mut self, mailbox_words: &MmapMut, peer: PeerId) {
        if let Some((d, k, _)) = mailbox::decode(mailbox::load(mailbox_words, peer as usize)) {
            if let Some(Some(p)) = self.peers.get_mut(peer as usize) {
                p.credits().on_credit(d, k);
            }
        }
    }

    /// Whether a data message to `peer` may go now (FM's send rule), reading
    /// the credits it returned when ours are short.
    pub fn credit(&mut self, mailbox_words: &MmapMut, peer: PeerId) -> SendOutcome {
        let Ok(p) = self.alive(peer) else { return SendOutcome::Backpressure };
        if p.credits().peek(Class::Data) == Gate::Backpressure {
            self.read_mailbox(mailbox_words, peer);
        }
        match self.peers[peer as usize].as_mut().map(|p| p.credits().peek(Class::Data)) {
            Some(Gate::Go) => SendOutcome::Sent,
            Some(Gate::NotAllowed) => SendOutcome::NotAllowed,
            _ => SendOutcome::Backpressure,
        }
    }

    /// What is known of `peer` without asking it: finalized (its mailbox word
    /// says so), dead (not in the job, or its liveness says so), or `None`:
    /// alive as far as we know (the transport may probe it).
    pub fn departed(&self, mailbox_words: &MmapMut, peer: PeerId) -> Option<PeerState> {
        if mailbox::decode(mailbox::load(mailbox_words, peer as usize)).is_some_and(|(_, _, fin)| fin) {
            return Some(PeerState::Finalized);
        }
        match self.peers.get(peer as usize) {
            Some(Some(p)) if !p.life().is_dead() => None,
            _ => Some(PeerState::Dead),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::CreditConfig;

    type P = Peer<()>;

    fn list(cfg: &CreditConfig) -> PeerList<P> {
        let host = crate::liveness::host_identity();
        let peer = |lower| {
            let life = PeerLife::new(std::process::id(), &host, &host);
            Some(P { credits: PeerCredits::new(cfg, lower), life, mailbox_addr: 0, mailbox_key: 0, link: () })
        };
        PeerList::new(vec![None, peer(true), peer(false)])
    }

    #[test]
    fn a_dead_peer_is_named_and_a_finalized_one_is_told_by_its_mailbox() {
        let cfg = CreditConfig::for_pool(64, 3, 0, None).expect("a valid pool");
        let mut peers = list(&cfg);
        let mut words = MmapMut::map_anon(8 * 3).expect("an anonymous map");
        assert_eq!(peers.departed(&words, 1), None);
        assert!(matches!(peers.alive(5), Err(TransportError::NoSuchPeer { peer: 5, size: 3 })));
        peers[2].as_mut().expect("peer 2").life.mark_dead("killed".into(), false);
        assert!(matches!(peers.alive(2), Err(TransportError::PeerGone { peer: 2, .. })));
        assert_eq!(peers.departed(&words, 2), Some(PeerState::Dead));
        assert_eq!(peers.credit(&words, 2), SendOutcome::Backpressure);
        words[8..16].copy_from_slice(&mailbox::encode(0, 0, true).to_le_bytes());
        assert_eq!(peers.departed(&words, 1), Some(PeerState::Finalized));
    }

    #[test]
    fn credits_returned_through_the_mailbox_open_the_way() {
        let cfg = CreditConfig::for_pool(64, 3, 0, None).expect("a valid pool");
        let mut peers = list(&cfg);
        let words = MmapMut::map_anon(8 * 3).expect("an anonymous map");
        let p = peers.alive(1).expect("peer 1");
        while p.credits.try_take(Class::Data) == Gate::Go {}
        assert_eq!(peers.credit(&words, 1), SendOutcome::Backpressure);
        let mut words = words;
        // The peer released one slot: its cumulative total passes the newcomer grant we started with.
        words[8..16].copy_from_slice(&mailbox::encode(cfg.newcomer as u16 + 1, 0, false).to_le_bytes());
        assert_eq!(peers.credit(&words, 1), SendOutcome::Sent);
    }
}
