//! Communicators: a group of processes with an isolated tag space.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytemuck::Pod;
use fmx_transport::lend::LendTable;

use crate::bootstrap::Bootstrap;
use crate::engine::{Engine, Members, RawStatus, WaitsOn};
use crate::error::{Error, Result};
use crate::scope::Scope;
use crate::status::{Source, Status, Tag, TAG_UB};

/// State shared by every communicator of the process.
pub(crate) struct Shared {
    pub(crate) engine: RefCell<Engine>,
    pub(crate) lend: RefCell<LendTable>,
    pub(crate) boot: RefCell<Bootstrap>,
    pub(crate) finalized: Cell<bool>,
    /// An active-message handler is running: blocking calls are refused.
    pub(crate) in_handler: Cell<bool>,
    /// Highest context id in use by this process (contexts come in pairs).
    pub(crate) max_ctx: Cell<u32>,
    /// `FMX_CHECK=collectives`: every collective agrees on its call first.
    pub(crate) check_colls: bool,
    /// Inside a collective (the collectives it calls are not checked again).
    pub(crate) in_coll: Cell<bool>,
    /// An emptied list of a finished scope's requests, reused by the next
    /// scope (a window of 64 sends per scope would otherwise grow a new one).
    pub(crate) spare_pending: RefCell<crate::scope::PendingList>,
}

impl Shared {
    pub(crate) fn check_live(&self, what: &'static str) -> Result<()> {
        if self.finalized.get() {
            Err(Error::Finalized(what))
        } else if self.in_handler.get() {
            Err(Error::InHandler(what))
        } else {
            Ok(())
        }
    }
}

thread_local! {
    /// Every engine of this process (its world, and a bridge while two worlds are joined).
    static ENGINES: RefCell<Vec<std::rc::Weak<Shared>>> = const { RefCell::new(Vec::new()) };
}

/// Makes `sh` one of the engines a waiting engine progresses.
pub(crate) fn register_engine(sh: &Rc<Shared>) {
    ENGINES.with(|v| {
        let mut v = v.borrow_mut();
        v.retain(|w| w.strong_count() > 0);
        v.push(Rc::downgrade(sh));
    });
    sh.engine.borrow_mut().set_idle_hook(progress_other_engines);
}

/// Progresses every engine not in use right now (the waiting one is borrowed,
/// so it is skipped). Errors stay for the engine's own next call to report.
fn progress_other_engines() {
    ENGINES.with(|v| {
        let Ok(v) = v.try_borrow() else { return };
        if v.len() < 2 {
            return;
        }
        for sh in v.iter().filter_map(std::rc::Weak::upgrade) {
            if sh.finalized.get() {
                continue;
            }
            if let (Ok(mut e), Ok(mut lend)) = (sh.engine.try_borrow_mut(), sh.lend.try_borrow_mut()) {
                let _ = e.progress(&mut lend);
            }
        }
    });
}

pub(crate) const NOT_MEMBER: u32 = u32::MAX;

/// What [`Comm::try_send`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendAttempt {
    /// The message is in the receiver's slot.
    Sent,
    /// No credit toward the destination now (or earlier sends to it still wait).
    Backpressure,
    /// FM's send rule forbids it yet: the destination has a larger ID and has not sent to us.
    NotAllowed,
}

/// An intra-communicator: ranks `0..size`, point-to-point and collectives.
///
/// Each communicator has two contexts, one for point-to-point and one for
/// its collectives, so user messages never match collective traffic and
/// communicators never see each other's messages.
pub struct Comm {
    pub(crate) sh: Rc<Shared>,
    pub(crate) ctx: u32,
    pub(crate) rank: u32,
    /// Communicator rank -> world rank.
    pub(crate) members: Members,
    /// World rank -> communicator rank (or `NOT_MEMBER`).
    pub(crate) world_to_comm: Rc<[u32]>,
    /// The topology attached (only a [`crate::DistGraphComm`]'s own communicator has one).
    pub(crate) topology: Topology,
    /// Collectives called on this communicator so far (the checking mode compares them).
    pub(crate) coll_calls: Cell<u64>,
}

/// The topology of a communicator, as `MPI_Topo_test` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// None (`MPI_UNDEFINED`).
    Undefined,
    /// A distributed graph (`MPI_DIST_GRAPH`): the communicator of a [`crate::DistGraphComm`].
    DistGraph,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("ctx", &self.ctx).field("rank", &self.rank).field("size", &self.size()).finish()
    }
}

