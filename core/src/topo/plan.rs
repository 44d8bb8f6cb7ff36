//! Persistent neighbourhood exchanges (MPI-4's `MPI_Neighbor_alltoallv_init`):
//! a plan built once owns registered send and receive buffers (one block per
//! edge, packed in neighbour order) and the resolved peers; each `start`
//! posts every receive and send straight from those buffers, `wait`
//! completes them. When every rank lists each peer's edges together (always
//! for `dist_graph_create`), all blocks between two processes travel as one
//! message: a 2-rank torus of degree 8 sends one message, not six. The plan allocates nothing per start: its request and
//! loan lists keep their capacity (the engine may still copy a message that
//! arrives before its receive is posted, as for any receive).

use bytemuck::Pod;
use fmx_transport::lend::Lent;

use super::create::prefix;
use super::neighbor::{groups, Group};
use super::DistGraphComm;
use crate::coll::util::tag;
use crate::engine::{ReqId, WaitsOn};
use crate::error::{Error, Result};
use crate::registered::Registered;

/// One edge of a plan: peer (communicator and world rank), block in elements.
#[derive(Clone, Copy, Debug)]
struct Edge {
    rank: u32,
    world: u32,
    count: usize,
    displ: usize,
}

/// One message of a plan: consecutive edges to (or from) one peer.
#[derive(Clone, Debug)]
struct Msg {
    group: Group,
    world: u32,
    /// Where its blocks start (they are packed back to back in the plan's buffers).
    displ: usize,
    count: usize,
}

/// The non-self edges as messages (one per peer run when `grouped`, else one per edge).
fn messages(edges: &[Edge], me: u32, grouped: bool) -> Vec<Msg> {
    let peers: Vec<(u32, u32)> = edges.iter().map(|e| (e.rank, 0)).collect();
    let parts: Vec<(usize, usize)> = edges.iter().map(|e| (e.count, e.displ)).collect();
    groups(&peers, &parts, me, grouped)
        .into_iter()
        .map(|g| Msg { world: edges[g.edges.start].world, displ: g.contiguous_at.unwrap_or(0), count: g.total, group: g })
        .collect()
}

/// A persistent `neighbor_alltoallv`; see [`DistGraphComm::neighbor_alltoallv_plan`].
pub struct NeighborPlan<'g, T: Pod> {
    graph: &'g DistGraphComm,
    ins: Vec<Edge>,
    outs: Vec<Edge>,
    /// (out-edge, in-edge) pairs of self-loops, copied locally at start.
    self_loops: Vec<(usize, usize)>,
    recv_msgs: Vec<Msg>,
    send_msgs: Vec<Msg>,
    /// `Some` until dropped (or leaked when the plan cannot be withdrawn).
    send: Option<Registered<T>>,
    recv: Option<Registered<T>>,
    /// In flight: (receive message index, or `usize::MAX` for a send; request).
    pending: Vec<(usize, ReqId)>,
    /// The requests of `pending`, for one wait over all (capacity kept).
    ids: Vec<ReqId>,
    lent: Vec<Lent>,
    in_flight: bool,
    /// An allgather plan: the caller fills out-edge 0's block, `start` copies
    /// it to the others.
    replicate: bool,
}

