//! Cursors over a slot [`Ring`]: one writer, one reader, no lock.
//!
//! The ring itself knows nothing of credits: the sender writes slot
//! `sent % slots` only while it holds a credit for it, which the receiver
//! returned after releasing that slot (see `fmx_transport::credit`).
//!
//! **Window switch.** A ring can shrink to its first `m` slots: the sender
//! switches only when the receiver has released every message it sent (`x`
//! of them), publishes `(x, m)` before writing message `x + 1`, and from then
//! on message index `i >= x` lives in slot `(i - x) % m`. The receiver reads
//! the switch word before each look at the next slot, so both sides place
//! every message alike; slots `m..` are never touched again.

use std::sync::atomic::Ordering;

use fmx_transport::{MsgHeader, HEADER_BYTES};

use crate::layout::{Ring, PAYLOAD_OFFSET, SEQ_BYTES};
use crate::segment::Segment;

/// The sending side, kept by the sender.
#[derive(Debug)]
pub struct TxRing {
    ring: Ring,
    sent: u64,
    switch: Option<(u64, u32)>,
}

/// Offset of message `index` in `ring`, given a window switch `(x, m)`.
#[inline]
fn slot_of(ring: &Ring, switch: Option<(u64, u32)>, index: u64) -> usize {
    match switch {
        Some((x, m)) if index >= x => ring.base + ((index - x) % u64::from(m)) as usize * ring.slot_bytes,
        _ => ring.slot(index),
    }
}

/// The switch word: `x` in the low 48 bits, `m` above (0: no switch).
pub fn switch_word(x: u64, m: u32) -> u64 {
    (x & ((1 << 48) - 1)) | (u64::from(m) << 48)
}

fn unpack_switch(w: u64) -> Option<(u64, u32)> {
    (w != 0).then(|| (w & ((1 << 48) - 1), (w >> 48) as u32))
}

impl TxRing {
    /// Writes into `ring` of the receiver's segment.
    pub fn new(ring: Ring) -> Self {
        Self { ring, sent: 0, switch: None }
    }

    /// From the next message on, use only the first `m` slots (the receiver
    /// has released everything sent so far). Returns the switch word to publish.
    pub fn switch_to(&mut self, m: u32) -> u64 {
        let m = m.clamp(1, self.ring.slots);
        self.switch = Some((self.sent, m));
        switch_word(self.sent, m)
    }

    /// Slots the sender may use now.
    pub fn window(&self) -> u32 {
        self.switch.map_or(self.ring.slots, |s| s.1)
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Largest payload.
    pub fn max_payload(&self) -> usize {
        self.ring.max_payload()
    }

    /// Copies `header` and `payload` into the next slot of the receiver's segment `rx`.
    /// The caller holds a credit for that slot.
    #[inline]
    pub fn write(&mut self, rx: &Segment, header: &MsgHeader, payload: &[u8]) {
        assert!(payload.len() <= self.ring.max_payload(), "payload of {} bytes in a slot of {}", payload.len(), self.ring.max_payload());
        let off = slot_of(&self.ring, self.switch, self.sent);
        assert!(off + self.ring.slot_bytes <= rx.len(), "slot outside the segment");
        let mut h = [0u8; HEADER_BYTES];
        header.encode(&mut h);
        // SAFETY: the slot lies inside the mapping (asserted) and belongs to the
        // sender now: the caller holds a credit, which the receiver returned only
        // after releasing this slot, and the receiver reads it again only after the
        // release-store of `seq` below. The payload fits (asserted). Source and
        // destination are different objects, so they do not overlap.
        unsafe {
            let slot = rx.base().add(off);
            std::ptr::copy_nonoverlapping(h.as_ptr(), slot.add(SEQ_BYTES), HEADER_BYTES);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), slot.add(PAYLOAD_OFFSET), payload.len());
        }
        self.sent += 1;
        rx.u64_at(off).store(self.sent, Ordering::Release);
    }
}

/// The receiving side, kept by the receiver.
#[derive(Debug)]
pub struct RxRing {
    ring: Ring,
    /// The next message to read.
    next: u64,
    /// Messages released (read and given back): `next - done` are held.
    done: u64,
    switch: Option<(u64, u32)>,
    /// Where message `next` lies: found once per message, not per look.
    next_off: usize,
    /// Where the held messages lie, oldest first, and whether each was
    /// released already (a slot is given back only once every older one is:
    /// the sender reuses slots in ring order).
    held: std::collections::VecDeque<(usize, bool)>,
}

