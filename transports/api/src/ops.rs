//! The one-sided operations of the RDMA transports (verbs, libfabric), from
//! start to report, in one place: an operation is cut into pieces of at most
//! the device's message size; the pieces wait in a queue until the device has
//! room for them (a non-blocking call never spins on a full send queue); the
//! operation is done when its last piece is, with the first error any piece
//! reported. The transport posts the pieces ([`Operations::pop`], and
//! [`Operations::push_front`] when the device answers "again") and reports
//! their completions ([`Operations::piece_done`]).
//!
//! `L` is what the transport keeps for the local side until the report (a
//! per-operation registration, a bounce buffer); `D` is a piece's local
//! descriptor (an lkey, a libfabric `desc`).

use std::collections::{HashMap, VecDeque};

use crate::{PeerId, RemoteKey, TransportError};

/// One piece, waiting to be posted.
#[derive(Clone, Copy, Debug)]
pub struct Piece<D> {
    /// The operation it belongs to.
    pub op: u64,
    /// The peer whose memory it reads or writes.
    pub peer: PeerId,
    /// Local address of the piece (in memory `desc` describes).
    pub local: u64,
    /// Bytes of the piece.
    pub len: usize,
    /// The transport's descriptor of the local memory.
    pub desc: D,
    /// Address in the peer's exposed region.
    pub remote_addr: u64,
    /// The peer's key for that region.
    pub key: u64,
    /// An RDMA READ (else a WRITE).
    pub read: bool,
}

struct Op<L> {
    peer: PeerId,
    /// Pieces not yet completed (queued or posted).
    pieces: u32,
    local: L,
    error: Option<TransportError>,
}

/// A finished operation, as [`Operations::take_done`] hands it back.
pub struct Finished<L> {
    /// The id [`Operations::start`] returned.
    pub id: u64,
    /// The peer of the operation.
    pub peer: PeerId,
    /// What the transport kept for the local side (to release, or copy out of).
    pub local: L,
    /// Done, or the first error of its pieces.
    pub result: Result<(), TransportError>,
}

/// The operations of one endpoint.
pub struct Operations<L, D> {
    ops: HashMap<u64, Op<L>>,
    queue: VecDeque<Piece<D>>,
    done: Vec<u64>,
    next: u64,
}

impl<L, D: Copy> Default for Operations<L, D> {
    fn default() -> Self {
        Self { ops: HashMap::new(), queue: VecDeque::new(), done: Vec::new(), next: 1 }
    }
}

impl<L, D: Copy> Operations<L, D> {
    /// Starts an operation of `len > 0` bytes between local memory at `base`
    /// (described by `desc`) and `remote` (already checked to hold `len`
    /// bytes), in pieces of at most `piece` bytes; returns its id. The pieces
    /// are queued: post them with [`Operations::pop`].
    #[allow(clippy::too_many_arguments)]
    pub fn start(&mut self, peer: PeerId, base: u64, len: usize, desc: D, remote: &RemoteKey, read: bool, piece: usize, local: L) -> u64 {
        let id = self.next;
        self.next += 1;
        let piece = piece.max(1);
        let pieces = len.div_ceil(piece);
        self.ops.insert(id, Op { peer, pieces: pieces as u32, local, error: None });
        for i in 0..pieces {
            let off = i * piece;
            self.queue.push_back(Piece {
                op: id,
                peer,
                local: base + off as u64,
                len: piece.min(len - off),
                desc,
                remote_addr: remote.addr + off as u64,
                key: remote.key,
                read,
            });
        }
        id
    }

    /// The next piece to post.
    pub fn pop(&mut self) -> Option<Piece<D>> {
        self.queue.pop_front()
    }

    /// Puts back a piece the device had no room for: it goes first next time.
    pub fn push_front(&mut self, p: Piece<D>) {
        self.queue.push_front(p);
    }