impl Comm {
    pub(crate) fn new(sh: Rc<Shared>, ctx: u32, members: Vec<u32>, world_size: u32) -> Self {
        let me = sh.engine.borrow().world_rank();
        let mut world_to_comm = vec![NOT_MEMBER; world_size as usize];
        for (r, &w) in members.iter().enumerate() {
            world_to_comm[w as usize] = r as u32;
        }
        let rank = world_to_comm[me as usize];
        sh.max_ctx.set(sh.max_ctx.get().max(ctx + 1));
        Self {
            sh,
            ctx,
            rank,
            members: members.into(),
            world_to_comm: world_to_comm.into(),
            topology: Topology::Undefined,
            coll_calls: Cell::new(0),
        }
    }

    /// The topology attached to this communicator (`MPI_Topo_test`): a
    /// [`crate::DistGraphComm`] reports [`Topology::DistGraph`], through a
    /// `&Comm` too.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of processes.
    pub fn size(&self) -> u32 {
        self.members.len() as u32
    }

    /// The world rank of communicator rank `r`.
    pub fn world_rank_of(&self, r: u32) -> Option<u32> {
        self.members.get(r as usize).copied()
    }

    /// Name of the transport under this communicator (`shm+verbs`,
    /// `shm+ofi` when peers on this node and on others use different ones).
    pub fn transport_name(&self) -> &'static str {
        self.sh.engine.borrow().tp.name()
    }

    /// The transport that carries messages to rank `r` of this communicator:
    /// `shm` to a rank of this node and `verbs` or `ofi` to another node's
    /// under a mixed transport; [`Comm::transport_name`] otherwise.
    pub fn transport_of(&self, r: u32) -> Result<&'static str> {
        let w = self.world_rank_of(r).ok_or_else(|| Error::InvalidRank { what: "transport_of", rank: i64::from(r), size: self.size() })?;
        Ok(self.sh.engine.borrow().tp.name_of(w))
    }

    /// Whether the connection to rank `r` is made by the first message
    /// between us (`FMX_CONNECT=lazy`) rather than during init.
    pub fn connects_on_demand(&self, r: u32) -> Result<bool> {
        use fmx_transport::Endpoint;
        let w = self.world_rank_of(r).ok_or_else(|| Error::InvalidRank {
            what: "connects_on_demand",
            rank: i64::from(r),
            size: self.size(),
        })?;
        Ok(self.sh.engine.borrow().tp.connects_on_demand(w))
    }

    /// How messages above the eager limit move on this transport (for
    /// example whether shared memory copies once, by cross-memory attach, or
    /// twice, through the segments where the kernel refuses it).
    pub fn large_message_path(&self) -> String {
        use fmx_transport::Endpoint;
        self.sh.engine.borrow().tp.large_message_path()
    }

    pub(crate) fn check_rank(&self, what: &'static str, r: u32) -> Result<u32> {
        self.members.get(r as usize).copied().ok_or(Error::InvalidRank { what, rank: i64::from(r), size: self.size() })
    }

    pub(crate) fn check_tag(tag: i32) -> Result<u32> {
        u32::try_from(tag).map_err(|_| Error::InvalidTag { tag: i64::from(tag), max: TAG_UB as u32 })
    }

    pub(crate) fn source_filter(&self, src: Source) -> Result<(Option<u32>, WaitsOn)> {
        match src {
            Source::Any => Ok((None, WaitsOn::AnyOf(self.members.clone()))),
            Source::Rank(r) => {
                let w = self.check_rank("receive source", r)?;
                Ok((Some(w), WaitsOn::Peer(w)))
            }
        }
    }

    pub(crate) fn tag_filter(tag: Tag) -> Result<Option<u32>> {
        match tag {
            Tag::Any => Ok(None),
            Tag::Value(t) => Self::check_tag(t).map(Some),
        }
    }

    /// Turns an engine status into the user's, in this communicator's ranks.
    pub(crate) fn status(&self, raw: RawStatus, elem_size: usize) -> Result<Status> {
        let source = self.world_to_comm.get(raw.src as usize).copied().unwrap_or(NOT_MEMBER);
        if raw.sent > raw.capacity {
            return Err(Error::Truncated { source_rank: source, tag: raw.tag, sent: raw.sent, capacity: raw.capacity });
        }
        let elem = elem_size.max(1) as u64;
        if raw.sent % elem != 0 {
            return Err(Error::PartialElement { source_rank: source, bytes: raw.sent, elem_size });
        }
        Ok(Status { source, tag: raw.tag as i32, count: (raw.sent / elem) as usize, bytes: raw.sent })
    }

    /// Rewrites world ranks in an error into this communicator's ranks.
    pub(crate) fn localize(&self, e: Error) -> Error {
        match e {
            Error::PeerGone { world_rank, during, reason, pending, .. } => Error::PeerGone {
                rank: self.world_to_comm.get(world_rank as usize).copied().unwrap_or(NOT_MEMBER),
                world_rank,
                during,
                reason,
                pending,
            },
            e => e,
        }
    }

    /// Runs `f` with a [`Scope`] in which non-blocking operations may borrow
    /// buffers; every operation started in the scope is complete when `scope`
    /// returns (even if the closure returned early with an error).
    pub fn scope<'env, R>(&self, f: impl for<'s> FnOnce(&'s Scope<'s, 'env>) -> Result<R>) -> Result<R> {
        self.sh.check_live("scope")?;
        fmx_transport::lend::lend_scope(&self.sh.lend, |lender| {
            let scope = Scope::new(self, lender);
            let r = f(&scope);
            let fin = scope.finish();
            let r = r?;
            fin?;
            Ok(r)
        })
    }

    /// Sends an eager-sized message now if the credits and FM's send rule allow,
    /// without queueing it; otherwise says why not (the data is not sent).
    pub fn try_send<T: Pod>(&self, buf: &[T], dest: u32, tag: i32) -> Result<SendAttempt> {
        self.sh.check_live("try_send")?;
        let tag = Self::check_tag(tag)?;
        let w = self.check_rank("send destination", dest)?;
        let out = self.sh.engine.borrow_mut().try_send_now(self.ctx, tag, w, bytemuck::cast_slice(buf))?;
        Ok(match out {
            fmx_transport::SendOutcome::Sent => SendAttempt::Sent,
            fmx_transport::SendOutcome::Backpressure => SendAttempt::Backpressure,
            fmx_transport::SendOutcome::NotAllowed => SendAttempt::NotAllowed,
        })
    }

    /// Blocking send (returns when `buf` may be reused).
    pub fn send<T: Pod>(&self, buf: &[T], dest: u32, tag: i32) -> Result<()> {
        let tag = Self::check_tag(tag)?;
        self.send_on(self.ctx, buf, dest, tag)
    }

    pub(crate) fn send_on<T: Pod>(&self, ctx: u32, buf: &[T], dest: u32, tag: u32) -> Result<()> {
        self.sh.check_live("send")?;
        let w = self.check_rank("send destination", dest)?;
        if self.sh.engine.borrow_mut().send_inline(ctx, tag, w, bytemuck::cast_slice(buf)).map_err(|err| self.localize(err))? {
            return Ok(());
        }
        // The fast path of `scope` + `isend` + `wait`, without the scope's bookkeeping.
        fmx_transport::lend::lend_scope(&self.sh.lend, |lender| {
            let lent = lender.lend(bytemuck::cast_slice(buf));
            let mut e = self.sh.engine.borrow_mut();
            let mut lend = self.sh.lend.borrow_mut();
            let id = e.start_send(&lend, ctx, tag, w, lent).map_err(|err| self.localize(err))?;
            self.finish_blocking(&mut e, &mut lend, id, std::mem::size_of::<T>()).map(drop)
        })
    }

    /// Blocking receive; the status tells the source, tag and count.
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: impl Into<Source>, tag: impl Into<Tag>) -> Result<Status> {
        self.recv_on(self.ctx, buf, src.into(), tag.into())
    }

    pub(crate) fn recv_on<T: Pod>(&self, ctx: u32, buf: &mut [T], src: Source, tag: Tag) -> Result<Status> {
        self.sh.check_live("recv")?;
        let (s, waits_on) = self.source_filter(src)?;
        let t = Self::tag_filter(tag)?;
        if let Some(raw) = self.sh.engine.borrow_mut().recv_arrived(ctx, s, t, bytemuck::cast_slice_mut(buf)) {
            return self.status(raw, std::mem::size_of::<T>());
        }
        fmx_transport::lend::lend_scope(&self.sh.lend, |lender| {
            let lent = lender.lend_mut(bytemuck::cast_slice_mut(buf));
            let mut e = self.sh.engine.borrow_mut();
            let mut lend = self.sh.lend.borrow_mut();
            let id = e.start_recv(&mut lend, ctx, s, t, lent, waits_on, false).map_err(|err| self.localize(err))?;
            self.finish_blocking(&mut e, &mut lend, id, std::mem::size_of::<T>())
        })
    }

    fn finish_blocking(&self, e: &mut Engine, lend: &mut LendTable, id: crate::engine::ReqId, elem_size: usize) -> Result<Status> {
        if let Err(err) = e.wait(lend, id) {
            e.discard(id);
            return Err(self.localize(err.settled()));
        }
        match e.take(id) {
            Some(Ok(raw)) => self.status(raw, elem_size),
            Some(Err(err)) => Err(self.localize(err)),
            None => Err(Error::StaleRequest(id.index())),
        }
    }

    /// Sends `sbuf` to `dest` and receives into `rbuf` from `src` at once (no deadlock).
    pub fn sendrecv<T: Pod, U: Pod>(
        &self,
        sbuf: &[T],
        dest: u32,
        stag: i32,
        rbuf: &mut [U],
        src: impl Into<Source>,
        rtag: impl Into<Tag>,
    ) -> Result<Status> {
        let (src, rtag) = (src.into(), rtag.into());
        self.scope(|s| {
            let r = s.irecv(rbuf, src, rtag)?;
            let w = s.isend(sbuf, dest, stag)?;
            s.wait(w)?;
            s.wait(r)
        })
    }

    /// Status of the next message that a receive of (`src`, `tag`) would take, without taking it; `None` if none arrived yet.
    pub fn iprobe(&self, src: impl Into<Source>, tag: impl Into<Tag>) -> Result<Option<Status>> {
        self.sh.check_live("iprobe")?;
        let (s, _) = self.source_filter(src.into())?;
        let t = Self::tag_filter(tag.into())?;
        let raw = self.sh.engine.borrow_mut().probe(&mut self.sh.lend.borrow_mut(), self.ctx, s, t)?;
        raw.map(|r| self.status(r, 1)).transpose()
    }

    /// Waits until a message that a receive of (`src`, `tag`) would take is there; its status (count in bytes).
    pub fn probe(&self, src: impl Into<Source>, tag: impl Into<Tag>) -> Result<Status> {
        let (src, tag) = (src.into(), tag.into());
        let (_, waits_on) = self.source_filter(src)?;
        self.retry_until(&waits_on, "probing", || self.iprobe(src, tag))
    }

    /// Calls `attempt` (which drives progress) until it gives a value: spins
    /// a little, then yields the core, and checks the peers of `waits_on`
    /// every 20 ms of trying, so that a departed peer or the job's failure
    /// ends the wait with an error (after one last attempt: what the peer
    /// sent before going may have arrived).
    pub(crate) fn retry_until<T>(&self, waits_on: &WaitsOn, during: &str, mut attempt: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        let mut spins = 0u32;
        let mut last_check = std::time::Instant::now();
        loop {
            if let Some(v) = attempt()? {
                return Ok(v);
            }
            spins += 1;
            if spins < 64 {
                continue;
            }
            std::thread::yield_now();
            if last_check.elapsed() >= std::time::Duration::from_millis(20) {
                last_check = std::time::Instant::now();
                let blocked = self.sh.engine.borrow_mut().blocked(waits_on, during);
                if let Some(e) = blocked {
                    self.sh.engine.borrow_mut().progress_all(&mut self.sh.lend.borrow_mut())?;
                    return attempt()?.ok_or_else(|| self.localize(e));
                }
            }
        }
    }

    /// Drives progress once (FM's extract): useful while computing.
    pub fn progress(&self) -> Result<usize> {
        self.sh.check_live("progress")?;
        self.sh.engine.borrow_mut().progress(&mut self.sh.lend.borrow_mut())
    }

    /// A context id pair agreed by all members (a collective over this communicator).
    pub(crate) fn agree_context(&self) -> Result<u32> {
        let mine = [self.sh.max_ctx.get() + 1];
        let mut agreed = [0u32];
        self.allreduce(&mine, &mut agreed, crate::coll::Op::Max)?;
        // Even numbers start a pair: agreed is max_ctx+1 of someone, max_ctx is odd.
        let ctx = agreed[0].next_multiple_of(2);
        self.sh.max_ctx.set(ctx + 1);
        Ok(ctx)
    }

    /// A communicator with the same group and a fresh, isolated tag space
    /// (collective). It carries no topology: a graph communicator's dup is
    /// [`crate::DistGraphComm::dup`], which keeps it (`g.dup()` calls that one).
    pub fn dup(&self) -> Result<Comm> {
        self.sh.check_live("dup")?;
        let ctx = self.agree_context()?;
        Ok(Comm {
            sh: self.sh.clone(),
            ctx,
            rank: self.rank,
            members: self.members.clone(),
            world_to_comm: self.world_to_comm.clone(),
            topology: Topology::Undefined,
            coll_calls: Cell::new(0),
        })
    }

    /// Splits by `color` (ranks with equal color form a communicator, ordered by
    /// `key`, then old rank); `None` as color (`MPI_UNDEFINED`) gets `None` (collective).
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>> {
        self.sh.check_live("split")?;
        let ctx = self.agree_context()?;
        let mine: [i64; 2] = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * self.size() as usize];
        self.allgather(&mine, &mut all)?;
        let Some(c) = color else { return Ok(None) };
        let mut group: Vec<(i64, u32)> =
            (0..self.size()).filter(|&r| all[2 * r as usize] == i64::from(c)).map(|r| (all[2 * r as usize + 1], r)).collect();
        group.sort_unstable();
        let members = group.iter().map(|&(_, r)| self.members[r as usize]).collect();
        let world_size = self.world_to_comm.len() as u32;
        Ok(Some(Comm::new(self.sh.clone(), ctx, members, world_size)))
    }

    /// Collective context of this communicator.
    pub(crate) fn coll_ctx(&self) -> u32 {
        self.ctx + 1
    }
}
