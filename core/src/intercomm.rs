//! Intercommunicators: two disjoint groups, each addressing the other's ranks.
//!
//! Point-to-point messages go to *remote* ranks; a private intra-communicator
//! of the local group carries the local half of the collectives. Inside,
//! the remote side is a [`Comm`] whose members are the remote group (this
//! process is not one of them), so matching, probing and the scoped
//! non-blocking calls work unchanged, with statuses in remote ranks.
//!
//! An intercommunicator comes from [`Comm::intercomm_create`] (two groups of
//! one world, as `MPI_Intercomm_create`), or from [`crate::Fmx::spawn_world`] and
//! [`crate::Fmx::parent`] (two worlds joined by a bridge that fmxrun serves).

use std::rc::Rc;

use bytemuck::Pod;

use crate::coll::util::{recv, send, tag};
use crate::comm::{Comm, Shared};
use crate::error::{Error, Result};
use crate::scope::Scope;
use crate::status::{Source, Status, Tag};

/// Context ids an intercommunicator takes: point-to-point, its internal
/// exchanges, the local group's pair, and a pair for `merge`'s agreement.
const CONTEXTS: u32 = 6;

/// An intercommunicator.
pub struct Intercomm {
    /// The remote group, addressed by remote rank (context `ctx`, collectives `ctx + 1`).
    remote: Comm,
    /// The local group (contexts `ctx + 2`, `ctx + 3`).
    local: Comm,
    ctx: u32,
    /// The bridge between two worlds, closed when this is freed.
    bridge: Option<Bridge>,
    /// Which world this process is in, for a reconfiguration's intercommunicator.
    side: Option<Side>,
}

/// The two sides of a spawn's intercommunicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The world that spawned (and is leaving, in a reconfiguration).
    Old,
    /// The spawned world.
    New,
}

impl std::fmt::Debug for Intercomm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercomm")
            .field("rank", &self.rank())
            .field("local_size", &self.local_size())
            .field("remote_size", &self.remote_size())
            .finish()
    }
}

/// The engine and bootstrap two worlds share while they are connected.
pub(crate) struct Bridge {
    pub(crate) sh: Rc<Shared>,
}

impl Bridge {
    /// Closes the bridge: every process of both worlds waits here, so the
    /// leaving world cannot go before the new one has received everything.
    fn close(&self) -> Result<()> {
        crate::finalize_shared(&self.sh)
    }
}

impl Intercomm {
    /// Builds one from the groups' ranks in `sh`'s engine and an agreed context base.
    pub(crate) fn from_groups(sh: &Rc<Shared>, ctx: u32, local: Vec<u32>, remote: Vec<u32>, bridge: Option<(Bridge, Side)>) -> Self {
        let n = sh.boot.borrow().size();
        let remote = Comm::new(sh.clone(), ctx, remote, n);
        let local = Comm::new(sh.clone(), ctx + 2, local, n);
        sh.max_ctx.set(sh.max_ctx.get().max(ctx + CONTEXTS - 1));
        let (bridge, side) = bridge.map_or((None, None), |(b, s)| (Some(b), Some(s)));
        Self { remote, local, ctx, bridge, side }
    }

    /// Old or new world, for an intercommunicator between two worlds.
    pub fn side(&self) -> Option<Side> {
        self.side
    }

    /// The remote group as a communicator this process is not in.
    pub(crate) fn remote(&self) -> &Comm {
        &self.remote
    }

    /// This process's rank in the local group.
    pub fn rank(&self) -> u32 {
        self.local.rank()
    }

    /// Size of the local group.
    pub fn local_size(&self) -> u32 {
        self.local.size()
    }

    /// Size of the remote group.
    pub fn remote_size(&self) -> u32 {
        self.remote.size()
    }

    /// The local group's members: their ranks in the world both groups share
    /// (from [`Comm::intercomm_create`]), or in their own world (from a spawn:
    /// `0..local_size`).
    pub fn local_group(&self) -> Vec<u32> {
        self.group(&self.local)
    }

    /// The remote group's members, numbered as in [`Intercomm::local_group`].
    pub fn remote_group(&self) -> Vec<u32> {
        self.group(&self.remote)
    }

    /// A bridge numbers the old world first, then the new one: each group is
    /// a contiguous range, which its own world numbers from zero.
    fn group(&self, c: &Comm) -> Vec<u32> {
        let base = if self.bridge.is_some() { c.members.first().copied().unwrap_or(0) } else { 0 };
        c.members.iter().map(|&m| m - base).collect()
    }

    /// The local group as an intra-communicator (private to this intercommunicator).
    pub fn local_comm(&self) -> &Comm {
        &self.local
    }

