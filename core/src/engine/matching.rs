//! MPI matching: posted receives and unexpected messages, in order.
//!
//! A message matches the earliest posted receive whose (context, source,
//! tag) it satisfies; a new receive matches the earliest unexpected message.
//! Transports deliver each sender's messages in order, so two messages from
//! one sender on one context never overtake each other. Pure logic, no I/O.

use std::collections::{HashMap, VecDeque};

use fmx_transport::lend::Lent;
use fmx_transport::RemoteKey;

use super::requests::ReqId;

/// A receive waiting for its message.
#[derive(Debug)]
pub(crate) struct Posted {
    pub(crate) req: ReqId,
    pub(crate) ctx: u32,
    /// `None` = any source.
    pub(crate) src: Option<u32>,
    /// `None` = any tag.
    pub(crate) tag: Option<u32>,
    pub(crate) buf: Lent,
}

impl Posted {
    fn accepts(&self, src: u32, ctx: u32, tag: u32) -> bool {
        self.ctx == ctx && self.src.is_none_or(|s| s == src) && self.tag.is_none_or(|t| t == tag)
    }
}

/// Bytes up to this many are kept inside an unexpected message.
const INLINE: usize = 48;

/// An early eager message's bytes, copied out of the transport slot (so
/// its credit returns): small ones without an allocation (a window of 8 B
/// messages that outruns its receives would otherwise malloc each).
#[derive(Debug)]
pub(crate) enum Stored {
    Inline(u8, [u8; INLINE]),
    Heap(Vec<u8>),
}

impl Stored {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        if bytes.len() <= INLINE {
            let mut b = [0u8; INLINE];
            b[..bytes.len()].copy_from_slice(bytes);
            Stored::Inline(bytes.len() as u8, b)
        } else {
            Stored::Heap(bytes.to_vec())
        }
    }

    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Stored::Inline(n, b) => b[..usize::from(n)].to_vec(),
            Stored::Heap(v) => v,
        }
    }
}

impl std::ops::Deref for Stored {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Stored::Inline(n, b) => &b[..usize::from(*n)],
            Stored::Heap(v) => v,
        }
    }
}

/// What arrived before its receive was posted.
#[derive(Debug)]
pub(crate) enum Body {
    /// The data.
    Eager(Stored),
    /// A rendezvous offer: the sender's buffer key and its request cookie.
    Rts { key: RemoteKey, cookie: u64 },
}

/// A message nobody has received yet.
#[derive(Debug)]
pub(crate) struct Unexpected {
    pub(crate) src: u32,
    pub(crate) ctx: u32,
    pub(crate) tag: u32,
    /// Total message length.
    pub(crate) len: u64,
    pub(crate) body: Body,
}

