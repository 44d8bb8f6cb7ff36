//! Providers without FI_RMA (or `FMX_OFI_RMA=0`): one-sided operations and
//! credit returns carried by tagged messages.
//!
//! - A credit return is a control message carrying the mailbox word; the
//!   receiver stores it into its own mailbox, where the RMA path would have
//!   written it, so the credit logic is the same on both paths.
//! - A read sends GET(range, id) to the owner and posts a tagged receive into
//!   the reader's buffer; the owner sends that range with the tag.
//! - A write sends PUT(range, id) and then the data with the tag; the owner
//!   posts the receive into the exposed buffer when the PUT arrives, and
//!   revoking the buffer waits until every such receive has completed.
//!
//! Receives are not directed (the sender's rank is in the tag): providers
//! without FI_DIRECTED_RECV may not honour a source address.
//!
//! Control messages go with `fi_tinject` (no buffer to keep) into a small pool
//! of receives posted from any source; more arriving at once wait in the
//! provider's unexpected queue, bounded by the operations in flight.

use std::ffi::c_void;
use std::ptr;
use std::time::{Duration, Instant};

use fmx_transport::{PeerId, RemoteKey, TransportError};

use super::{posted, OfiEndpoint, Piece, Posted, Tx, RANK_BITS};
use crate::fabric::Mr;

/// Control messages: tag bit 63 and the sender's rank.
pub(super) const CTRL: u64 = 1 << 63;
/// Data of an emulated read or write: bit 62, bit 61 for writes, the
/// sender's rank in bits 40..61 and an id in bits 0..40.
const DATA: u64 = 1 << 62;
const PUT: u64 = 1 << 61;
const ID_BITS: u64 = (1 << 40) - 1;
/// Bytes of a control message and of a control receive buffer.
pub(super) const CTRL_BYTES: usize = 48;

const CREDIT: u8 = 1;
const GET: u8 = 2;
const PUT_REQ: u8 = 3;
const NACK: u8 = 4;

/// A serve or a sink the provider had no room for yet (retried by `retry_emulated`).
pub(super) enum Deferred {
    /// Send `len` bytes at `ptr` to `peer` for its read `id`.
    Serve { peer: PeerId, ptr: u64, len: usize, desc: usize, id: u64 },
    /// Post a receive at `ptr` for `peer`'s write `id` into exposure `key`.
    Sink { peer: PeerId, key: u64, ptr: u64, len: usize, desc: usize, id: u64 },
}

/// A buffer exposed without RMA: served by us on request.
pub(super) struct Exposure {
    base: u64,
    len: usize,
    writable: bool,
    desc: *mut c_void,
    _mr: Option<Mr>,
    /// Receives posted into it for PUTs, not yet completed.
    sinks: u32,
}

fn data_tag(put: bool, sender: PeerId, id: u64) -> u64 {
    DATA | if put { PUT } else { 0 } | (u64::from(sender) << 40) | (id & ID_BITS)
}

