//! Large messages where cross-memory attach is refused: a pipelined copy
//! through the shared segments.
//!
//! `process_vm_readv` needs ptrace rights over the peer. Yama's
//! `ptrace_scope=1` allows them once the peer declares us its ptracer (every
//! process does, at setup: `PR_SET_PTRACER_ANY`, as Open MPI's vader does);
//! `ptrace_scope=2` without `CAP_SYS_PTRACE`, `=3`, or a seccomp filter
//! refuse them. Each process probes every peer once at connect (a one-byte
//! read of a word the peer named in its address), and toward a peer it
//! cannot attach to a read becomes:
//!
//! 1. GET(address, length, id) to the owner in a control slot;
//! 2. the owner, in its own polls, copies the range in slot-sized pieces
//!    into its data ring toward the reader (flow-controlled by the ordinary
//!    credits, so several pieces are in flight: the copy is pipelined);
//! 3. the reader copies each piece into its buffer as it arrives and reports
//!    the operation done once every byte is there (`poll_ops`).
//!
//! Two copies instead of one, through memory both processes already share.
//! The owner serves only ranges inside buffers it has exposed and not
//! revoked. A write (the split rendezvous) is never needed: without cross-
//! memory attach the endpoint does not offer splitting.

use std::collections::{HashMap, VecDeque};

use fmx_transport::{MsgHeader, MsgKind, PeerId, TransportError};

/// Subtypes of the transport's own messages (`MsgKind::Internal`, in `match_bits`).
pub(crate) const GET: u64 = 1;
pub(crate) const PIECE: u64 = 2;
/// The owner refuses a GET (the range is not exposed): the read fails.
pub(crate) const REFUSED: u64 = 3;

/// Bytes of a GET's payload: address, length, id.
pub(crate) const GET_BYTES: usize = 24;

/// The caller's buffer of a read (kept alive until `poll_ops` reports: see `Endpoint::read`).
pub(crate) struct Local(*mut u8);

// SAFETY: the pointer is only written through by the endpoint that holds it,
// which one thread drives at a time (an endpoint moves between threads whole);
// the buffer is the read's caller's, lent until the read is reported.
unsafe impl Send for Local {}

/// A read this process waits for.
pub(crate) struct Read {
    pub(crate) peer: PeerId,
    pub(crate) local: Local,
    pub(crate) len: usize,
    pub(crate) got: usize,
}

/// A range this process sends a peer, piece by piece.
pub(crate) struct Serve {
    pub(crate) peer: PeerId,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) id: u64,
    pub(crate) sent: usize,
}

/// The staged-copy state of one endpoint.
#[derive(Default)]
pub(crate) struct Staged {
    pub(crate) reads: HashMap<u64, Read>,
    pub(crate) done: Vec<(u64, Result<(), TransportError>)>,
    pub(crate) next_id: u64,
    /// GETs waiting for a control credit: (peer, payload).
    pub(crate) gets: VecDeque<(PeerId, [u8; GET_BYTES])>,
    pub(crate) serves: VecDeque<Serve>,
    /// Ranges exposed and not revoked: (address, length), one entry per exposure.
    pub(crate) exposed: Vec<(u64, u64)>,
    /// Refusals waiting for a control credit: (peer, id).
    pub(crate) refusals: VecDeque<(PeerId, u64)>,
}

impl Staged {
    /// Nothing to send and nothing awaited.
    pub(crate) fn is_idle(&self) -> bool {
        self.gets.is_empty() && self.refusals.is_empty() && self.serves.is_empty()
    }

    /// Starts a read of `len` bytes at `addr` in `peer` into `local`; its id.
    pub(crate) fn start_read(&mut self, peer: PeerId, addr: u64, local: *mut u8, len: usize) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.reads.insert(id, Read { peer, local: Local(local), len, got: 0 });
        let mut get = [0u8; GET_BYTES];
        for (i, v) in [addr, len as u64, id].into_iter().enumerate() {
            get[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.gets.push_back((peer, get));
        id
    }

    /// A message of the transport's own from `peer` (see the subtypes above).
    pub(crate) fn on_message(&mut self, peer: PeerId, h: &MsgHeader, payload: &[u8]) -> Result<(), TransportError> {
        match h.match_bits {
            GET => self.on_get(peer, payload),
            PIECE => self.on_piece(peer, h, payload),
            REFUSED => {
                self.on_refused(peer, h.cookie);
                Ok(())
            }
            _ => Err(TransportError::Malformed { peer, what: "an unknown shared-memory internal message" }),
        }
    }

    /// Whether `addr..addr+len` lies inside one exposed buffer.
    pub(crate) fn is_exposed(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len).is_some_and(|end| self.exposed.iter().any(|&(a, l)| a <= addr && end <= a + l))
    }

