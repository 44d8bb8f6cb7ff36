//! A world of one process: messages to self, through an in-process queue.
//!
//! Used when no launcher started the process (a lone process is a world of
//! one) and by unit tests of the core. Every message is eager (copied into
//! the queue), so no one-sided operation is ever needed.

use crate::own::OwnQueue;
use crate::{Arrival, Endpoint, MsgHeader, OpStatus, PeerId, PeerState, RemoteKey, SendOutcome, TransportError};

/// The endpoint of a one-process job.
#[derive(Debug)]
pub struct Loopback {
    queue: OwnQueue,
    finalized: bool,
}

impl Default for Loopback {
    fn default() -> Self {
        Self { queue: OwnQueue::bounded(usize::MAX), finalized: false }
    }
}

impl Loopback {
    /// A fresh endpoint.
    pub fn new() -> Self {
        Self::default()
    }

    fn check(peer: PeerId) -> Result<(), TransportError> {
        if peer == 0 {
            Ok(())
        } else {
            Err(TransportError::NoSuchPeer { peer, size: 1 })
        }
    }

    fn no_one_sided() -> TransportError {
        TransportError::Unsupported("one-sided operations on the loopback endpoint (every message is eager)".into())
    }
}

impl Endpoint for Loopback {
    fn local_id(&self) -> PeerId {
        0
    }

    fn num_peers(&self) -> u32 {
        1
    }

    fn max_eager(&self) -> usize {
        usize::MAX
    }

    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        Self::check(peer)?;
        let mut h = *header;
        h.payload_len = payload.len() as u32;
        Ok(self.queue.push(&h, payload))
    }

    fn credit(&mut self, _peer: PeerId) -> SendOutcome {
        SendOutcome::Sent
    }

    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        Ok(self.queue.take(0, max, out))
    }

    fn payload(&self, arrival: &Arrival) -> &[u8] {
        self.queue.payload(arrival.slot)
    }

    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError> {
        if self.queue.release(arrival.slot) {
            return Ok(());
        }
        Err(TransportError::Unsupported("releasing a message this endpoint does not hold (release each arrival once)".into()))
    }

    unsafe fn expose(&mut self, _buf: &[u8]) -> Result<RemoteKey, TransportError> {
        Err(Self::no_one_sided())
    }

    unsafe fn expose_mut(&mut self, _buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        Err(Self::no_one_sided())
    }

    fn revoke(&mut self, _key: &RemoteKey) {}

    unsafe fn read(&mut self, _peer: PeerId, _remote: &RemoteKey, _local: &mut [u8]) -> Result<OpStatus, TransportError> {
        Err(Self::no_one_sided())
    }

    unsafe fn write(&mut self, _peer: PeerId, _local: &[u8], _remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        Err(Self::no_one_sided())
    }

    fn poll_ops<F>(&mut self, _done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        Ok(0)
    }

    fn peer_state(&mut self, _peer: PeerId) -> PeerState {
        if self.finalized {
            PeerState::Finalized
        } else {
            PeerState::Alive
        }
    }

    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    fn receive_memory(&self) -> crate::ReceiveMemory {
        crate::ReceiveMemory::default()
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        self.finalized = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_messages_in_order() {
        let mut ep = Loopback::new();
        for i in 0..3u8 {
            assert_eq!(ep.try_send(0, &MsgHeader::eager(u64::from(i), 1, 0), &[i]).unwrap(), SendOutcome::Sent);
        }
        assert!(matches!(ep.try_send(1, &MsgHeader::eager(0, 0, 0), &[]), Err(TransportError::NoSuchPeer { peer: 1, size: 1 })));
        let mut got = Vec::new();
        assert_eq!(ep.poll(8, |p, h, d| got.push((p, h.match_bits, d.to_vec()))).unwrap(), 3);
        assert_eq!(got, vec![(0, 0, vec![0]), (0, 1, vec![1]), (0, 2, vec![2])]);
    }
}
