//! MPI matching: posted receives and unexpected messages, in order.
//!
//! A message matches the earliest posted receive whose (context, source,
//! tag) it satisfies; a new receive matches the earliest unexpected message.
//! Transports deliver each sender's messages in order, so two messages from
//! one sender on one context never overtake each other. Pure logic, no I/O.

use std::collections::VecDeque;

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

/// What arrived before its receive was posted.
#[derive(Debug)]
pub(crate) enum Body {
    /// The data, copied out of the transport slot (so its credit returns).
    Eager(Vec<u8>),
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

/// The two queues.
#[derive(Debug, Default)]
pub(crate) struct Matching {
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
}

impl Matching {
    /// The earliest posted receive that accepts this message, removed.
    #[inline]
    pub(crate) fn take_posted(&mut self, src: u32, ctx: u32, tag: u32) -> Option<Posted> {
        let i = self.posted.iter().position(|p| p.accepts(src, ctx, tag))?;
        self.posted.remove(i)
    }

    /// Queues a receive that found no unexpected message.
    pub(crate) fn post(&mut self, p: Posted) {
        self.posted.push_back(p);
    }

    /// The tag of the earliest unexpected message from `src` on `ctx`.
    pub(crate) fn first_tag_from(&self, ctx: u32, src: u32) -> Option<u32> {
        self.unexpected.iter().find(|u| u.ctx == ctx && u.src == src).map(|u| u.tag)
    }

    /// The earliest unexpected message this receive accepts, removed.
    pub(crate) fn take_unexpected(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<Unexpected> {
        let i = self.unexpected.iter().position(|u| u.matches(ctx, src, tag))?;
        self.unexpected.remove(i)
    }

    /// The earliest unexpected message this receive would accept (probe).
    pub(crate) fn peek_unexpected(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<&Unexpected> {
        self.unexpected.iter().find(|u| u.matches(ctx, src, tag))
    }

    /// Queues a message that matched no posted receive.
    pub(crate) fn arrive(&mut self, u: Unexpected) {
        self.unexpected.push_back(u);
    }

    /// Removes a posted receive (cancel).
    pub(crate) fn cancel(&mut self, req: ReqId) -> Option<Posted> {
        let i = self.posted.iter().position(|p| p.req == req)?;
        self.posted.remove(i)
    }

    /// Number of posted receives and unexpected messages.
    #[cfg(test)]
    pub(crate) fn lens(&self) -> (usize, usize) {
        (self.posted.len(), self.unexpected.len())
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
        Unexpected { src, ctx, tag, len: 1, body: Body::Eager(vec![byte]) }
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
}