    /// Whether pieces wait to be posted.
    pub fn queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// A piece of operation `id` completed (or failed, or could not be posted).
    /// The operation keeps the first error.
    pub fn piece_done(&mut self, id: u64, error: Option<TransportError>) {
        if let Some(op) = self.ops.get_mut(&id) {
            op.pieces = op.pieces.saturating_sub(1);
            if let Some(e) = error {
                op.error.get_or_insert(e);
            }
            if op.pieces == 0 {
                self.done.push(id);
            }
        }
    }

    /// Records an error against operation `id` without completing a piece.
    pub fn fail(&mut self, id: u64, error: TransportError) {
        if let Some(op) = self.ops.get_mut(&id) {
            op.error.get_or_insert(error);
        }
    }

    /// Ends every operation not yet done with an error (the endpoint was
    /// closed: nothing more completes); drops the queue.
    pub fn abandon_all(&mut self, error: impl Fn(PeerId) -> TransportError) -> usize {
        self.queue.clear();
        let mut n = 0;
        for (&id, op) in &mut self.ops {
            if op.pieces > 0 {
                op.pieces = 0;
                op.error.get_or_insert_with(|| error(op.peer));
                self.done.push(id);
                n += 1;
            }
        }
        n
    }

    /// The operations finished since the last call.
    pub fn take_done(&mut self) -> Vec<Finished<L>> {
        std::mem::take(&mut self.done)
            .into_iter()
            .filter_map(|id| {
                let op = self.ops.remove(&id)?;
                Some(Finished { id, peer: op.peer, local: op.local, result: op.error.map_or(Ok(()), Err) })
            })
            .collect()
    }

    /// Forgets everything (the endpoint is closing and will report nothing more).
    pub fn clear(&mut self) {
        self.ops.clear();
        self.queue.clear();
        self.done.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RemoteKey {
        RemoteKey { addr: 1000, len: 10, key: 7 }
    }

    #[test]
    fn pieces_cover_the_range_and_the_first_error_wins() {
        let mut ops = Operations::<&str, u32>::default();
        let id = ops.start(3, 500, 10, 9, &key(), true, 4, "mr");
        let pieces: Vec<Piece<u32>> = std::iter::from_fn(|| ops.pop()).collect();
        let got: Vec<(u64, usize, u64)> = pieces.iter().map(|p| (p.local, p.len, p.remote_addr)).collect();
        assert_eq!(got, vec![(500, 4, 1000), (504, 4, 1004), (508, 2, 1008)]);
        assert!(pieces.iter().all(|p| p.op == id && p.peer == 3 && p.desc == 9 && p.key == 7 && p.read));
        ops.piece_done(id, None);
        ops.piece_done(id, Some(TransportError::Malformed { peer: 3, what: "first" }));
        assert!(ops.take_done().is_empty(), "one piece is still out");
        ops.piece_done(id, Some(TransportError::Malformed { peer: 3, what: "second" }));
        let done = ops.take_done();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].id, done[0].peer, done[0].local), (id, 3, "mr"));
        assert!(matches!(done[0].result, Err(TransportError::Malformed { what: "first", .. })));
        assert!(ops.take_done().is_empty(), "reported once");
    }

    #[test]
    fn a_piece_put_back_goes_first_and_abandon_ends_everything() {
        let mut ops = Operations::<(), ()>::default();
        let a = ops.start(1, 0, 8, (), &key(), false, 8, ());
        let b = ops.start(2, 0, 8, (), &key(), false, 8, ());
        let p = ops.pop().expect("a's piece");
        ops.push_front(p);
        assert_eq!(ops.pop().map(|p| p.op), Some(a));
        assert!(ops.queued(), "b's piece waits");
        assert_eq!(ops.abandon_all(|peer| TransportError::PeerGone { peer, reason: "closed".into() }), 2);
        assert!(!ops.queued());
        let mut done: Vec<(u64, bool)> = ops.take_done().into_iter().map(|f| (f.id, f.result.is_err())).collect();
        done.sort_unstable();
        assert_eq!(done, vec![(a, true), (b, true)]);
        ops.piece_done(a, None); // a late completion of an abandoned piece is ignored
        assert!(ops.take_done().is_empty());
    }
}
