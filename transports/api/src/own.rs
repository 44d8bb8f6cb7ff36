//! Messages a process sends to itself, on transports whose slots are all
//! toward peers (verbs, libfabric): a small bounded queue, so a self-send
//! meets backpressure like any other send instead of growing without limit.

use std::collections::VecDeque;

use crate::{MsgHeader, PeerId, SendOutcome};

/// Messages a process may have queued to itself.
pub const OWN_SLOTS: usize = 4;

/// The queue of messages to ourselves.
#[derive(Debug, Default)]
pub struct OwnQueue {
    queue: VecDeque<(MsgHeader, Vec<u8>)>,
}

impl OwnQueue {
    /// Queues a copy of the message, or answers backpressure when full.
    pub fn push(&mut self, header: &MsgHeader, payload: &[u8]) -> SendOutcome {
        if self.queue.len() >= OWN_SLOTS {
            return SendOutcome::Backpressure;
        }
        self.queue.push_back((*header, payload.to_vec()));
        SendOutcome::Sent
    }

    /// Whether a push would go in now.
    pub fn credit(&self) -> SendOutcome {
        if self.queue.len() < OWN_SLOTS {
            SendOutcome::Sent
        } else {
            SendOutcome::Backpressure
        }
    }

    /// Hands up to `max` queued messages to `sink` as from `me`; returns how many.
    pub fn drain<F>(&mut self, me: PeerId, max: usize, sink: &mut F) -> usize
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]),
    {
        let mut n = 0;
        while n < max {
            let Some((h, data)) = self.queue.pop_front() else { break };
            sink(me, &h, &data);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_in_order() {
        let mut q = OwnQueue::default();
        for i in 0..OWN_SLOTS as u64 {
            assert_eq!(q.push(&MsgHeader::eager(i, 1, 0), &[i as u8]), SendOutcome::Sent);
        }
        assert_eq!(q.push(&MsgHeader::eager(9, 0, 0), &[]), SendOutcome::Backpressure);
        assert_eq!(q.credit(), SendOutcome::Backpressure);
        let mut got = Vec::new();
        assert_eq!(q.drain(3, 2, &mut |p, h, d| got.push((p, h.match_bits, d.to_vec()))), 2);
        assert_eq!(got, vec![(3, 0, vec![0]), (3, 1, vec![1])]);
        assert_eq!(q.credit(), SendOutcome::Sent);
    }
}
