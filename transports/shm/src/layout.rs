//! Where things are in a segment: pure arithmetic, no I/O.
//!
//! Each process owns one segment file: a control block, a small ring for
//! messages to itself, its eager pool, and its control reserve. The slots are
//! receiver-owned, as FM's and verbs' eager buffers are; senders write into
//! them, within the credits the receiver granted (see `fmx_transport::credit`).
//!
//! ```text
//! 0         control block: magic, version, rank, size, pool, slot_bytes, pid; state (own line)
//! 4096      own ring: OWN_SLOTS slots
//!           eager pool: `pool` slots; peer k (the k-th other rank) owns slots [k·S, (k+1)·S),
//!           S = pool / (size − 1); the remainder is never used
//!           control reserve: CTRL_SLOTS slots of CTRL_SLOT_BYTES per sender
//!           credit mailboxes: one cache line per sender, written by the sender:
//!             [0] cumulative credit totals, [8] window switch (see `ring`)
//!           grant lines: one cache line per sender, written by the owner:
//!             [0] the sender's share of the pool (slots; 0 = the whole slice),
//!             [8] messages of the sender released so far
//! ```
//! A slot: `[seq: u64][header: 32 B][payload...]`. The sender writes header and
//! payload, then `seq = message index + 1` with release ordering; the receiver
//! polls `seq` of the next slot. A small message, its header and its flag share
//! one cache line: one cache-line handoff per message.

use fmx_transport::HEADER_BYTES;

/// "FMXSHM03".
pub const MAGIC: u64 = u64::from_le_bytes(*b"FMXSHM03");
/// Layout version.
pub const VERSION: u32 = 3;
/// Offsets in the control block.
pub mod ctl {
    /// Magic word.
    pub const MAGIC: usize = 0;
    /// Layout version.
    pub const VERSION: usize = 8;
    /// Owner's rank.
    pub const RANK: usize = 12;
    /// Job size.
    pub const SIZE: usize = 16;
    /// Eager pool slots.
    pub const POOL: usize = 20;
    /// Bytes per eager slot.
    pub const SLOT_BYTES: usize = 24;
    /// Owner's pid.
    pub const PID: usize = 32;
    /// Owner's state word (own cache line).
    pub const STATE: usize = 64;
    /// Bytes of the control block.
    pub const BYTES: usize = 4096;
}

/// Owner states in the control block.
pub mod state {
    /// Connecting or running.
    pub const RUNNING: u32 = 1;
    /// Called finalize.
    pub const FINALIZED: u32 = 2;
}

/// Slots of the ring for messages to ourselves.
pub const OWN_SLOTS: u32 = 4;
/// Control slots per sender (`R` of the credit scheme).
pub const CTRL_SLOTS: u32 = 2;
/// Bytes per control slot: header plus a remote key, with room to spare.
pub const CTRL_SLOT_BYTES: usize = 128;
/// Bytes of one credit mailbox (a line each, so senders never share one).
pub const MAILBOX_BYTES: usize = 64;
/// Offset of the window-switch word in a mailbox.
pub const SWITCH_WORD: usize = 8;
/// Bytes of one grant line.
pub const GRANT_BYTES: usize = 64;
/// Offset of the released-count word in a grant line.
pub const RELEASED_WORD: usize = 8;
/// Bytes of the slot flag.
pub const SEQ_BYTES: usize = 8;
/// Payload offset inside a slot.
pub const PAYLOAD_OFFSET: usize = SEQ_BYTES + HEADER_BYTES;

/// A run of equal slots inside a segment, used as a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    /// Offset of the first slot.
    pub base: usize,
    /// Slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: usize,
}

impl Ring {
    /// Offset of slot `index % slots`.
    #[inline]
    pub fn slot(&self, index: u64) -> usize {
        self.base + (index % u64::from(self.slots)) as usize * self.slot_bytes
    }

    /// Largest payload of a slot.
    pub fn max_payload(&self) -> usize {
        self.slot_bytes - PAYLOAD_OFFSET
    }

    /// Bytes of the ring.
    pub fn bytes(&self) -> usize {
        self.slots as usize * self.slot_bytes
    }
}

/// The geometry of one segment (the same for every process of a job).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Processes in the job.
    pub size: u32,
    /// Eager pool slots (`P`).
    pub pool: u32,
    /// Bytes per eager slot, a multiple of 64.
    pub slot_bytes: usize,
}

impl Layout {
    /// A layout; `slot_bytes` is rounded up to a multiple of 64 (at least 128).
    pub fn new(size: u32, pool: u32, slot_bytes: usize) -> Self {
        Self { size, pool, slot_bytes: slot_bytes.max(128).next_multiple_of(64) }
    }