/// A message still in its slot.
pub struct Slot<'a> {
    /// The decoded header (or why it did not decode).
    pub header: Result<MsgHeader, fmx_transport::header::HeaderError>,
    /// The payload bytes in the slot.
    pub payload: &'a [u8],
    /// Where the slot lies in the segment (for [`held_payload`]).
    pub offset: usize,
}

impl RxRing {
    /// Reads `ring` of our own segment.
    pub fn new(ring: Ring) -> Self {
        Self { ring, next: 0, done: 0, switch: None, next_off: slot_of(&ring, None, 0), held: std::collections::VecDeque::new() }
    }

    /// Applies the sender's switch word; returns the new window `m` when it
    /// changed (the caller may then give slots `m..` back to the system).
    pub fn follow(&mut self, word: u64) -> Option<u32> {
        let s = unpack_switch(word)?;
        if Some(s) == self.switch {
            return None;
        }
        self.switch = Some(s);
        self.next_off = slot_of(&self.ring, self.switch, self.next);
        Some(s.1)
    }

    /// The ring this reader reads.
    pub fn ring(&self) -> Ring {
        self.ring
    }

    /// Messages released so far.
    pub fn released(&self) -> u64 {
        self.done
    }

    /// The next message, if the sender has published it.
    #[inline]
    pub fn peek<'a>(&'a self, own: &'a Segment) -> Option<Slot<'a>> {
        let off = self.next_off;
        if own.u64_at(off).load(Ordering::Acquire) != self.next + 1 {
            return None;
        }
        assert!(off + self.ring.slot_bytes <= own.len(), "slot outside the segment");
        // SAFETY: the acquire-load of `seq` saw the sender's release-store, so the
        // header and payload it wrote before are visible; the sender writes this
        // slot again only after we release it and return the credit, and the borrow
        // returned here ends before `release` (which takes `&mut self`). Bounds:
        // the slot lies in the mapping (asserted).
        let header_bytes = unsafe { std::slice::from_raw_parts(own.base().add(off + SEQ_BYTES), HEADER_BYTES) };
        let header = MsgHeader::decode(header_bytes);
        let len = match &header {
            Ok(h) => (h.payload_len as usize).min(self.ring.max_payload()),
            Err(_) => 0,
        };
        // SAFETY: as above; `len` is clamped to the slot's payload capacity.
        let payload = unsafe { std::slice::from_raw_parts(own.base().add(off + PAYLOAD_OFFSET), len) };
        Some(Slot { header, payload, offset: off })
    }

    /// Moves past the current slot, which stays ours (held) until [`RxRing::release`].
    #[inline]
    pub fn advance(&mut self) {
        self.held.push_back((self.next_off, false));
        self.next += 1;
        self.next_off = slot_of(&self.ring, self.switch, self.next);
    }

    /// Whether the slot at `offset` holds a message read and not yet released.
    pub fn holds(&self, offset: usize) -> bool {
        self.held.contains(&(offset, false))
    }

    /// Releases the held slot at `offset`. Returns how many slots are free
    /// again now, in ring order (0 while an older one is still held; the
    /// caller returns that many credits), or `None` when `offset` held nothing.
    #[inline]
    pub fn release(&mut self, offset: usize) -> Option<u32> {
        let entry = self.held.iter_mut().find(|(o, released)| *o == offset && !*released)?;
        entry.1 = true;
        let mut freed = 0;
        while self.held.front().is_some_and(|&(_, released)| released) {
            self.held.pop_front();
            self.done += 1;
            freed += 1;
        }
        Some(freed)
    }
}

/// The payload of a held slot at `offset` of our segment (as [`RxRing::peek`] saw it).
pub fn held_payload<'a>(own: &'a Segment, ring: &Ring, offset: usize, len: usize) -> &'a [u8] {
    let len = len.min(ring.max_payload());
    assert!(offset + PAYLOAD_OFFSET + len <= own.len(), "slot outside the segment");
    // SAFETY: the slot was published (peek's acquire-load saw its sequence
    // word) and is held: the sender writes it again only after its release
    // returns the credit, which takes `&mut` of the endpoint this borrow
    // comes from. Bounds: asserted above.
    unsafe { std::slice::from_raw_parts(own.base().add(offset + PAYLOAD_OFFSET), len) }
}
