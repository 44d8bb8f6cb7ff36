//! Non-blocking operations on borrowed buffers, completed by their scope.

use std::cell::RefCell;
use std::marker::PhantomData;

use bytemuck::Pod;
use fmx_transport::lend::Lender;

use crate::coll::util::coll_name;
use crate::comm::Comm;
use crate::engine::{RawStatus, ReqId, WaitsOn};
use crate::error::{Error, Result};
use crate::status::{Source, Status, Tag};

/// A pending non-blocking operation of a [`Scope`].
///
/// Dropping or leaking it is harmless: the scope completes it anyway.
#[derive(Debug)]
#[must_use = "a request is completed by wait/test or at the end of its scope"]
pub struct Request<'s> {
    id: ReqId,
    elem_size: usize,
    check: Check,
    /// A send that went out inside `isend`: its status, with no engine request behind it.
    done: Option<RawStatus>,
    _scope: PhantomData<&'s mut &'s ()>,
}

/// What a finished operation's status is checked for, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The user's own: truncation and partial elements ([`Comm::status`]).
    PointToPoint,
    /// A collective's: truncation is named by the collective, not by its internal tag.
    Collective,
    /// A collective's that must fill its buffer exactly.
    Exact,
}

/// A scope's requests not yet waited for: id, element size, checks.
/// In posting order: a wait finds its request by looking from the front,
/// and requests waited for in the order they were posted (a window's
/// `wait_all`) are each found first and leave in O(1).
pub(crate) type PendingList = std::collections::VecDeque<(ReqId, usize, Check)>;

/// Where non-blocking operations live; see [`Comm::scope`].
///
/// Buffers given to `isend`/`irecv` stay borrowed until the scope ends, and
/// the scope does not end before every operation started in it is complete
/// (like `std::thread::scope`), so a request can be leaked with
/// `mem::forget` without any unsoundness.
pub struct Scope<'s, 'env> {
    comm: &'s Comm,
    lender: &'s Lender<'s, 'env>,
    /// Requests not yet waited for, with their element sizes and exactness
    /// (for the checks [`Scope::wait`] makes when the scope completes them).
    pending: RefCell<PendingList>,
}

impl<'s, 'env> Scope<'s, 'env> {
    pub(crate) fn new(comm: &'s Comm, lender: &'s Lender<'s, 'env>) -> Self {
        let pending = std::mem::take(&mut *comm.sh.spare_pending.borrow_mut());
        Self { comm, lender, pending: RefCell::new(pending) }
    }