    /// Name of the transport under this intercommunicator.
    pub fn transport_name(&self) -> &'static str {
        self.remote.transport_name()
    }

    /// Blocking send to remote rank `dest`.
    pub fn send<T: Pod>(&self, buf: &[T], dest: u32, tag: i32) -> Result<()> {
        self.remote.send(buf, dest, tag).map_err(Self::name_remote)
    }

    /// Blocking receive from a remote rank; the status's source is a remote rank.
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: impl Into<Source>, tag: impl Into<Tag>) -> Result<Status> {
        self.remote.recv(buf, src, tag).map_err(Self::name_remote)
    }

    /// Sends to one remote rank and receives from one at once.
    pub fn sendrecv<T: Pod, U: Pod>(
        &self,
        sbuf: &[T],
        dest: u32,
        stag: i32,
        rbuf: &mut [U],
        src: impl Into<Source>,
        rtag: impl Into<Tag>,
    ) -> Result<Status> {
        self.remote.sendrecv(sbuf, dest, stag, rbuf, src, rtag).map_err(Self::name_remote)
    }

    /// Status of the next matching message from the remote group, if one arrived.
    pub fn iprobe(&self, src: impl Into<Source>, tag: impl Into<Tag>) -> Result<Option<Status>> {
        self.remote.iprobe(src, tag)
    }

    /// A scope for non-blocking operations (`isend`/`irecv` address remote ranks).
    pub fn scope<'env, R>(&self, f: impl for<'s> FnOnce(&'s Scope<'s, 'env>) -> Result<R>) -> Result<R> {
        self.remote.scope(f).map_err(Self::name_remote)
    }

    /// Blocks until every process of both groups has entered.
    pub fn barrier(&self) -> Result<()> {
        self.local.barrier()?;
        if self.local.rank() == 0 {
            send::<u8>(&self.remote, &[], 0, tag::BARRIER)?;
            recv::<u8>(&self.remote, &mut [], 0, tag::BARRIER)?;
        }
        self.local.barrier()
    }

    /// An intra-communicator of both groups (collective over both): the group
    /// that passes `high = false` comes first; if both pass the same, the
    /// group whose leader has the lower process number does.
    pub fn merge(&self, high: bool) -> Result<Comm> {
        // The leaders swap (high, leader's process number); the local group learns the remote's.
        let me = self.local.world_rank_of(0).expect("a group has a leader");
        let mut theirs = [0u32; 2];
        if self.local.rank() == 0 {
            send(&self.remote, &[u32::from(high), me], 0, tag::ALLGATHER)?;
            recv(&self.remote, &mut theirs, 0, tag::ALLGATHER)?;
        }
        self.local.bcast(&mut theirs, 0)?;
        let mine = [u32::from(high), me];
        let we_first = (mine[0], mine[1]) < (theirs[0], theirs[1]);
        let (a, b) = if we_first { (&self.local, &self.remote) } else { (&self.remote, &self.local) };
        let members: Vec<u32> = a.members.iter().chain(b.members.iter()).copied().collect();
        let n = self.remote.world_to_comm.len() as u32;
        // The merge's own pair agrees on a fresh context for the result.
        Comm::new(self.remote.sh.clone(), self.ctx + 4, members, n).dup()
    }

    /// Frees it; for two worlds, waits until both have freed it (collective).
    pub fn free(mut self) -> Result<()> {
        self.close()
    }

    /// Drops it without closing the bridge (after an error: the other world
    /// may never arrive there; fmxrun ends the job when this process exits).
    pub(crate) fn abandon(mut self) {
        if let Some(b) = self.bridge.take() {
            b.sh.finalized.set(true);
        }
    }

    fn close(&mut self) -> Result<()> {
        if self.bridge.is_none() {
            return Ok(());
        }
        // No process finalizes the bridge's endpoint before every process
        // has reached here, so before every message on it was received: a
        // finalized peer reads as gone to a receive still waiting on it, and
        // over verbs between two kernels its last word was seen ahead of a
        // message it had sent before (the two-kernel cluster's malleable run).
        let settled = self.barrier();
        let b = self.bridge.take().expect("checked above");
        if let Err(e) = settled {
            b.sh.finalized.set(true);
            return Err(e);
        }
        b.close()
    }

    /// Errors name the remote group, so a dead peer reads as "remote rank r".
    pub(crate) fn name_remote(e: Error) -> Error {
        match e {
            Error::PeerGone { rank, world_rank, during, reason, pending } => Error::PeerGone {
                rank,
                world_rank,
                during: format!("{during} (over an intercommunicator; {rank} is a remote rank)"),
                reason,
                pending,
            },
            e => e,
        }
    }
}

impl Drop for Intercomm {
    /// Closes the bridge, except while the thread panics: the process is
    /// failing, and the other world may wait for it (fmxrun tells it).
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(b) = self.bridge.take() {
                crate::abort_shared(&b.sh, crate::PANIC_EXIT_CODE, "panicked");
            }
        } else {
            let _ = self.close();
        }
    }
}