    /// A GET arrived from `peer`: serve it, or refuse a range we do not expose.
    pub(crate) fn on_get(&mut self, peer: PeerId, payload: &[u8]) -> Result<(), TransportError> {
        let field = |i: usize| payload.get(8 * i..8 * i + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let (Some(addr), Some(len), Some(id)) = (field(0), field(1), field(2)) else {
            return Err(TransportError::Malformed { peer, what: "a staged read request shorter than 24 bytes" });
        };
        if self.is_exposed(addr, len) {
            self.serves.push_back(Serve { peer, addr, len: len as usize, id, sent: 0 });
        } else {
            self.refusals.push_back((peer, id));
        }
        Ok(())
    }

    /// A piece of read `id` arrived at `offset`: copies it into the reader's buffer.
    pub(crate) fn on_piece(&mut self, peer: PeerId, h: &MsgHeader, payload: &[u8]) -> Result<(), TransportError> {
        let (id, offset) = (h.cookie, h.len as usize);
        let Some(r) = self.reads.get_mut(&id).filter(|r| r.peer == peer) else {
            return Ok(()); // a read abandoned meanwhile
        };
        let end = offset.checked_add(payload.len()).filter(|&e| e <= r.len);
        let Some(end) = end else {
            return Err(TransportError::Malformed { peer, what: "a staged piece outside its read" });
        };
        // SAFETY: `local..local+len` is the reader's buffer, which the caller of
        // `Endpoint::read` keeps alive and untouched until `poll_ops` reports this
        // id (or the endpoint is dropped, which drops `reads` first); the piece
        // lies inside it (checked) and comes from our own segment, another object.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), r.local.0.add(offset), payload.len()) };
        r.got += end - offset;
        if r.got >= r.len {
            self.reads.remove(&id);
            self.done.push((id, Ok(())));
        }
        Ok(())
    }

    /// The owner refused read `id`.
    pub(crate) fn on_refused(&mut self, peer: PeerId, id: u64) {
        if self.reads.remove(&id).is_some() {
            self.done.push((id, Err(TransportError::RemoteBounds { peer, offset: 0, len: 0, region: 0 })));
        }
    }

    /// Ends the exposure of `addr..addr+len` (one of them), and every serve in it.
    pub(crate) fn revoke(&mut self, addr: u64, len: u64) {
        if let Some(i) = self.exposed.iter().position(|&e| e == (addr, len)) {
            self.exposed.swap_remove(i);
        }
        let exposed = std::mem::take(&mut self.exposed);
        self.serves.retain(|s| exposed.iter().any(|&(a, l)| a <= s.addr && s.addr + s.len as u64 <= a + l));
        self.exposed = exposed;
    }

    /// Fails every read from `peer` (it is gone).
    pub(crate) fn fail_peer(&mut self, peer: PeerId, why: &str) {
        let ids: Vec<u64> = self.reads.iter().filter(|(_, r)| r.peer == peer).map(|(&id, _)| id).collect();
        for id in ids {
            self.reads.remove(&id);
            self.done.push((id, Err(TransportError::PeerGone { peer, reason: why.into() })));
        }
        self.serves.retain(|s| s.peer != peer);
    }
}

/// The header of a staged message of `subtype`.
pub(crate) fn header(subtype: u64, id: u64, offset: u64, payload: usize) -> MsgHeader {
    MsgHeader::control(MsgKind::Internal, subtype, offset, id, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_in_order_or_not_and_complete_the_read() {
        let mut s = Staged::default();
        let mut buf = vec![0u8; 10];
        let id = s.start_read(1, 0x1000, buf.as_mut_ptr(), buf.len());
        assert_eq!(s.gets.len(), 1);
        s.on_piece(1, &header(PIECE, id, 6, 4), &[7, 8, 9, 10]).unwrap();
        assert!(s.done.is_empty());
        assert!(s.on_piece(1, &header(PIECE, id, 8, 4), &[0; 4]).is_err(), "past the end");
        s.on_piece(2, &header(PIECE, id, 0, 6), &[9; 6]).unwrap();
        assert!(s.done.is_empty(), "another peer's piece is not ours");
        s.on_piece(1, &header(PIECE, id, 0, 6), &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(s.done.len(), 1);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    }

    #[test]
    fn only_exposed_ranges_are_served_and_revoke_stops_serving() {
        let mut s = Staged::default();
        s.exposed.push((100, 50));
        let get = |addr: u64, len: u64, id: u64| [addr, len, id].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
        s.on_get(3, &get(110, 40, 1)).unwrap();
        s.on_get(3, &get(110, 41, 2)).unwrap();
        s.on_get(3, &get(u64::MAX, 2, 3)).unwrap();
        assert_eq!(s.serves.len(), 1);
        assert_eq!(s.refusals.iter().map(|r| r.1).collect::<Vec<_>>(), [2, 3]);
        s.revoke(100, 50);
        assert!(s.serves.is_empty(), "a revoked buffer is no longer read");
        assert!(s.on_get(3, &[1, 2, 3]).is_err());
    }
}