    /// The communicator.
    pub fn comm(&self) -> &'s Comm {
        self.comm
    }

    fn request(&self, id: ReqId, elem_size: usize, check: Check) -> Request<'s> {
        self.pending.borrow_mut().push_back((id, elem_size, check));
        Request { id, elem_size, check, done: None, _scope: PhantomData }
    }

    /// The user's status of a finished operation, with the checks its kind needs.
    fn status(&self, raw: RawStatus, elem_size: usize, check: Check) -> Result<Status> {
        let off = match check {
            Check::Exact => raw.sent != raw.capacity,
            Check::Collective => raw.sent > raw.capacity,
            Check::PointToPoint => false,
        };
        if off {
            let source = self.comm.world_to_comm.get(raw.src as usize).copied().unwrap_or(crate::comm::NOT_MEMBER);
            return Err(Error::CollectiveMismatch {
                op: coll_name(raw.tag),
                detail: format!(
                    "rank {source} sent {} bytes where this rank expects {} bytes: do all ranks pass the same counts, root and element type?",
                    raw.sent, raw.capacity
                ),
            });
        }
        self.comm.status(raw, elem_size)
    }

    /// Starts sending `buf` to `dest`.
    pub fn isend<T: Pod>(&self, buf: &'env [T], dest: u32, tag: i32) -> Result<Request<'s>> {
        self.comm.sh.check_live("isend")?;
        let tag = Comm::check_tag(tag)?;
        self.isend_ctx(self.comm.ctx, buf, dest, tag)
    }

    pub(crate) fn isend_ctx<T: Pod>(&self, ctx: u32, buf: &'env [T], dest: u32, tag: u32) -> Result<Request<'s>> {
        let w = self.comm.check_rank("send destination", dest)?;
        let bytes: &[u8] = bytemuck::cast_slice(buf);
        // An eager send that goes out now needs no lend, no engine request
        // and no place in the scope's list (a window of small sends).
        if self.comm.sh.engine.borrow_mut().send_inline(ctx, tag, w, bytes).map_err(|e| self.comm.localize(e))? {
            let me = self.comm.sh.engine.borrow().world_rank();
            let sent = bytes.len() as u64;
            let raw = RawStatus { src: me, tag, sent, capacity: sent };
            let id = ReqId::new(u32::MAX, u32::MAX); // never pending: a later use is stale
            return Ok(Request {
                id,
                elem_size: std::mem::size_of::<T>(),
                check: Check::PointToPoint,
                done: Some(raw),
                _scope: PhantomData,
            });
        }
        let lent = self.lender.lend(bytemuck::cast_slice(buf));
        let id = {
            let mut e = self.comm.sh.engine.borrow_mut();
            let lend = self.comm.sh.lend.borrow();
            e.start_send(&lend, ctx, tag, w, lent)
        }
        .map_err(|e| self.comm.localize(e))?;
        Ok(self.request(id, std::mem::size_of::<T>(), Check::PointToPoint))
    }

    /// Starts receiving into `buf` from `src` with `tag` (wildcards allowed).
    pub fn irecv<T: Pod>(&self, buf: &'env mut [T], src: impl Into<Source>, tag: impl Into<Tag>) -> Result<Request<'s>> {
        self.comm.sh.check_live("irecv")?;
        let (s, waits_on) = self.comm.source_filter(src.into())?;
        let t = Comm::tag_filter(tag.into())?;
        self.irecv_ctx(self.comm.ctx, buf, s, t, waits_on)
    }

    pub(crate) fn irecv_ctx<T: Pod>(
        &self,
        ctx: u32,
        buf: &'env mut [T],
        src: Option<u32>,
        tag: Option<u32>,
        waits_on: WaitsOn,
    ) -> Result<Request<'s>> {
        let check = if ctx == self.comm.coll_ctx() { Check::Collective } else { Check::PointToPoint };
        self.irecv_checked(ctx, buf, src, tag, waits_on, check)
    }

    fn irecv_checked<T: Pod>(
        &self,
        ctx: u32,
        buf: &'env mut [T],
        src: Option<u32>,
        tag: Option<u32>,
        waits_on: WaitsOn,
        check: Check,
    ) -> Result<Request<'s>> {
        let lent = self.lender.lend_mut(bytemuck::cast_slice_mut(buf));
        let id = {
            let mut e = self.comm.sh.engine.borrow_mut();
            let mut lend = self.comm.sh.lend.borrow_mut();
            e.start_recv(&mut lend, ctx, src, tag, lent, waits_on, ctx == self.comm.coll_ctx())
        }
        .map_err(|e| self.comm.localize(e))?;
        Ok(self.request(id, std::mem::size_of::<T>(), check))
    }

    /// Receive from a known communicator rank on the collective context.
    pub(crate) fn irecv_coll<T: Pod>(&self, buf: &'env mut [T], src: u32, tag: u32) -> Result<Request<'s>> {
        let w = self.comm.check_rank("collective source", src)?;
        self.irecv_ctx(self.comm.coll_ctx(), buf, Some(w), Some(tag), WaitsOn::Peer(w))
    }

    /// A collective's receive of exactly `buf.len()` elements: a shorter or
    /// longer message means the ranks disagree on counts, root or type, and
    /// is [`Error::CollectiveMismatch`] naming the collective and the sender.
    pub(crate) fn irecv_exact<T: Pod>(&self, buf: &'env mut [T], src: u32, tag: u32) -> Result<Request<'s>> {
        let w = self.comm.check_rank("collective source", src)?;
        self.irecv_checked(self.comm.coll_ctx(), buf, Some(w), Some(tag), WaitsOn::Peer(w), Check::Exact)
    }

    /// Send to a communicator rank on the collective context.
    pub(crate) fn isend_coll<T: Pod>(&self, buf: &'env [T], dest: u32, tag: u32) -> Result<Request<'s>> {
        self.isend_ctx(self.comm.coll_ctx(), buf, dest, tag)
    }

    fn forget(&self, id: ReqId) -> Result<()> {
        let mut p = self.pending.borrow_mut();
        let i = p.iter().position(|&(x, _, _)| x == id).ok_or(Error::StaleRequest(id.index()))?;
        p.remove(i);
        Ok(())
    }

    /// Waits for `req` and returns its status (for a send: our rank, the tag, the count sent).
    pub fn wait(&self, req: Request<'s>) -> Result<Status> {
        if let Some(raw) = req.done {
            return self.status(raw, req.elem_size, req.check);
        }
        self.forget(req.id)?;
        let sh = &self.comm.sh;
        let raw = {
            let mut e = sh.engine.borrow_mut();
            let r = e.wait(&mut sh.lend.borrow_mut(), req.id);
            if let Err(err) = r {
                e.discard(req.id);
                return Err(self.comm.localize(err.settled()));
            }
            e.take(req.id).ok_or(Error::StaleRequest(req.id.index()))?
        };
        match raw {
            Ok(raw) => self.status(raw, req.elem_size, req.check),
            Err(e) => Err(self.comm.localize(e)),
        }
    }

    /// Waits for `req` without giving it up: after an error that leaves it
    /// pending (a receive from any source whose member departed:
    /// [`Error::PeerGone`] with `pending`), it may be waited for again, and
    /// completes if a live member sends. Once it completed or failed for
    /// good, the handle is spent (a further call is [`Error::StaleRequest`]).
    pub fn wait_mut(&self, req: &mut Request<'s>) -> Result<Status> {
        if let Some(raw) = req.done.take() {
            // Spent: a further call finds no request.
            return self.status(raw, req.elem_size, req.check);
        }
        let sh = &self.comm.sh;
        let r = sh.engine.borrow_mut().wait(&mut sh.lend.borrow_mut(), req.id);
        match r {
            Err(err) if sh.engine.borrow().is_pending(req.id) => Err(self.comm.localize(err)),
            _ => self.wait(Request { id: req.id, elem_size: req.elem_size, check: req.check, done: None, _scope: PhantomData }),
        }
    }

    /// Whether `req` is complete (drives progress once); `wait` then returns at once.
    pub fn test(&self, req: &Request<'s>) -> Result<bool> {
        if req.done.is_some() {
            return Ok(true);
        }
        let sh = &self.comm.sh;
        let mut e = sh.engine.borrow_mut();
        if e.is_pending(req.id) {
            e.progress(&mut sh.lend.borrow_mut()).map_err(|err| self.comm.localize(err))?;
        }
        Ok(!e.is_pending(req.id))
    }

    /// Waits for every request; the statuses in order, or the first error.
    pub fn wait_all<I: IntoIterator<Item = Request<'s>>>(&self, reqs: I) -> Result<Vec<Status>> {
        let mut out = Vec::new();
        let mut first_err = None;
        for r in reqs {
            match self.wait(r) {
                Ok(s) => out.push(s),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Waits for whichever request completes first; its index and status.
    pub fn wait_any(&self, reqs: &mut Vec<Request<'s>>) -> Result<(usize, Status)> {
        if reqs.is_empty() {
            return Err(Error::InvalidCount { what: "wait_any", detail: "no requests given".into() });
        }
        if let Some(i) = reqs.iter().position(|r| r.done.is_some()) {
            let r = reqs.swap_remove(i);
            return self.wait(r).map(|s| (i, s));
        }
        let ids: Vec<ReqId> = reqs.iter().map(|r| r.id).collect();
        let sh = &self.comm.sh;
        let r = sh.engine.borrow_mut().wait_any(&mut sh.lend.borrow_mut(), &ids);
        r.map_err(|e| self.comm.localize(e))?;
        let e = sh.engine.borrow();
        let i = ids.iter().position(|&id| !e.is_pending(id)).expect("wait_any returns once one is done");
        drop(e);
        let r = reqs.swap_remove(i);
        self.wait(r).map(|s| (i, s))
    }

    /// Completes everything still pending; called when the scope closes.
    /// Each is checked as [`Scope::wait`] checks it: a receive that was
    /// truncated or got a partial element is an error here too.
    pub(crate) fn finish(&self) -> Result<()> {
        let mut ids: PendingList = std::mem::take(&mut *self.pending.borrow_mut());
        let sh = &self.comm.sh;
        let mut e = sh.engine.borrow_mut();
        let mut lend = sh.lend.borrow_mut();
        let mut first_err = None;
        for (id, elem_size, check) in ids.drain(..) {
            if first_err.is_none() {
                match e.wait(&mut lend, id) {
                    Ok(()) => {
                        let checked = match e.take(id) {
                            Some(Ok(raw)) => self.status(raw, elem_size, check).err(),
                            Some(Err(err)) => Some(self.comm.localize(err)),
                            None => None,
                        };
                        first_err = checked;
                        continue;
                    }
                    Err(err) => first_err = Some(self.comm.localize(err.settled())),
                }
            }
            e.discard(id);
        }
        *self.comm.sh.spare_pending.borrow_mut() = ids;
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Scope<'_, '_> {
    fn drop(&mut self) {
        // Only reached with pending requests when the closure panicked: withdraw
        // them so no later progress targets the buffers being retired.
        let ids = std::mem::take(self.pending.get_mut());
        if ids.is_empty() {
            return;
        }
        match self.comm.sh.engine.try_borrow_mut() {
            Ok(mut e) => {
                for (id, _, _) in ids {
                    e.discard(id);
                }
            }
            Err(_) => {
                // A frame further out holds the engine (a handler that panicked
                // inside progress): the requests cannot be withdrawn, and a device
                // or a peer may still write into the buffers this scope is about
                // to give back. Only stopping the process is sound (as the lend
                // table does when it cannot retire its loans).
                eprintln!(
                    "fmx: a scope with {} pending operations unwound while the progress engine was in use; \
                     aborting: their buffers could not be withdrawn from the transport",
                    ids.len()
                );
                std::process::abort();
            }
        }
    }
}