impl DistGraphComm {
    /// A persistent `neighbor_alltoall`: `count` elements along every edge.
    pub fn neighbor_alltoall_plan<T: Pod>(&self, count: usize) -> Result<NeighborPlan<'_, T>> {
        let (indeg, outdeg, _) = self.neighbors_count();
        self.neighbor_alltoallv_plan(&vec![count; outdeg], &vec![count; indeg])
    }

    /// A persistent `neighbor_allgather`: the caller fills one block of
    /// `count` elements (`send_mut`), every out-edge carries it.
    pub fn neighbor_allgather_plan<T: Pod>(&self, count: usize) -> Result<NeighborPlan<'_, T>> {
        let indeg = self.neighbors_count().0;
        self.neighbor_allgatherv_plan(count, &vec![count; indeg])
    }

    /// A persistent `neighbor_allgatherv`: one block of `count` elements to
    /// every out-edge, `rcounts[i]` from in-edge i.
    pub fn neighbor_allgatherv_plan<T: Pod>(&self, count: usize, rcounts: &[usize]) -> Result<NeighborPlan<'_, T>> {
        let outdeg = self.neighbors_count().1;
        let mut plan = self.neighbor_alltoallv_plan(&vec![count; outdeg], rcounts)?;
        plan.replicate = true;
        Ok(plan)
    }

    /// A persistent `neighbor_alltoallw` over bytes: `sbytes[j]` bytes along
    /// out-edge j, `rbytes[i]` from in-edge i (per-edge element types are the
    /// caller's to lay out in each block).
    pub fn neighbor_alltoallw_plan(&self, sbytes: &[usize], rbytes: &[usize]) -> Result<NeighborPlan<'_, u8>> {
        self.neighbor_alltoallv_plan(sbytes, rbytes)
    }

    /// A persistent `neighbor_alltoallv` with `scounts[j]` elements along
    /// out-edge j and `rcounts[i]` from in-edge i, blocks packed in edge
    /// order in the plan's registered buffers. Not collective: every rank
    /// builds its own plan, and all start them in the same order.
    pub fn neighbor_alltoallv_plan<T: Pod>(&self, scounts: &[usize], rcounts: &[usize]) -> Result<NeighborPlan<'_, T>> {
        const OP: &str = "neighbor_alltoallv_plan";
        self.comm.sh.check_live(OP)?;
        let (indeg, outdeg, _) = self.neighbors_count();
        if scounts.len() != outdeg || rcounts.len() != indeg {
            return Err(Error::InvalidGraph {
                op: OP,
                detail: format!(
                    "{} send counts for {outdeg} out-edges and {} receive counts for {indeg} in-edges",
                    scounts.len(),
                    rcounts.len()
                ),
            });
        }
        let edges = |list: &[(u32, u32)], counts: &[usize]| -> Result<Vec<Edge>> {
            let displs = prefix(counts);
            list.iter()
                .zip(counts.iter().zip(displs))
                .map(|(&(rank, _), (&count, displ))| Ok(Edge { rank, world: self.comm.check_rank(OP, rank)?, count, displ }))
                .collect()
        };
        let ins = edges(&self.ins, rcounts)?;
        let outs = edges(&self.outs, scounts)?;
        let me = self.comm.rank();
        let to_me: Vec<usize> = (0..outs.len()).filter(|&j| outs[j].rank == me).collect();
        let from_me: Vec<usize> = (0..ins.len()).filter(|&i| ins[i].rank == me).collect();
        let self_loops: Vec<(usize, usize)> = to_me.into_iter().zip(from_me).collect();
        for &(j, i) in &self_loops {
            if outs[j].count != ins[i].count {
                return Err(Error::InvalidGraph {
                    op: OP,
                    detail: format!("self-loop: out-edge {j} sends {} elements but in-edge {i} expects {}", outs[j].count, ins[i].count),
                });
            }
        }
        let send = Registered::new(&self.comm.sh, scounts.iter().sum())?;
        let recv = Registered::new(&self.comm.sh, rcounts.iter().sum())?;
        let recv_msgs = messages(&ins, me, self.grouped);
        let send_msgs = messages(&outs, me, self.grouped);
        Ok(NeighborPlan {
            graph: self,
            pending: Vec::with_capacity(recv_msgs.len() + send_msgs.len()),
            ids: Vec::with_capacity(recv_msgs.len() + send_msgs.len()),
            lent: Vec::with_capacity(recv_msgs.len() + send_msgs.len()),
            recv_msgs,
            send_msgs,
            ins,
            outs,
            self_loops,
            send: Some(send),
            recv: Some(recv),
            in_flight: false,
            replicate: false,
        })
    }
}