    /// Other processes.
    pub fn peers(&self) -> u32 {
        self.size.saturating_sub(1).max(1)
    }

    /// `S`: eager slots per peer.
    pub fn slice(&self) -> u32 {
        self.pool / self.peers()
    }

    /// Largest eager payload.
    pub fn max_payload(&self) -> usize {
        self.slot_bytes - PAYLOAD_OFFSET
    }

    fn own_base(&self) -> usize {
        ctl::BYTES
    }

    fn pool_base(&self) -> usize {
        self.own_base() + OWN_SLOTS as usize * self.slot_bytes
    }

    fn ctrl_base(&self) -> usize {
        self.pool_base() + self.pool as usize * self.slot_bytes
    }

    /// The ring for messages the owner sends itself.
    pub fn own_ring(&self) -> Ring {
        Ring { base: self.own_base(), slots: OWN_SLOTS, slot_bytes: self.slot_bytes }
    }

    /// The eager slice that `sender` writes in `owner`'s segment.
    pub fn data_ring(&self, owner: u32, sender: u32) -> Ring {
        debug_assert_ne!(owner, sender);
        let k = if sender < owner { sender } else { sender - 1 };
        Ring { base: self.pool_base() + (k * self.slice()) as usize * self.slot_bytes, slots: self.slice(), slot_bytes: self.slot_bytes }
    }

    /// The control reserve that `sender` writes in any owner's segment.
    pub fn ctrl_ring(&self, sender: u32) -> Ring {
        Ring { base: self.ctrl_base() + (sender * CTRL_SLOTS) as usize * CTRL_SLOT_BYTES, slots: CTRL_SLOTS, slot_bytes: CTRL_SLOT_BYTES }
    }

    fn mailbox_base(&self) -> usize {
        self.ctrl_base() + self.ctrl_bytes()
    }

    /// The credit mailbox that `sender` writes in any owner's segment.
    pub fn mailbox(&self, sender: u32) -> usize {
        self.mailbox_base() + sender as usize * MAILBOX_BYTES
    }

    fn grant_base(&self) -> usize {
        self.mailbox_base() + self.size as usize * MAILBOX_BYTES
    }

    /// The grant line the owner keeps for `sender`.
    pub fn grant(&self, sender: u32) -> usize {
        self.grant_base() + sender as usize * GRANT_BYTES
    }

    /// Bytes of the eager pool (`P × slot`), whatever the number of peers.
    pub fn pool_bytes(&self) -> usize {
        self.pool as usize * self.slot_bytes
    }

    /// Bytes of the control reserve.
    pub fn ctrl_bytes(&self) -> usize {
        (self.size * CTRL_SLOTS) as usize * CTRL_SLOT_BYTES
    }

    /// Total bytes of the segment.
    pub fn segment_bytes(&self) -> usize {
        self.grant_base() + self.size as usize * GRANT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_tile_the_segment_without_overlap() {
        for size in [2u32, 3, 5, 8] {
            let l = Layout::new(size, 21, 100);
            assert_eq!(l.slot_bytes, 128);
            let owner = 1;
            let mut spans = vec![(0, ctl::BYTES), (l.own_ring().base, l.own_ring().bytes())];
            for s in (0..size).filter(|&s| s != owner) {
                let r = l.data_ring(owner, s);
                assert_eq!(r.slots, 21 / (size - 1));
                assert_eq!(r.slot(0), r.slot(u64::from(r.slots)), "index wraps onto the same slot");
                spans.push((r.base, r.bytes()));
            }
            let used: usize = spans[2..].iter().map(|s| s.1).sum();
            assert!(used <= l.pool_bytes(), "slices fit the pool");
            let gap = l.pool_bytes() - used;
            spans.push((l.ctrl_ring(0).base - gap, gap)); // the unused remainder
            for s in 0..size {
                spans.push((l.ctrl_ring(s).base, l.ctrl_ring(s).bytes()));
                spans.push((l.mailbox(s), MAILBOX_BYTES));
                spans.push((l.grant(s), GRANT_BYTES));
            }
            spans.retain(|s| s.1 > 0);
            spans.sort_unstable();
            for w in spans.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0, "contiguous, no overlap (size {size})");
            }
            let last = spans.last().unwrap();
            assert_eq!(last.0 + last.1, l.segment_bytes());
            assert!(spans.iter().all(|(o, _)| o % 64 == 0), "every piece cache-line aligned");
            assert_eq!(l.pool_bytes(), 21 * 128, "the pool does not grow with the job");
        }
        assert_eq!(Layout::new(2, 4, 100).max_payload(), 128 - 40);
    }
}
