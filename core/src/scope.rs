//! Non-blocking operations on borrowed buffers, completed by their scope.

use std::cell::RefCell;
use std::marker::PhantomData;

use bytemuck::Pod;
use fmx_transport::lend::Lender;

use crate::comm::Comm;
use crate::engine::{ReqId, WaitsOn};
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
    _scope: PhantomData<&'s mut &'s ()>,
}

/// Where non-blocking operations live; see [`Comm::scope`].
///
/// Buffers given to `isend`/`irecv` stay borrowed until the scope ends, and
/// the scope does not end before every operation started in it is complete
/// (like `std::thread::scope`), so a request can be leaked with
/// `mem::forget` without any unsoundness.
pub struct Scope<'s, 'env> {
    comm: &'s Comm,
    lender: &'s Lender<'s, 'env>,
    pending: RefCell<Vec<ReqId>>,
}

impl<'s, 'env> Scope<'s, 'env> {
    pub(crate) fn new(comm: &'s Comm, lender: &'s Lender<'s, 'env>) -> Self {
        Self { comm, lender, pending: RefCell::new(Vec::new()) }
    }

    /// The communicator.
    pub fn comm(&self) -> &'s Comm {
        self.comm
    }

    fn request(&self, id: ReqId, elem_size: usize) -> Request<'s> {
        self.pending.borrow_mut().push(id);
        Request { id, elem_size, _scope: PhantomData }
    }

    /// Starts sending `buf` to `dest`.
    pub fn isend<T: Pod>(&self, buf: &'env [T], dest: u32, tag: i32) -> Result<Request<'s>> {
        self.comm.sh.check_live("isend")?;
        let tag = Comm::check_tag(tag)?;
        self.isend_ctx(self.comm.ctx, buf, dest, tag)
    }

    pub(crate) fn isend_ctx<T: Pod>(&self, ctx: u32, buf: &'env [T], dest: u32, tag: u32) -> Result<Request<'s>> {
        let w = self.comm.check_rank("send destination", dest)?;
        let lent = self.lender.lend(bytemuck::cast_slice(buf));
        let id = {
            let mut e = self.comm.sh.engine.borrow_mut();
            let lend = self.comm.sh.lend.borrow();
            e.start_send(&lend, ctx, tag, w, lent)
        }
        .map_err(|e| self.comm.localize(e))?;
        Ok(self.request(id, std::mem::size_of::<T>()))
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
        let lent = self.lender.lend_mut(bytemuck::cast_slice_mut(buf));
        let id = {
            let mut e = self.comm.sh.engine.borrow_mut();
            let mut lend = self.comm.sh.lend.borrow_mut();
            e.start_recv(&mut lend, ctx, src, tag, lent, waits_on)
        }
        .map_err(|e| self.comm.localize(e))?;
        Ok(self.request(id, std::mem::size_of::<T>()))
    }

    /// Receive from a known communicator rank on the collective context.
    pub(crate) fn irecv_coll<T: Pod>(&self, buf: &'env mut [T], src: u32, tag: u32) -> Result<Request<'s>> {
        let w = self.comm.check_rank("collective source", src)?;
        self.irecv_ctx(self.comm.coll_ctx(), buf, Some(w), Some(tag), WaitsOn::Peer(w))
    }

    /// Send to a communicator rank on the collective context.
    pub(crate) fn isend_coll<T: Pod>(&self, buf: &'env [T], dest: u32, tag: u32) -> Result<Request<'s>> {
        self.isend_ctx(self.comm.coll_ctx(), buf, dest, tag)
    }

    fn forget(&self, id: ReqId) -> Result<()> {
        let mut p = self.pending.borrow_mut();
        let i = p.iter().position(|&x| x == id).ok_or(Error::StaleRequest(id.index()))?;
        p.swap_remove(i);
        Ok(())
    }

    /// Waits for `req` and returns its status (for a send: our rank, the tag, the count sent).
    pub fn wait(&self, req: Request<'s>) -> Result<Status> {
        self.forget(req.id)?;
        let sh = &self.comm.sh;
        let raw = {
            let mut e = sh.engine.borrow_mut();
            let r = e.wait(&mut sh.lend.borrow_mut(), req.id);
            if let Err(err) = r {
                e.discard(req.id);
                return Err(self.comm.localize(err));
            }
            e.take(req.id).ok_or(Error::StaleRequest(req.id.index()))?
        };
        match raw {
            Ok(raw) => self.comm.status(raw, req.elem_size),
            Err(e) => Err(self.comm.localize(e)),
        }
    }

    /// Whether `req` is complete (drives progress once); `wait` then returns at once.
    pub fn test(&self, req: &Request<'s>) -> Result<bool> {
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
        loop {
            for i in 0..reqs.len() {
                if self.test(&reqs[i])? {
                    let r = reqs.swap_remove(i);
                    return self.wait(r).map(|s| (i, s));
                }
            }
            std::thread::yield_now();
        }
    }

    /// Completes everything still pending; called when the scope closes.
    pub(crate) fn finish(&self) -> Result<()> {
        let ids: Vec<ReqId> = std::mem::take(&mut *self.pending.borrow_mut());
        let sh = &self.comm.sh;
        let mut e = sh.engine.borrow_mut();
        let mut lend = sh.lend.borrow_mut();
        let mut first_err = None;
        for id in ids {
            if first_err.is_none() {
                match e.wait(&mut lend, id) {
                    Ok(()) => {
                        if let Some(Err(err)) = e.take(id) {
                            first_err = Some(self.comm.localize(err));
                        }
                        continue;
                    }
                    Err(err) => first_err = Some(self.comm.localize(err)),
                }
            }
            e.discard(id);
        }
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
        if let Ok(mut e) = self.comm.sh.engine.try_borrow_mut() {
            for id in ids {
                e.discard(id);
            }
        }
    }
}