impl<T: Pod> NeighborPlan<'_, T> {
    fn send_buf(&mut self) -> &mut [T] {
        self.send.as_deref_mut().unwrap_or_default()
    }

    fn recv_buf(&mut self) -> &mut [T] {
        self.recv.as_deref_mut().unwrap_or_default()
    }

    fn idle(&self, what: &'static str) -> Result<()> {
        if self.in_flight {
            Err(Error::InvalidGraph { op: what, detail: "the plan is in flight: call wait() first".into() })
        } else {
            Ok(())
        }
    }

    /// The whole send buffer (out-edge j's block at [`NeighborPlan::send_displs`]`[j]`);
    /// for an allgather plan, the one block every out-edge carries.
    pub fn send_mut(&mut self) -> Result<&mut [T]> {
        self.idle("NeighborPlan::send_mut")?;
        if self.replicate {
            let n = self.outs.first().map_or(0, |e| e.count);
            return Ok(&mut self.send_buf()[..n]);
        }
        Ok(self.send_buf())
    }

    /// The whole receive buffer, as the last `wait` left it.
    pub fn recv(&self) -> Result<&[T]> {
        self.idle("NeighborPlan::recv")?;
        Ok(self.recv.as_deref().unwrap_or_default())
    }

    /// Out-edge j's block of the send buffer.
    pub fn send_block_mut(&mut self, j: usize) -> Result<&mut [T]> {
        self.idle("NeighborPlan::send_block_mut")?;
        let e = *self.outs.get(j).ok_or_else(|| Error::InvalidGraph {
            op: "NeighborPlan::send_block_mut",
            detail: format!("out-edge {j} of {}", self.outs.len()),
        })?;
        Ok(&mut self.send_buf()[e.displ..e.displ + e.count])
    }

    /// In-edge i's block of the receive buffer.
    pub fn recv_block(&self, i: usize) -> Result<&[T]> {
        self.idle("NeighborPlan::recv_block")?;
        let e = *self
            .ins
            .get(i)
            .ok_or_else(|| Error::InvalidGraph { op: "NeighborPlan::recv_block", detail: format!("in-edge {i} of {}", self.ins.len()) })?;
        Ok(&self.recv.as_deref().unwrap_or_default()[e.displ..e.displ + e.count])
    }

    /// Where each out-edge's block starts in the send buffer (elements).
    pub fn send_displs(&self) -> impl Iterator<Item = usize> + '_ {
        self.outs.iter().map(|e| e.displ)
    }

    /// Where each in-edge's block starts in the receive buffer (elements).
    pub fn recv_displs(&self) -> impl Iterator<Item = usize> + '_ {
        self.ins.iter().map(|e| e.displ)
    }

    /// Posts every receive and send of one exchange.
    pub fn start(&mut self) -> Result<()> {
        const OP: &str = "NeighborPlan::start";
        self.idle(OP)?;
        let comm = &self.graph.comm;
        comm.sh.check_live(OP)?;
        if self.replicate && self.outs.len() > 1 {
            let n = self.outs[0].count;
            let buf = self.send_buf();
            let (first, rest) = buf.split_at_mut(n);
            for block in rest.chunks_exact_mut(n.max(1)).take(if n == 0 { 0 } else { usize::MAX }) {
                block.copy_from_slice(first);
            }
        }
        let elem = std::mem::size_of::<T>();
        // Every loan derives from one base pointer per buffer, taken once.
        let rbase: *mut u8 = self.recv_buf().as_mut_ptr().cast();
        let sbase: *mut u8 = self.send_buf().as_mut_ptr().cast();
        let ctx = comm.coll_ctx();
        self.in_flight = true;
        let mut e = comm.sh.engine.borrow_mut();
        let mut lend = comm.sh.lend.borrow_mut();
        let mut started = Ok(());
        for (i, edge) in self.recv_msgs.iter().enumerate() {
            #[allow(unsafe_code)]
            // SAFETY: the block lies inside the receive buffer (displacements are
            // prefix sums of the counts it was sized by); the buffer is owned by the
            // plan, stays mapped until the plan drops, and is not touched through a
            // reference while the plan is in flight (every accessor checks `idle`);
            // the loan is retired in `wait`, on failure, or in `Drop`.
            let l = unsafe { lend.lend_owned(rbase.wrapping_add(edge.displ * elem), edge.count * elem, true) };
            self.lent.push(l);
            match e.start_recv(&mut lend, ctx, Some(edge.world), Some(tag::NEIGHBOR + 1), l, WaitsOn::Peer(edge.world), false) {
                Ok(id) => self.pending.push((i, id)),
                Err(err) => {
                    started = Err(comm.localize(err));
                    break;
                }
            }
        }
        if started.is_ok() {
            for edge in &self.send_msgs {
                #[allow(unsafe_code)]
                // SAFETY: as for the receive blocks; the send buffer is only read
                // through the loan while in flight (accessors check `idle`).
                let l = unsafe { lend.lend_owned(sbase.wrapping_add(edge.displ * elem), edge.count * elem, false) };
                self.lent.push(l);
                match e.start_send(&lend, ctx, tag::NEIGHBOR + 1, edge.world, l) {
                    Ok(id) => self.pending.push((usize::MAX, id)),
                    Err(err) => {
                        started = Err(comm.localize(err));
                        break;
                    }
                }
            }
        }
        if started.is_ok() {
            // Self-loops last, so the copies overlap the peers' transfers.
            for &(j, i) in &self.self_loops {
                let (o, n) = (self.outs[j], self.ins[i]);
                #[allow(unsafe_code)]
                // SAFETY: both ranges lie inside their buffers (prefix sums of the counts
                // they were sized by, and the counts are equal, checked at creation); the
                // buffers are distinct allocations; the receive range belongs to a
                // self-loop, so no loan covers it, and the send buffer is only read.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        sbase.wrapping_add(o.displ * elem).cast_const(),
                        rbase.wrapping_add(n.displ * elem),
                        o.count * elem,
                    );
                }
            }
        }
        if started.is_err() {
            for (_, id) in self.pending.drain(..) {
                e.discard(id);
            }
            for l in self.lent.drain(..) {
                lend.retire(l);
            }
            self.in_flight = false;
        }
        started
    }

    /// Completes the exchange started last; each in-edge must deliver exactly its block.
    pub fn wait(&mut self) -> Result<()> {
        const OP: &str = "NeighborPlan::wait";
        if !self.in_flight {
            return Err(Error::InvalidGraph { op: OP, detail: "wait() without a start()".into() });
        }
        let comm = &self.graph.comm;
        let elem = std::mem::size_of::<T>().max(1) as u64;
        let mut e = comm.sh.engine.borrow_mut();
        let mut lend = comm.sh.lend.borrow_mut();
        // One progress loop for the whole exchange; failures are sorted out below.
        self.ids.clear();
        self.ids.extend(self.pending.iter().map(|p| p.1));
        let all = e.wait_all(&mut lend, &self.ids);
        let mut first_err = all.err().map(|err| comm.localize(err));
        for (i, id) in self.pending.drain(..) {
            if first_err.is_some() {
                e.discard(id);
                continue;
            }
            if let Err(err) = e.wait(&mut lend, id) {
                e.discard(id);
                first_err = Some(comm.localize(err));
                continue;
            }
            match e.take(id) {
                Some(Ok(raw)) if i != usize::MAX && raw.sent != raw.capacity => {
                    let m = &self.recv_msgs[i];
                    let edges = m.group.name("in");
                    first_err = Some(Error::InvalidGraph {
                        op: OP,
                        detail: format!(
                            "{edges} (from rank {}) delivered {} elements but {} were expected",
                            m.group.rank,
                            raw.sent / elem,
                            m.count
                        ),
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(err)) => first_err = Some(comm.localize(err)),
                None => first_err = Some(Error::StaleRequest(id.index())),
            }
        }
        for l in self.lent.drain(..) {
            lend.retire(l);
        }
        self.in_flight = false;
        first_err.map_or(Ok(()), Err)
    }

    /// `start` then `wait`.
    pub fn run(&mut self) -> Result<()> {
        self.start()?;
        self.wait()
    }
}

impl<T: Pod> Drop for NeighborPlan<'_, T> {
    fn drop(&mut self) {
        let sh = &self.graph.comm.sh;
        if self.in_flight {
            let (Ok(mut e), Ok(mut lend)) = (sh.engine.try_borrow_mut(), sh.lend.try_borrow_mut()) else {
                // Cannot withdraw the operations (dropped inside a handler): the
                // buffers stay mapped, leaked, so nothing can write freed memory.
                std::mem::forget(self.send.take());
                std::mem::forget(self.recv.take());
                return;
            };
            for (_, id) in self.pending.drain(..) {
                e.discard(id);
            }
            for l in self.lent.drain(..) {
                lend.retire(l);
            }
        }
        // No loan refers to the buffers any more: the fields drop (unmap) as usual.
    }
}