impl Comm {
    /// Creates an intercommunicator between this communicator's group and a
    /// disjoint one (as `MPI_Intercomm_create`, collective over both groups):
    /// `local_leader` (a rank here) and `remote_leader` (a rank of `peer`)
    /// exchange their groups over `peer` with `tag`.
    pub fn intercomm_create(&self, local_leader: u32, peer: &Comm, remote_leader: u32, tag: i32) -> Result<Intercomm> {
        const OP: &str = "intercomm_create";
        self.sh.check_live(OP)?;
        if !Rc::ptr_eq(&self.sh, &peer.sh) {
            return Err(Error::Intercomm { op: OP, detail: "the peer communicator belongs to another fmx instance".into() });
        }
        if local_leader >= self.size() {
            return Err(Error::InvalidRank { what: "intercomm_create: local leader", rank: i64::from(local_leader), size: self.size() });
        }
        // Everyone checks its arguments against the leader's (a mismatch would hang).
        let mut args = [local_leader, remote_leader, tag as u32];
        self.bcast(&mut args, local_leader)?;
        if args != [local_leader, remote_leader, tag as u32] {
            return Err(Error::CollectiveMismatch {
                op: OP,
                detail: format!(
                    "rank {} passed (local leader {local_leader}, remote leader {remote_leader}, tag {tag}) but the leader passed \
                     (local leader {}, remote leader {}, tag {})",
                    self.rank(),
                    args[0],
                    args[1],
                    args[2] as i32
                ),
            });
        }
        // A context base free in this group; the leaders take the larger of both groups'.
        let mut ctx = [self.sh.max_ctx.get() + 1];
        let local_max = ctx;
        self.allreduce(&local_max, &mut ctx, crate::Op::Max)?;
        // The leader's findings: 0 or an error code, remote group's size, agreed context base.
        let mut header = [0u32; 3];
        let mut remote = Vec::new();
        if self.rank() == local_leader {
            header = self.exchange_groups(peer, remote_leader, tag, ctx[0], &mut remote)?;
        }
        self.bcast(&mut header, local_leader)?;
        match header[0] {
            0 => {}
            1 => {
                return Err(Error::InvalidRank {
                    what: "intercomm_create: remote leader (in the peer communicator)",
                    rank: i64::from(remote_leader),
                    size: peer.size(),
                })
            }
            _ => {
                return Err(Error::Intercomm {
                    op: OP,
                    detail: format!("the remote leader (peer rank {remote_leader}) is in the local group; the groups must be disjoint"),
                })
            }
        }
        remote.resize(header[1] as usize, 0);
        self.bcast(&mut remote, local_leader)?;
        if let Some(&w) = remote.iter().find(|w| self.world_to_comm.get(**w as usize).is_some_and(|&r| r != crate::comm::NOT_MEMBER)) {
            return Err(Error::Intercomm {
                op: OP,
                detail: format!(
                    "process {w} is in both groups (local rank {}); the groups must be disjoint",
                    self.world_to_comm[w as usize]
                ),
            });
        }
        let base = header[2].next_multiple_of(2);
        Ok(Intercomm::from_groups(&self.sh, base, self.members.to_vec(), remote, None))
    }

    /// The local leader's half: checks the remote leader, swaps groups and
    /// context bases with it. Argument errors come back as a code so that the
    /// whole local group reports them.
    fn exchange_groups(&self, peer: &Comm, remote_leader: u32, tag: i32, ctx: u32, remote: &mut Vec<u32>) -> Result<[u32; 3]> {
        if remote_leader >= peer.size() {
            return Ok([1, 0, 0]);
        }
        let leader = peer.members[remote_leader as usize];
        if self.world_to_comm.get(leader as usize).is_some_and(|&r| r != crate::comm::NOT_MEMBER) {
            return Ok([2, 0, 0]);
        }
        // Sizes first, then the groups: both leaders send at once, so neither
        // may block in a send the other has not yet posted a receive for.
        let mut theirs = [0u32; 2];
        peer.sendrecv(&[self.size(), ctx], remote_leader, tag, &mut theirs, remote_leader, tag)?;
        remote.resize(theirs[0] as usize, 0);
        let st = peer.sendrecv(&self.members[..], remote_leader, tag, &mut remote[..], remote_leader, tag)?;
        if st.count != remote.len() {
            return Err(Error::Intercomm {
                op: "intercomm_create",
                detail: format!("the remote leader (peer rank {remote_leader}) announced {} processes but sent {}", remote.len(), st.count),
            });
        }
        Ok([0, theirs[0], ctx.max(theirs[1])])
    }
}
