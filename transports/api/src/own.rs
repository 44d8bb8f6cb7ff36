//! Messages a process sends to itself, on transports whose slots are all
//! toward peers (verbs, libfabric): a small bounded queue, so a self-send
//! meets backpressure like any other send instead of growing without limit.
//! Messages are handed out as [`Arrival`]s and stay queued (counting against
//! the bound) until released, like a slot.

use std::collections::VecDeque;

use crate::{Arrival, MsgHeader, PeerId, SendOutcome};

/// Messages a process may have queued to itself.
pub const OWN_SLOTS: usize = 4;

/// The slot bit of an [`Arrival`] that came from the queue of messages to ourselves.
pub const OWN_SLOT: u64 = 1 << 63;

/// The queue of messages to ourselves.
#[derive(Debug)]
pub struct OwnQueue {
    /// Messages, and whether each was released (handed ones only).
    queue: VecDeque<(MsgHeader, Vec<u8>, bool)>,
    /// The most messages queued at once.
    bound: usize,
    /// Messages at the front handed out and not yet released.
    handed: usize,
    /// The sequence number of the front message.
    front: u64,
}

impl Default for OwnQueue {
    fn default() -> Self {
        Self::bounded(OWN_SLOTS)
    }
}

impl OwnQueue {
    /// A queue of at most `bound` messages.
    pub fn bounded(bound: usize) -> Self {
        Self { queue: VecDeque::new(), bound, handed: 0, front: 0 }
    }

    /// Queues a copy of the message, or answers backpressure when full.
    pub fn push(&mut self, header: &MsgHeader, payload: &[u8]) -> SendOutcome {
        if self.queue.len() >= self.bound {
            return SendOutcome::Backpressure;
        }
        self.queue.push_back((*header, payload.to_vec(), false));
        SendOutcome::Sent
    }

    /// Whether a push would go in now.
    pub fn credit(&self) -> SendOutcome {
        if self.queue.len() < self.bound {
            SendOutcome::Sent
        } else {
            SendOutcome::Backpressure
        }
    }

    /// Hands up to `max` queued messages not yet handed to `out`, as from `me`; returns how many.
    pub fn take(&mut self, me: PeerId, max: usize, out: &mut Vec<Arrival>) -> usize {
        let n = max.min(self.queue.len() - self.handed);
        for i in self.handed..self.handed + n {
            let (header, data, _) = &self.queue[i];
            out.push(Arrival { peer: me, header: *header, slot: OWN_SLOT | (self.front + i as u64), len: data.len() });
        }
        self.handed += n;
        n
    }

    /// The handed, unreleased message of `slot`.
    fn held(&self, slot: u64) -> Option<usize> {
        let i = (slot & !OWN_SLOT).wrapping_sub(self.front) as usize;
        (i < self.handed && !self.queue[i].2).then_some(i)
    }

    /// The payload of a message [`OwnQueue::take`] handed out (empty once released).
    pub fn payload(&self, slot: u64) -> &[u8] {
        self.held(slot).map_or(&[], |i| &self.queue[i].1)
    }

    /// Releases a handed message; its place in the queue frees once the
    /// older ones are released too. False when `slot` held nothing.
    pub fn release(&mut self, slot: u64) -> bool {
        let Some(i) = self.held(slot) else { return false };
        self.queue[i].2 = true;
        while self.handed > 0 && self.queue.front().is_some_and(|m| m.2) {
            self.queue.pop_front();
            self.handed -= 1;
            self.front += 1;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_in_order_and_held_until_released() {
        let mut q = OwnQueue::default();
        for i in 0..OWN_SLOTS as u64 {
            assert_eq!(q.push(&MsgHeader::eager(i, 1, 0), &[i as u8]), SendOutcome::Sent);
        }
        assert_eq!(q.push(&MsgHeader::eager(9, 0, 0), &[]), SendOutcome::Backpressure);
        let mut got = Vec::new();
        assert_eq!(q.take(3, 2, &mut got), 2);
        let seen: Vec<(PeerId, u64, Vec<u8>)> = got.iter().map(|a| (a.peer, a.header.match_bits, q.payload(a.slot).to_vec())).collect();
        assert_eq!(seen, vec![(3, 0, vec![0]), (3, 1, vec![1])]);
        assert_eq!(q.credit(), SendOutcome::Backpressure, "a handed message holds its place until released");
        let (first, second) = (got[0].slot, got[1].slot);
        assert!(q.release(second), "any order");
        assert_eq!(q.credit(), SendOutcome::Backpressure, "the older one still holds its place");
        assert!(!q.release(second), "once");
        assert!(q.release(first));
        got.clear();
        assert_eq!(q.credit(), SendOutcome::Sent);
        assert_eq!(q.take(3, 8, &mut got), 2, "the rest, once");
        assert_eq!(q.take(3, 8, &mut got), 0);
        assert_eq!(q.payload(got[1].slot), &[3]);
    }
}
