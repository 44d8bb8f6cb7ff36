//! Where things are in a segment: pure arithmetic, no I/O.
//!
//! Each process owns one segment file. It holds a control block and one
//! inbound ring per sender (itself included): the slots are receiver-owned,
//! as FM and verbs eager buffers are, and the sender writes into them.
//!
//! ```text
//! 0       control block: magic, version, rank, size, slots, slot_bytes, pid
//! 64      state (own cache line): running / finalized
//! 4096    ring from sender 0: [released counter: 128 B][slot 0][slot 1]...
//!         ring from sender 1: ...
//! ```
//! A slot: `[seq: u64][header: 32 B][payload...]`. The sender writes header and
//! payload, then `seq = message index + 1` with release ordering; the receiver
//! polls `seq` of the next slot. A small message, its header and its flag share
//! one cache line: one cache-line handoff per message.

use fmx_transport::HEADER_BYTES;

/// "FMXSHM01".
pub const MAGIC: u64 = u64::from_le_bytes(*b"FMXSHM01");
/// Layout version.
pub const VERSION: u32 = 1;
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
    /// Slots per ring.
    pub const SLOTS: usize = 20;
    /// Bytes per slot.
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

/// Bytes before the first slot of a ring: the receiver's release counter,
/// alone on two cache lines (adjacent-line prefetch).
pub const RING_HEAD_BYTES: usize = 128;
/// Bytes of the slot flag.
pub const SEQ_BYTES: usize = 8;
/// Payload offset inside a slot.
pub const PAYLOAD_OFFSET: usize = SEQ_BYTES + HEADER_BYTES;

/// The geometry of one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Processes in the job (= inbound rings).
    pub size: u32,
    /// Slots per inbound ring (= credits per sender).
    pub slots: u32,
    /// Bytes per slot, a multiple of 64.
    pub slot_bytes: usize,
}

impl Layout {
    /// A layout; `slot_bytes` is rounded up to a multiple of 64 and to at least one line.
    pub fn new(size: u32, slots: u32, slot_bytes: usize) -> Self {
        Self { size, slots: slots.max(1), slot_bytes: slot_bytes.max(64).next_multiple_of(64) }
    }

    /// Largest eager payload.
    pub fn max_payload(&self) -> usize {
        self.slot_bytes - PAYLOAD_OFFSET
    }

    /// Bytes of one inbound ring.
    pub fn ring_bytes(&self) -> usize {
        RING_HEAD_BYTES + self.slots as usize * self.slot_bytes
    }

    /// Offset of the ring that `sender` writes into.
    pub fn ring_offset(&self, sender: u32) -> usize {
        ctl::BYTES + sender as usize * self.ring_bytes()
    }

    /// Offset of slot `index % slots` of `sender`'s ring.
    pub fn slot_offset(&self, sender: u32, index: u64) -> usize {
        self.ring_offset(sender) + RING_HEAD_BYTES + (index % u64::from(self.slots)) as usize * self.slot_bytes
    }

    /// Total bytes of the segment.
    pub fn segment_bytes(&self) -> usize {
        ctl::BYTES + self.size as usize * self.ring_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_and_slots_tile_the_segment_without_overlap() {
        let l = Layout::new(5, 3, 100);
        assert_eq!(l.slot_bytes, 128);
        let mut spans = vec![(0, ctl::BYTES)];
        for s in 0..5 {
            spans.push((l.ring_offset(s), RING_HEAD_BYTES));
            for i in 0..3 {
                spans.push((l.slot_offset(s, i), l.slot_bytes));
                assert_eq!(l.slot_offset(s, i), l.slot_offset(s, i + 3), "index wraps onto the same slot");
            }
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert_eq!(w[0].0 + w[0].1, w[1].0, "contiguous, no overlap");
        }
        let last = spans.last().unwrap();
        assert_eq!(last.0 + last.1, l.segment_bytes());
        assert!(spans.iter().all(|(o, _)| o % 64 == 0), "every piece cache-line aligned");
        assert_eq!(l.max_payload(), 128 - 40);
    }
}
