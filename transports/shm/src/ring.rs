//! The single-producer/single-consumer slot ring between one sender and one receiver.
//!
//! Credits are slots: the sender may have at most `slots` messages that the
//! receiver has not released. It counts what it sent; the receiver publishes
//! how many it released in the ring's head line, which the sender reads only
//! when its cached window is used up (so that line rarely moves between cores).
//! No lock: one writer per word.

use std::sync::atomic::Ordering;

use fmx_transport::{MsgHeader, HEADER_BYTES};

use crate::layout::{PAYLOAD_OFFSET, SEQ_BYTES};
use crate::segment::Segment;

/// The sending side, kept by the sender.
#[derive(Debug)]
pub struct TxRing {
    sender: u32,
    sent: u64,
    limit: u64,
}

impl TxRing {
    /// The ring `sender` writes into (in the receiver's segment).
    pub fn new(sender: u32, slots: u32) -> Self {
        Self { sender, sent: 0, limit: u64::from(slots) }
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Copies `header` and `payload` into the next slot of the receiver's segment `rx`;
    /// `false` (nothing written) when every slot is still unreleased.
    #[inline]
    pub fn try_send(&mut self, rx: &Segment, header: &MsgHeader, payload: &[u8]) -> bool {
        let layout = rx.layout();
        debug_assert!(payload.len() <= layout.max_payload());
        if self.sent >= self.limit {
            let released = rx.u64_at(layout.ring_offset(self.sender)).load(Ordering::Acquire);
            self.limit = released + u64::from(layout.slots);
            if self.sent >= self.limit {
                return false;
            }
        }
        let off = layout.slot_offset(self.sender, self.sent);
        let mut h = [0u8; HEADER_BYTES];
        header.encode(&mut h);
        // SAFETY: the slot lies inside the mapping (layout arithmetic, checked by its
        // tests) and belongs to the sender now: the receiver released it (sent < limit
        // = released + slots) and reads it again only after the release-store of `seq`
        // below. The payload fits (max_payload, asserted above in debug; the endpoint
        // checks it). Source and destination are different objects, so no overlap.
        unsafe {
            let slot = rx.base().add(off);
            std::ptr::copy_nonoverlapping(h.as_ptr(), slot.add(SEQ_BYTES), HEADER_BYTES);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), slot.add(PAYLOAD_OFFSET), payload.len());
        }
        self.sent += 1;
        rx.u64_at(off).store(self.sent, Ordering::Release);
        true
    }
}

/// The receiving side, kept by the receiver.
#[derive(Debug)]
pub struct RxRing {
    sender: u32,
    next: u64,
}

/// A message still in its slot.
pub struct Slot<'a> {
    /// The decoded header (or why it did not decode).
    pub header: Result<MsgHeader, fmx_transport::header::HeaderError>,
    /// The payload bytes in the slot.
    pub payload: &'a [u8],
}

impl RxRing {
    /// The ring `sender` writes into (in our own segment).
    pub fn new(sender: u32) -> Self {
        Self { sender, next: 0 }
    }

    /// Messages released so far.
    pub fn released(&self) -> u64 {
        self.next
    }

    /// The next message, if the sender has published it.
    #[inline]
    pub fn peek<'a>(&'a self, own: &'a Segment) -> Option<Slot<'a>> {
        let layout = own.layout();
        let off = layout.slot_offset(self.sender, self.next);
        if own.u64_at(off).load(Ordering::Acquire) != self.next + 1 {
            return None;
        }
        // SAFETY: the acquire-load of `seq` saw the sender's release-store, so the
        // header and payload it wrote before are visible; the sender will not touch
        // this slot again until we publish its release (`release` below), and the
        // returned borrow ends before that (it borrows `self` immutably, `release`
        // takes `&mut self`). Bounds: header lies in the slot by layout.
        let header_bytes = unsafe { std::slice::from_raw_parts(own.base().add(off + SEQ_BYTES), HEADER_BYTES) };
        let header = MsgHeader::decode(header_bytes);
        let len = match &header {
            Ok(h) => (h.payload_len as usize).min(layout.max_payload()),
            Err(_) => 0,
        };
        // SAFETY: as above; `len` is clamped to the slot's payload capacity.
        let payload = unsafe { std::slice::from_raw_parts(own.base().add(off + PAYLOAD_OFFSET), len) };
        Some(Slot { header, payload })
    }

    /// Gives the current slot back to the sender (returns its credit).
    #[inline]
    pub fn release(&mut self, own: &Segment) {
        self.next += 1;
        own.u64_at(own.layout().ring_offset(self.sender)).store(self.next, Ordering::Release);
    }
}