fn encode(kind: u8, a: u64, b: u64, c: u64, d: u64) -> [u8; CTRL_BYTES] {
    let mut m = [0u8; CTRL_BYTES];
    m[0] = kind;
    for (i, v) in [a, b, c, d].into_iter().enumerate() {
        m[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    m
}

fn field(m: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(m[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"))
}

impl OfiEndpoint {
    /// Sends a control message; `Again` when the provider has no room now.
    fn ctrl(&mut self, peer: PeerId, msg: &[u8; CTRL_BYTES]) -> Result<Posted, TransportError> {
        let dest = self.st.peers.alive(peer)?.link.addr;
        // SAFETY: fi_tinject copies the message before it returns.
        let rc = unsafe { sys::fmx_fi_tinject(self.fabric.ep(), msg.as_ptr().cast(), CTRL_BYTES, dest, CTRL | u64::from(self.st.rank)) };
        posted(rc).map_err(|rc| TransportError::PeerGone {
            peer,
            reason: format!("libfabric provider {} refused a control message: {}", self.provider, crate::fabric::strerror(rc)),
        })
    }

    /// The credit word for `peer`, as a control message.
    pub(super) fn send_credit_word(&mut self, peer: PeerId, word: u64) -> Result<Posted, TransportError> {
        self.ctrl(peer, &encode(CREDIT, word, 0, 0, 0))
    }

    /// Posts control receive `i` (of `ctrl_slots`).
    pub(super) fn post_ctrl_recv(&self, i: usize) -> Result<Posted, i64> {
        let buf = self.ctrl_recv[i * CTRL_BYTES..].as_ptr();
        let desc = self.ctrl_mr.as_ref().map_or(ptr::null_mut(), |m| m.desc);
        // SAFETY: the buffer lies in the control region the endpoint owns;
        // its context lives in `ctx` until the endpoint closes.
        let rc = unsafe {
            sys::fmx_fi_trecv(
                self.fabric.ep(),
                buf.cast_mut().cast(),
                CTRL_BYTES,
                desc,
                sys::FI_ADDR_UNSPEC,
                CTRL,
                RANK_BITS,
                self.ctx_ptr(self.recv_slots + i),
            )
        };
        posted(rc)
    }

    /// A control message arrived in receive `i`: act on it, then repost.
    pub(super) fn on_ctrl(&mut self, i: usize, peer: PeerId) -> Result<(), TransportError> {
        let m: [u8; CTRL_BYTES] = self.ctrl_recv[i * CTRL_BYTES..][..CTRL_BYTES].try_into().expect("a control buffer");
        match m[0] {
            CREDIT => self.store_mailbox(peer, field(&m, 0)),
            GET => self.serve_get(peer, field(&m, 0), field(&m, 1), field(&m, 2), field(&m, 3))?,
            PUT_REQ => self.accept_put(peer, field(&m, 0), field(&m, 1), field(&m, 2), field(&m, 3))?,
            NACK => self.fail_emulated(peer, field(&m, 0)),
            _ => return Err(TransportError::Malformed { peer, what: "unknown libfabric control message" }),
        }
        match self.post_ctrl_recv(i) {
            Ok(Posted::Again) => {
                // The pool is one buffer smaller until the endpoint closes (rare, harmless).
                tracing::debug!(rank = self.st.rank, "control receive {i} not reposted");
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(rc) => Err(crate::fabric::fail("repost a control receive", &self.provider, rc)),
        }
    }

    fn store_mailbox(&mut self, peer: PeerId, word: u64) {
        if (peer as usize) < self.st.size as usize {
            self.st.mailbox[8 * peer as usize..][..8].copy_from_slice(&word.to_le_bytes());
        }
    }

    fn exposure_range(&self, key: u64, addr: u64, len: u64, write: bool) -> Option<(*mut u8, *mut c_void)> {
        let e = self.emulated.get(&key)?;
        let inside = addr >= e.base && addr.checked_add(len)? <= e.base + e.len as u64;
        (inside && (e.writable || !write)).then_some((addr as *mut u8, e.desc))
    }

    fn serve_get(&mut self, peer: PeerId, addr: u64, len: u64, key: u64, id: u64) -> Result<(), TransportError> {
        let Some((ptr, desc)) = self.exposure_range(key, addr, len, false) else {
            tracing::debug!(rank = self.st.rank, "GET from {peer} for key {key} outside what is exposed");
            let _ = self.ctrl(peer, &encode(NACK, id, 0, 0, 0))?;
            return Ok(());
        };
        self.deferred.push_back(Deferred::Serve { peer, ptr: ptr as u64, len: len as usize, desc: desc as usize, id });
        Ok(())
    }

    fn accept_put(&mut self, peer: PeerId, addr: u64, len: u64, key: u64, id: u64) -> Result<(), TransportError> {
        let Some((ptr, desc)) = self.exposure_range(key, addr, len, true) else {
            let _ = self.ctrl(peer, &encode(NACK, id, 0, 0, 0))?;
            return Ok(());
        };
        // Counted now: revoke waits for it even before the receive is posted.
        if let Some(e) = self.emulated.get_mut(&key) {
            e.sinks += 1;
        }
        self.deferred.push_back(Deferred::Sink { peer, key, ptr: ptr as u64, len: len as usize, desc: desc as usize, id });
        Ok(())
    }

    /// Posts deferred serves and sinks while the provider takes them, in order.
    pub(super) fn retry_emulated(&mut self) -> Result<(), TransportError> {
        while let Some(d) = self.deferred.pop_front() {
            let (peer, what) = match &d {
                Deferred::Serve { peer, .. } => (*peer, Tx::Serve(*peer)),
                Deferred::Sink { peer, key, .. } => (*peer, Tx::Sink(*peer, *key)),
            };
            let Ok(dest) = self.st.peers.alive(peer).map(|p| p.link.addr) else {
                if let Deferred::Sink { key, .. } = d {
                    self.sink_done(key); // the writer is gone: nothing will land
                }
                continue;
            };
            let Some(ctx) = self.take_tx(what) else {
                self.deferred.push_front(d);
                return Ok(());
            };
            // SAFETY: the ranges lie in buffers exposed to this peer (checked on
            // arrival). A served buffer stays alive until the peer's FIN, which
            // follows this data; revoke waits for every sink before the core gets
            // its buffer back. The context lives until the completion.
            let rc = unsafe {
                match d {
                    Deferred::Serve { ptr, len, desc, id, .. } => sys::fmx_fi_tsend(
                        self.fabric.ep(),
                        ptr as *const c_void,
                        len,
                        desc as *mut c_void,
                        dest,
                        data_tag(false, self.st.rank, id),
                        self.ctx_ptr(ctx),
                    ),
                    Deferred::Sink { ptr, len, desc, id, .. } => sys::fmx_fi_trecv(
                        self.fabric.ep(),
                        ptr as *mut c_void,
                        len,
                        desc as *mut c_void,
                        sys::FI_ADDR_UNSPEC,
                        data_tag(true, peer, id),
                        0,
                        self.ctx_ptr(ctx),
                    ),
                }
            };
            match posted(rc) {
                Ok(Posted::Yes) => {}
                Ok(Posted::Again) => {
                    self.give_tx(ctx);
                    self.deferred.push_front(d);
                    return Ok(());
                }
                Err(rc) => {
                    self.give_tx(ctx);
                    if let Deferred::Sink { key, .. } = d {
                        self.sink_done(key);
                    }
                    self.mark_dead(peer, format!("serving an emulated read or write failed: {}", crate::fabric::strerror(rc)));
                }
            }
        }
        Ok(())
    }

    /// A receive posted for a PUT completed.
    pub(super) fn sink_done(&mut self, key: u64) {
        if let Some(e) = self.emulated.get_mut(&key) {
            e.sinks = e.sinks.saturating_sub(1);
        }
    }

    /// The owner refused piece `id` (outside what it exposed).
    fn fail_emulated(&mut self, peer: PeerId, id: u64) {
        if let Some(&op) = self.emulated_ids.get(&id) {
            self.emulated_ids.remove(&id);
            self.ops.fail(op, TransportError::Malformed { peer, what: "the owner refused a read or write outside what it exposed" });
        }
    }

    /// Posts one piece: a read's receive then its GET, or a write's PUT then its data.
    pub(super) fn post_emulated(&mut self, pc: &Piece, dest: sys::fi_addr_t, ctx: usize) -> Result<Posted, TransportError> {
        let id = self.next_tag & ID_BITS;
        let msg = encode(if pc.read { GET } else { PUT_REQ }, pc.remote_addr, pc.len as u64, pc.key, id);
        if pc.read {
            // SAFETY: `local` is the caller's buffer, lent until poll_ops reports the op.
            let rc = unsafe {
                sys::fmx_fi_trecv(
                    self.fabric.ep(),
                    pc.local as *mut c_void,
                    pc.len,
                    pc.desc,
                    sys::FI_ADDR_UNSPEC,
                    data_tag(false, pc.peer, id),
                    0,
                    self.ctx_ptr(ctx),
                )
            };
            match posted(rc) {
                Ok(Posted::Yes) => {}
                Ok(Posted::Again) => return Ok(Posted::Again),
                Err(rc) => {
                    return Err(TransportError::Io {
                        op: "fi_trecv (read)",
                        peer: pc.peer,
                        source: std::io::Error::other(format!("rc {rc}")),
                    })
                }
            }
            // The receive is posted: the GET must go out, waiting for room if need be.
            self.ctrl_until_sent(pc.peer, &msg)?;
        } else {
            if matches!(self.ctrl(pc.peer, &msg)?, Posted::Again) {
                return Ok(Posted::Again);
            }
            // The PUT is out: the data must follow.
            self.tsend_until_sent(pc, dest, id, ctx)?;
        }
        self.emulated_ids.insert(id, pc.op);
        self.next_tag += 1;
        Ok(Posted::Yes)
    }

    fn ctrl_until_sent(&mut self, peer: PeerId, msg: &[u8; CTRL_BYTES]) -> Result<(), TransportError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.ctrl(peer, msg)?, Posted::Again) {
            self.progress_only()?;
            if Instant::now() > deadline {
                return Err(TransportError::PeerGone { peer, reason: "no room to send a control message for 30 s".into() });
            }
        }
        Ok(())
    }

    fn tsend_until_sent(&mut self, pc: &Piece, dest: sys::fi_addr_t, id: u64, ctx: usize) -> Result<(), TransportError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // SAFETY: `local` is the caller's buffer, lent until poll_ops reports
            // the op; the context lives until the completion.
            let rc = unsafe {
                sys::fmx_fi_tsend(
                    self.fabric.ep(),
                    pc.local as *mut c_void,
                    pc.len,
                    pc.desc,
                    dest,
                    data_tag(true, self.st.rank, id),
                    self.ctx_ptr(ctx),
                )
            };
            match posted(rc) {
                Ok(Posted::Yes) => return Ok(()),
                Ok(Posted::Again) if Instant::now() < deadline => self.progress_only()?,
                _ => return Err(TransportError::PeerGone { peer: pc.peer, reason: format!("could not send write data (rc {rc})") }),
            }
        }
    }

    /// Exposes a buffer for GET/PUT: a local descriptor where the provider needs one.
    pub(super) fn expose_emulated(&mut self, ptr: *mut u8, len: usize, writable: bool) -> Result<RemoteKey, TransportError> {
        let addr = ptr as u64;
        let (desc, mr) = match self.memory.owned(addr, len).map(|m| m.desc) {
            Some(d) => (d, None),
            None if self.fabric.mr_mode.local => {
                let mr = self.register_per_op(self.st.rank, ptr, len.max(1), u64::from(sys::FI_SEND | sys::FI_RECV))?;
                (mr.desc, Some(mr))
            }
            None => (ptr::null_mut(), None),
        };
        let key = self.next_tag;
        self.next_tag += 1;
        self.emulated.insert(key, Exposure { base: addr, len, writable, desc, _mr: mr, sinks: 0 });
        Ok(RemoteKey { addr, len: len as u64, key })
    }

    /// Ends an exposure once every write into it has landed (bounded: 30 s).
    pub(super) fn revoke_emulated(&mut self, key: &RemoteKey) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.emulated.get(&key.key).is_some_and(|e| e.sinks > 0) && Instant::now() < deadline {
            if self.progress_only().and_then(|()| self.retry_emulated()).is_err() {
                break;
            }
            std::thread::yield_now();
        }
        self.emulated.remove(&key.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_keep_kinds_apart() {
        let t = data_tag(true, 5, 7);
        assert_eq!(t & RANK_BITS & ID_BITS, 7);
        assert_ne!(t, data_tag(false, 5, 7), "a write's data never matches a read's receive");
        assert_eq!(t & CTRL, 0);
        assert_eq!((t >> 40) & 0x1f_ffff, 5);
        let m = encode(GET, 1, 2, 3, 4);
        assert_eq!((m[0], field(&m, 0), field(&m, 3)), (GET, 1, 4));
    }
}