impl Unexpected {
    fn matches(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> bool {
        self.ctx == ctx && src.is_none_or(|s| s == self.src) && tag.is_none_or(|t| t == self.tag)
    }
}

/// (context, source, tag): what an exact receive names.
type Key = (u32, u32, u32);

/// A hasher for [`Key`]s: one multiply per word (`FxHash`'s), since `SipHash`
/// would cost more than the whole match of a ping-pong. Keys come from our
/// own ranks and tags, not from an attacker.
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type KeyMap<V> = HashMap<Key, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Empty buckets are kept (a ping-pong reuses its one key without
/// allocating) until a map holds this many keys, then swept; the next sweep
/// waits until the map has doubled, so sweeping stays O(1) per operation.
const SWEEP_KEYS: usize = 1024;

/// Drops the empty buckets of `map` once it has grown to `*at` keys.
fn sweep<V>(map: &mut KeyMap<VecDeque<V>>, at: &mut usize) {
    if map.len() >= (*at).max(SWEEP_KEYS) {
        map.retain(|_, q| !q.is_empty());
        *at = 2 * map.len();
    }
}

/// Exact receives kept in a short list before they go to the index: a
/// ping-pong's one receive is matched without hashing.
const RECENT: usize = 8;

/// Posted receives and unexpected messages.
///
/// A receive that names its source and tag waits in a short list of the
/// newest ones or, once more are posted, in its key's bucket, where a
/// message finds it in O(1); a receive with a wildcard waits in one list
/// that every message checks. A sequence number keeps MPI's order between
/// them: a message takes the earliest receive that accepts it, wherever it
/// waits. Unexpected messages stay in arrival order (a taken one leaves a
/// hole until it reaches the front) with an index by key, so an exact
/// receive finds its message in O(1) too.
#[derive(Debug, Default)]
pub(crate) struct Matching {
    seq: u64,
    /// The newest exact receives, oldest first (at most [`RECENT`]).
    recent: VecDeque<(u64, Posted)>,
    /// Older exact receives by key, each bucket oldest first.
    exact: KeyMap<VecDeque<(u64, Posted)>>,
    /// Receives in `exact`.
    indexed: usize,
    wild: VecDeque<(u64, Posted)>,
    /// Unexpected messages in arrival order; `None` where one was taken.
    unexpected: VecDeque<Option<Unexpected>>,
    /// The arrival number of `unexpected`'s front.
    head: u64,
    /// Arrival numbers of the unexpected messages, by key, oldest first.
    by_key: KeyMap<VecDeque<u64>>,
    /// Messages in `unexpected` (holes apart).
    waiting: usize,
    /// When each map is swept next (see [`sweep`]).
    sweep_exact: usize,
    sweep_by_key: usize,
}

impl Matching {
    /// The earliest posted receive that accepts this message, removed.
    #[inline]
    pub(crate) fn take_posted(&mut self, src: u32, ctx: u32, tag: u32) -> Option<Posted> {
        // A ping-pong's case: no wildcard, nothing indexed, the receive at the front.
        if self.indexed == 0 && self.wild.is_empty() {
            if let Some((_, p)) = self.recent.front() {
                if p.ctx == ctx && p.src == Some(src) && p.tag == Some(tag) {
                    return self.recent.pop_front().map(|(_, p)| p);
                }
            }
        }
        self.take_posted_anywhere(src, ctx, tag)
    }

    #[inline(never)]
    fn take_posted_anywhere(&mut self, src: u32, ctx: u32, tag: u32) -> Option<Posted> {
        let key = (ctx, src, tag);
        let in_recent = self.recent.iter().position(|(_, p)| p.ctx == ctx && p.src == Some(src) && p.tag == Some(tag));
        let mut best = in_recent.map(|i| self.recent[i].0);
        let in_index = if self.indexed > 0 { self.exact.get(&key).and_then(|q| q.front()).map(|(s, _)| *s) } else { None };
        // The index holds older receives than the short list.
        if in_index.is_some() {
            best = in_index;
        }
        // Only wildcards posted before the best exact receive can take the message first.
        let wild = self.wild.iter().take_while(|(s, _)| best.is_none_or(|b| *s < b)).position(|(_, p)| p.accepts(src, ctx, tag));
        if let Some(i) = wild {
            return self.wild.remove(i).map(|(_, p)| p);
        }
        if in_index.is_some() {
            self.indexed -= 1;
            return self.exact.get_mut(&key).and_then(VecDeque::pop_front).map(|(_, p)| p);
        }
        self.recent.remove(in_recent?).map(|(_, p)| p)
    }

    /// Queues a receive that found no unexpected message.
    pub(crate) fn post(&mut self, p: Posted) {
        self.seq += 1;
        if p.src.is_none() || p.tag.is_none() {
            self.wild.push_back((self.seq, p));
            return;
        }
        if self.recent.len() == RECENT {
            let (seq, old) = self.recent.pop_front().expect("a full list");
            sweep(&mut self.exact, &mut self.sweep_exact);
            let key = (old.ctx, old.src.expect("exact"), old.tag.expect("exact"));
            self.exact.entry(key).or_default().push_back((seq, old));
            self.indexed += 1;
        }
        self.recent.push_back((self.seq, p));
    }

    /// The tag of the earliest unexpected message from `src` on `ctx`.
    pub(crate) fn first_tag_from(&self, ctx: u32, src: u32) -> Option<u32> {
        self.unexpected.iter().flatten().find(|u| u.ctx == ctx && u.src == src).map(|u| u.tag)
    }

    /// The arrival number of the earliest unexpected message this receive accepts.
    fn find_unexpected(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<u64> {
        if self.waiting == 0 {
            return None;
        }
        if let (Some(s), Some(t)) = (src, tag) {
            return self.by_key.get(&(ctx, s, t)).and_then(|q| q.front().copied());
        }
        let i = self.unexpected.iter().position(|u| u.as_ref().is_some_and(|u| u.matches(ctx, src, tag)))?;
        Some(self.head + i as u64)
    }

    /// The earliest unexpected message this receive accepts, removed.
    pub(crate) fn take_unexpected(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<Unexpected> {
        self.take_unexpected_if(ctx, src, tag, |_| true)
    }

    /// The earliest unexpected message this receive accepts, removed if it is
    /// eager (a rendezvous offer stays queued): its source, tag and bytes.
    pub(crate) fn take_unexpected_eager(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<(u32, u32, Stored)> {
        let u = self.take_unexpected_if(ctx, src, tag, |u| matches!(u.body, Body::Eager(_)))?;
        match u.body {
            Body::Eager(data) => Some((u.src, u.tag, data)),
            Body::Rts { .. } => None,
        }
    }

    /// The earliest unexpected message this receive accepts, removed if `take` says so.
    fn take_unexpected_if(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<u32>,
        take: impl Fn(&Unexpected) -> bool,
    ) -> Option<Unexpected> {
        let n = self.find_unexpected(ctx, src, tag)?;
        let slot = self.unexpected.get_mut((n - self.head) as usize)?;
        if !slot.as_ref().is_some_and(&take) {
            return None;
        }
        let u = slot.take()?;
        self.waiting -= 1;
        // The earliest message a receive accepts is the earliest of its key.
        if let Some(q) = self.by_key.get_mut(&(u.ctx, u.src, u.tag)) {
            debug_assert_eq!(q.front(), Some(&n));
            q.pop_front();
        }
        while matches!(self.unexpected.front(), Some(None)) {
            self.unexpected.pop_front();
            self.head += 1;
        }
        Some(u)
    }

    /// The earliest unexpected message this receive would accept (probe).
    pub(crate) fn peek_unexpected(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<&Unexpected> {
        let n = self.find_unexpected(ctx, src, tag)?;
        self.unexpected.get((n - self.head) as usize)?.as_ref()
    }

    /// Queues a message that matched no posted receive.
    pub(crate) fn arrive(&mut self, u: Unexpected) {
        let n = self.head + self.unexpected.len() as u64;
        sweep(&mut self.by_key, &mut self.sweep_by_key);
        self.by_key.entry((u.ctx, u.src, u.tag)).or_default().push_back(n);
        self.unexpected.push_back(Some(u));
        self.waiting += 1;
    }

    /// Removes a posted receive (cancel).
    pub(crate) fn cancel(&mut self, req: ReqId) -> Option<Posted> {
        for list in [&mut self.recent, &mut self.wild] {
            if let Some(i) = list.iter().position(|(_, p)| p.req == req) {
                return list.remove(i).map(|(_, p)| p);
            }
        }
        let found = self.exact.values_mut().find_map(|q| {
            let i = q.iter().position(|(_, p)| p.req == req)?;
            q.remove(i).map(|(_, p)| p)
        });
        self.indexed -= usize::from(found.is_some());
        found
    }

    /// Number of posted receives and unexpected messages.
    #[cfg(test)]
    pub(crate) fn lens(&self) -> (usize, usize) {
        (self.recent.len() + self.wild.len() + self.indexed, self.waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fmx_transport::lend::{lend_scope, LendTable};
    use std::cell::RefCell;

    fn id(i: u32) -> ReqId {
        ReqId::new(i, 0)
    }

    fn unexp(src: u32, ctx: u32, tag: u32, byte: u8) -> Unexpected {
        Unexpected { src, ctx, tag, len: 1, body: Body::Eager(Stored::new(&[byte])) }
    }

    #[test]
    fn earliest_posted_receive_wins_and_wildcards_match() {
        let table = RefCell::new(LendTable::new());
        let mut b = [[0u8; 1]; 4];
        lend_scope(&table, |s| {
            let [b0, b1, b2, b3] = &mut b;
            let mut m = Matching::default();
            m.post(Posted { req: id(0), ctx: 1, src: Some(2), tag: Some(5), buf: s.lend_mut(b0) });
            m.post(Posted { req: id(1), ctx: 1, src: None, tag: Some(5), buf: s.lend_mut(b1) });
            m.post(Posted { req: id(2), ctx: 1, src: Some(3), tag: None, buf: s.lend_mut(b2) });
            m.post(Posted { req: id(3), ctx: 2, src: None, tag: None, buf: s.lend_mut(b3) });
            // (3, ctx 1, tag 5): id0 wants src 2, id1 takes any source with tag 5.
            assert_eq!(m.take_posted(3, 1, 5).unwrap().req, id(1));
            assert_eq!(m.take_posted(3, 1, 9).unwrap().req, id(2));
            assert!(m.take_posted(3, 1, 5).is_none(), "only id0 (src 2) is left on ctx 1");
            assert_eq!(m.take_posted(7, 2, 0).unwrap().req, id(3), "contexts are isolated");
            assert_eq!(m.take_posted(2, 1, 5).unwrap().req, id(0));
            assert_eq!(m.lens(), (0, 0));
        });
    }

    #[test]
    fn unexpected_messages_match_in_arrival_order() {
        let mut m = Matching::default();
        m.arrive(unexp(1, 0, 7, 1));
        m.arrive(unexp(2, 0, 7, 2));
        m.arrive(unexp(1, 0, 7, 3));
        m.arrive(unexp(1, 4, 7, 4));
        assert_eq!(m.peek_unexpected(0, Some(1), None).map(|u| u.tag), Some(7));
        let take = |m: &mut Matching, src, tag| match m.take_unexpected(0, src, tag).map(|u| u.body) {
            Some(Body::Eager(v)) => v[0],
            _ => 0,
        };
        assert_eq!(take(&mut m, Some(1), Some(7)), 1);
        assert_eq!(take(&mut m, None, None), 2);
        assert_eq!(take(&mut m, None, Some(7)), 3, "non-overtaking from rank 1");
        assert_eq!(take(&mut m, None, None), 0, "ctx 4 is not visible from ctx 0");
        assert_eq!(m.lens(), (0, 1));
    }

    /// The index keeps MPI's order: against the plain "earliest in one
    /// queue" rule, over random receives (exact and wildcard) and messages.
    #[test]
    fn the_index_matches_as_one_queue_would() {
        let table = RefCell::new(LendTable::new());
        let mut bufs = vec![[0u8; 1]; 4000];
        lend_scope(&table, |s| {
            let mut m = Matching::default();
            // The reference: receives and messages in one queue each, scanned in order.
            let mut posted: Vec<(u32, Option<u32>, Option<u32>, ReqId)> = Vec::new();
            let mut unexpected: Vec<(u32, u32, u32, u8)> = Vec::new();
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut draw = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % n) as u32
            };
            let mut bufs = bufs.iter_mut();
            let mut deepest = 0;
            for step in 0..4000u32 {
                let (ctx, src, tag) = (draw(2), draw(3), draw(3));
                let wild = |d: u32, v: u32| if d == 0 { None } else { Some(v) };
                if draw(2) == 0 {
                    // A message arrives: a posted receive takes it, or it waits.
                    let want =
                        posted.iter().position(|&(c, ps, pt, _)| c == ctx && ps.is_none_or(|x| x == src) && pt.is_none_or(|x| x == tag));
                    let got = m.take_posted(src, ctx, tag).map(|p| p.req);
                    assert_eq!(got, want.map(|i| posted.remove(i).3), "step {step}");
                    if got.is_none() {
                        m.arrive(unexp(src, ctx, tag, step as u8));
                        unexpected.push((src, ctx, tag, step as u8));
                    }
                } else {
                    // A receive: an unexpected message satisfies it, or it is posted.
                    let (s_, t_) = (wild(draw(4), src), wild(draw(4), tag));
                    let want = unexpected
                        .iter()
                        .position(|&(us, uc, ut, _)| uc == ctx && s_.is_none_or(|x| x == us) && t_.is_none_or(|x| x == ut));
                    let got = m.take_unexpected(ctx, s_, t_).map(|u| match u.body {
                        Body::Eager(v) => v[0],
                        Body::Rts { .. } => unreachable!(),
                    });
                    assert_eq!(got, want.map(|i| unexpected.remove(i).3), "step {step}");
                    if got.is_none() {
                        let req = id(step);
                        m.post(Posted { req, ctx, src: s_, tag: t_, buf: s.lend_mut(bufs.next().expect("a buffer")) });
                        posted.push((ctx, s_, t_, req));
                    }
                }
                assert_eq!(m.lens(), (posted.len(), unexpected.len()));
                deepest = deepest.max(m.indexed);
            }
            assert!(deepest >= 8, "the index was used (at most {deepest} receives in it)");
            // Cancel finds receives wherever they wait.
            for (.., req) in posted.drain(..) {
                assert_eq!(m.cancel(req).map(|p| p.req), Some(req));
            }
            assert_eq!(m.lens().0, 0);
        });
    }
}
