//! Neighbourhood collectives (MPI-3): every process sends one block along
//! each out-edge and receives one along each in-edge, blocks in the order of
//! [`DistGraphComm::neighbors`]. All receives are posted, then all sends, on
//! the graph communicator's collective context; multiple edges between two
//! processes are told apart by order (both ends list them alike), and
//! self-loops are copied locally, the k-th out-edge to oneself feeding the
//! k-th in-edge from oneself.

use bytemuck::Pod;

use super::DistGraphComm;
use crate::coll::util::tag;
use crate::error::{Error, Result};
use crate::scope::{Request, Scope};

/// One neighbour's block of [`DistGraphComm::neighbor_alltoallw`]: `count`
/// elements of `elem_size` bytes at byte offset `displ` (the element type may
/// differ per neighbour, as MPI's datatypes do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Byte offset in the buffer.
    pub displ: usize,
    /// Number of elements.
    pub count: usize,
    /// Bytes per element.
    pub elem_size: usize,
}

impl Block {
    fn bytes(&self) -> Option<usize> {
        self.count.checked_mul(self.elem_size)
    }
}

/// Disjoint sub-slices of `buf`, one per (count, displ), in the given order.
fn split_disjoint<'a, T>(op: &'static str, buf: &'a mut [T], parts: &[(usize, usize)], edge: &str) -> Result<Vec<&'a mut [T]>> {
    let len = buf.len();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|&i| (parts[i].1, i));
    let mut out: Vec<Option<&'a mut [T]>> = (0..parts.len()).map(|_| None).collect();
    let mut rest = buf;
    let mut consumed = 0;
    let mut last: Option<usize> = None;
    for i in order {
        let (count, displ) = parts[i];
        if displ.checked_add(count).is_none_or(|end| end > len) {
            return Err(Error::InvalidGraph {
                op,
                detail: format!("{edge} {i}: count {count} at displacement {displ} exceeds the receive buffer of {len} elements"),
            });
        }
        if displ < consumed && count > 0 {
            let other = last.unwrap_or(i);
            return Err(Error::InvalidGraph { op, detail: format!("{edge} {i}'s receive region overlaps {edge} {other}'s") });
        }
        let start = displ.max(consumed);
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut(start - consumed);
        let (part, tail) = tail.split_at_mut(count);
        out[i] = Some(part);
        rest = tail;
        consumed = start + count;
        if count > 0 {
            last = Some(i);
        }
    }
    Ok(out.into_iter().map(Option::unwrap_or_default).collect())
}

/// Sub-slices of `buf` for sends (may overlap).
fn send_parts<'a, T>(op: &'static str, buf: &'a [T], parts: &[(usize, usize)]) -> Result<Vec<&'a [T]>> {
    parts
        .iter()
        .enumerate()
        .map(|(i, &(count, displ))| {
            displ.checked_add(count).and_then(|end| buf.get(displ..end)).ok_or_else(|| Error::InvalidGraph {
                op,
                detail: format!("out-edge {i}: count {count} at displacement {displ} exceeds the send buffer of {} elements", buf.len()),
            })
        })
        .collect()
}

fn pairs(op: &'static str, counts: &[usize], displs: &[usize], degree: usize, side: &str) -> Result<Vec<(usize, usize)>> {
    if counts.len() != degree || displs.len() != degree {
        return Err(Error::InvalidGraph {
            op,
            detail: format!("{} {side} counts and {} displacements for {degree} {side}-edges", counts.len(), displs.len()),
        });
    }
    Ok(counts.iter().copied().zip(displs.iter().copied()).collect())
}

/// A non-blocking neighbourhood collective in flight in a [`Scope`]; the
/// scope completes it if it is never waited for.
#[must_use = "a neighbourhood collective completes at wait or at the end of its scope"]
pub struct NeighborRequest<'s> {
    op: &'static str,
    recvs: Vec<(usize, u32, usize, Request<'s>)>,
    sends: Vec<Request<'s>>,
}

impl<'s> NeighborRequest<'s> {
    /// Waits for every block, checking that each in-edge delivered exactly its block.
    pub fn wait(self, s: &Scope<'s, '_>) -> Result<()> {
        let op = self.op;
        let mut first_err = None;
        for (i, src, expected, r) in self.recvs {
            match s.wait(r) {
                Ok(st) if st.count == expected => {}
                Ok(st) => {
                    first_err.get_or_insert(Error::InvalidGraph {
                        op,
                        detail: format!("in-edge {i} (from rank {src}) delivered {} elements but {expected} were expected", st.count),
                    });
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for r in self.sends {
            if let Err(e) = s.wait(r) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// (count, displacement) of each edge's block.
type Parts = Vec<(usize, usize)>;

/// (bytes, byte displacement) of each alltoallw block.
fn byte_parts(blocks: &[Block], deg: usize, side: &str) -> Result<Vec<(usize, usize)>> {
    const OP: &str = "neighbor_alltoallw";
    if blocks.len() != deg {
        return Err(Error::InvalidGraph { op: OP, detail: format!("{} {side} blocks for {deg} {side}-edges", blocks.len()) });
    }
    blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            b.bytes().map(|n| (n, b.displ)).ok_or_else(|| Error::InvalidGraph {
                op: OP,
                detail: format!("{side}-edge {i}: {} elements of {} bytes overflow", b.count, b.elem_size),
            })
        })
        .collect()
}

/// Consecutive edges to (or from) one peer that travel as one message (the
/// blocking collectives and persistent plans, when every rank groups its
/// edges by peer).
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub(crate) rank: u32,
    pub(crate) edges: std::ops::Range<usize>,
    /// Elements in all its blocks.
    pub(crate) total: usize,
    /// Where the blocks start, when they lie back to back in the buffer.
    pub(crate) contiguous_at: Option<usize>,
    /// One past the last element so far, while the blocks are back to back.
    end: Option<usize>,
}

impl Group {
    /// "in-edge 3" or "in-edges 3..=5", for errors.
    pub(crate) fn name(&self, side: &str) -> String {
        if self.edges.len() == 1 {
            format!("{side}-edge {}", self.edges.start)
        } else {
            format!("{side}-edges {}..={}", self.edges.start, self.edges.end - 1)
        }
    }
}

/// The edges other than self-loops as messages: runs of consecutive edges to
/// one peer when `merge`, else one per edge. Zero-count blocks join any run.
pub(crate) fn groups(edges: &[(u32, u32)], parts: &[(usize, usize)], me: u32, merge: bool) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for (i, (&(rank, _), &(count, displ))) in edges.iter().zip(parts).enumerate() {
        if rank == me {
            continue;
        }
        let start = (count > 0).then_some(displ);
        match out.last_mut() {
            Some(g) if merge && g.rank == rank && g.edges.end == i => {
                g.edges.end = i + 1;
                g.total += count;
                if count > 0 {
                    match g.end {
                        _ if g.total == count => (g.contiguous_at, g.end) = (start, Some(displ + count)),
                        Some(e) if e == displ && g.contiguous_at.is_some() => g.end = Some(displ + count),
                        _ => (g.contiguous_at, g.end) = (None, None),
                    }
                }
            }
            _ => out.push(Group { rank, edges: i..i + 1, total: count, contiguous_at: start, end: start.map(|d| d + count) }),
        }
    }
    for g in &mut out {
        if g.total == 0 {
            g.contiguous_at = Some(0);
        }
    }
    out
}

impl DistGraphComm {
    /// Starts sending `sends[j]` along out-edge j and receiving in-edge i
    /// into `recvs[i]` (all receives posted first), in scope `s`.
    fn start_exchange<'s, 'env, T: Pod>(
        &self,
        s: &Scope<'s, 'env>,
        op: &'static str,
        sends: &[&'env [T]],
        recvs: Vec<&'env mut [T]>,
    ) -> Result<NeighborRequest<'s>> {
        self.comm.sh.check_live(op)?;
        if s.comm().ctx != self.comm.ctx {
            return Err(Error::InvalidGraph {
                op,
                detail: "the scope belongs to another communicator: use the graph communicator's scope".into(),
            });
        }
        let me = self.comm.rank();
        // Self-loops: the k-th out-edge to me feeds the k-th in-edge from me.
        let mut self_sends = self.outs.iter().zip(sends).filter(|(e, _)| e.0 == me).map(|(_, s)| *s);
        let mut remote = Vec::with_capacity(recvs.len());
        for (i, (part, &(src, _))) in recvs.into_iter().zip(&self.ins).enumerate() {
            if src != me {
                remote.push((i, src, part));
                continue;
            }
            let data = self_sends
                .next()
                .ok_or_else(|| Error::InvalidGraph { op, detail: format!("in-edge {i} from rank {me} itself has no out-edge") })?;
            if data.len() != part.len() {
                return Err(Error::InvalidGraph {
                    op,
                    detail: format!("self-loop: rank {me} sends itself {} elements but in-edge {i} expects {}", data.len(), part.len()),
                });
            }
            part.copy_from_slice(data);
        }
        let mut req = NeighborRequest { op, recvs: Vec::with_capacity(remote.len()), sends: Vec::with_capacity(sends.len()) };
        for (i, src, part) in remote {
            let expected = part.len();
            req.recvs.push((i, src, expected, s.irecv_coll(part, src, tag::NEIGHBOR)?));
        }
        for (&(dst, _), buf) in self.outs.iter().zip(sends) {
            if dst != me {
                req.sends.push(s.isend_coll(buf, dst, tag::NEIGHBOR)?);
            }
        }
        Ok(req)
    }

    /// The blocking collectives: with edges grouped by peer on every rank,
    /// one message per peer pair (blocks packed when they are not back to
    /// back in the user's buffer); otherwise one message per edge.
    fn blocking_exchange<T: Pod>(
        &self,
        op: &'static str,
        send: &[T],
        sparts: &[(usize, usize)],
        recv: &mut [T],
        rparts: &[(usize, usize)],
    ) -> Result<()> {
        if !self.grouped {
            let sends = send_parts(op, send, sparts)?;
            let recvs = split_disjoint(op, recv, rparts, "in-edge")?;
            return self.comm.scope(|s| self.start_exchange(s, op, &sends, recvs)?.wait(s));
        }
        self.comm.sh.check_live(op)?;
        let sends = send_parts(op, send, sparts)?;
        drop(split_disjoint(op, recv, rparts, "in-edge")?);
        let me = self.comm.rank();
        // Self-loops: the k-th out-edge to me feeds the k-th in-edge from me.
        let to_me = self.outs.iter().enumerate().filter(|(_, e)| e.0 == me).map(|(j, _)| j);
        let from_me: Vec<usize> = self.ins.iter().enumerate().filter(|(_, e)| e.0 == me).map(|(i, _)| i).collect();
        if to_me.clone().count() != from_me.len() {
            return Err(Error::InvalidGraph {
                op,
                detail: format!("rank {me} has {} out-edges to itself but {} in-edges from itself", to_me.count(), from_me.len()),
            });
        }
        for (j, &i) in to_me.zip(&from_me) {
            let (c, d) = rparts[i];
            if sends[j].len() != c {
                return Err(Error::InvalidGraph {
                    op,
                    detail: format!("self-loop: rank {me} sends itself {} elements but in-edge {i} expects {c}", sends[j].len()),
                });
            }
            recv[d..d + c].copy_from_slice(sends[j]);
        }
        let sg = groups(&self.outs, sparts, me, true);
        let rg = groups(&self.ins, rparts, me, true);
        let staged_sends: Vec<Option<Vec<T>>> =
            sg.iter().map(|g| g.contiguous_at.is_none().then(|| sends[g.edges.clone()].concat())).collect();
        let mut staged_recvs: Vec<Option<Vec<T>>> =
            rg.iter().map(|g| g.contiguous_at.is_none().then(|| vec![T::zeroed(); g.total])).collect();
        let direct_parts: Vec<(usize, usize)> = rg.iter().filter_map(|g| g.contiguous_at.map(|d| (g.total, d))).collect();
        let got = {
            let mut direct = split_disjoint(op, recv, &direct_parts, "in-edge group")?.into_iter();
            self.comm.scope(|s| {
                let mut reqs = Vec::with_capacity(rg.len());
                for (g, staged) in rg.iter().zip(staged_recvs.iter_mut()) {
                    let part: &mut [T] = match staged {
                        Some(v) => v,
                        None => direct.next().unwrap_or_default(),
                    };
                    reqs.push(s.irecv_coll(part, g.rank, tag::NEIGHBOR)?);
                }
                let mut staged_sends = staged_sends.iter();
                for g in &sg {
                    let staged = staged_sends.next().and_then(Option::as_deref);
                    let buf: &[T] = match (g.contiguous_at, staged) {
                        (Some(d), _) => &send[d..d + g.total],
                        (None, Some(v)) => v,
                        (None, None) => &[],
                    };
                    let _ = s.isend_coll(buf, g.rank, tag::NEIGHBOR)?;
                }
                reqs.into_iter().map(|r| Ok(s.wait(r)?.count)).collect::<Result<Vec<usize>>>()
            })?
        };
        for (g, count) in rg.iter().zip(&got) {
            if *count != g.total {
                let edges = g.name("in");
                return Err(Error::InvalidGraph {
                    op,
                    detail: format!("{edges} (from rank {}) delivered {count} elements but {} were expected", g.rank, g.total),
                });
            }
        }
        // Unpack the staged receives into their blocks.
        for (g, staged) in rg.iter().zip(&staged_recvs) {
            let Some(v) = staged else { continue };
            let mut at = 0;
            for i in g.edges.clone() {
                let (c, d) = rparts[i];
                recv[d..d + c].copy_from_slice(&v[at..at + c]);
                at += c;
            }
        }
        Ok(())
    }

    /// `send` along every out-edge; in-edge i's copy lands in block i of `recv`
    /// (`recv` holds indegree blocks of `send.len()` elements).
    pub fn neighbor_allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let (indeg, outdeg, _) = self.neighbors_count();
        let m = send.len();
        if recv.len() != indeg * m {
            return Err(Error::InvalidGraph {
                op: "neighbor_allgather",
                detail: format!("receive buffer of {} elements for {indeg} in-edges of {m} elements", recv.len()),
            });
        }
        let rparts: Vec<(usize, usize)> = (0..indeg).map(|i| (m, i * m)).collect();
        self.blocking_exchange("neighbor_allgather", send, &vec![(m, 0); outdeg], recv, &rparts)
    }

    /// Non-blocking [`DistGraphComm::neighbor_allgather`] in the graph communicator's scope.
    pub fn ineighbor_allgather<'s, 'env, T: Pod>(
        &self,
        s: &Scope<'s, 'env>,
        send: &'env [T],
        recv: &'env mut [T],
    ) -> Result<NeighborRequest<'s>> {
        const OP: &str = "neighbor_allgather";
        let (indeg, outdeg, _) = self.neighbors_count();
        if recv.len() != indeg * send.len() {
            return Err(Error::InvalidGraph {
                op: OP,
                detail: format!("receive buffer of {} elements for {indeg} in-edges of {} elements", recv.len(), send.len()),
            });
        }
        let m = send.len();
        let recvs: Vec<&mut [T]> = if m == 0 { (0..indeg).map(|_| <&mut [T]>::default()).collect() } else { recv.chunks_mut(m).collect() };
        self.start_exchange(s, OP, &vec![send; outdeg], recvs)
    }

    /// Like [`DistGraphComm::neighbor_allgather`] with per-in-edge counts and
    /// displacements (in elements) in `recv`.
    pub fn neighbor_allgatherv<T: Pod>(&self, send: &[T], recv: &mut [T], rcounts: &[usize], rdispls: &[usize]) -> Result<()> {
        const OP: &str = "neighbor_allgatherv";
        let (indeg, outdeg, _) = self.neighbors_count();
        let rparts = pairs(OP, rcounts, rdispls, indeg, "in")?;
        self.blocking_exchange(OP, send, &vec![(send.len(), 0); outdeg], recv, &rparts)
    }

    /// Non-blocking [`DistGraphComm::neighbor_allgatherv`].
    pub fn ineighbor_allgatherv<'s, 'env, T: Pod>(
        &self,
        s: &Scope<'s, 'env>,
        send: &'env [T],
        recv: &'env mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<NeighborRequest<'s>> {
        const OP: &str = "neighbor_allgatherv";
        let (indeg, outdeg, _) = self.neighbors_count();
        let parts = pairs(OP, rcounts, rdispls, indeg, "in")?;
        let recvs = split_disjoint(OP, recv, &parts, "in-edge")?;
        self.start_exchange(s, OP, &vec![send; outdeg], recvs)
    }

    /// Block j of `send` along out-edge j, in-edge i into block i of `recv`
    /// (equal blocks: `send` holds outdegree blocks, `recv` indegree).
    pub fn neighbor_alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let (sparts, rparts) = self.alltoall_parts(send.len(), recv.len())?;
        self.blocking_exchange("neighbor_alltoall", send, &sparts, recv, &rparts)
    }

    /// Equal blocks: outdegree of them in `send`, indegree in `recv`.
    fn alltoall_parts(&self, slen: usize, rlen: usize) -> Result<(Parts, Parts)> {
        let (indeg, outdeg, _) = self.neighbors_count();
        let block = |len: usize, deg: usize, side: &str| -> Result<usize> {
            if deg == 0 && len == 0 {
                return Ok(0);
            }
            if deg == 0 || len % deg != 0 {
                return Err(Error::InvalidGraph {
                    op: "neighbor_alltoall",
                    detail: format!("{side} buffer of {len} elements is not {deg} equal blocks ({side}degree {deg})"),
                });
            }
            Ok(len / deg)
        };
        let sm = block(slen, outdeg, "out")?;
        let rm = block(rlen, indeg, "in")?;
        Ok(((0..outdeg).map(|j| (sm, j * sm)).collect(), (0..indeg).map(|i| (rm, i * rm)).collect()))
    }

    /// Non-blocking [`DistGraphComm::neighbor_alltoall`].
    pub fn ineighbor_alltoall<'s, 'env, T: Pod>(
        &self,
        s: &Scope<'s, 'env>,
        send: &'env [T],
        recv: &'env mut [T],
    ) -> Result<NeighborRequest<'s>> {
        const OP: &str = "neighbor_alltoall";
        let (sparts, rparts) = self.alltoall_parts(send.len(), recv.len())?;
        let sends = send_parts(OP, send, &sparts)?;
        let recvs = split_disjoint(OP, recv, &rparts, "in-edge")?;
        self.start_exchange(s, OP, &sends, recvs)
    }

    /// Per-edge counts and displacements (in elements): `scounts[j]` elements
    /// at `sdispls[j]` along out-edge j, in-edge i into `rcounts[i]` at `rdispls[i]`.
    pub fn neighbor_alltoallv<T: Pod>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<()> {
        const OP: &str = "neighbor_alltoallv";
        let (indeg, outdeg, _) = self.neighbors_count();
        let sparts = pairs(OP, scounts, sdispls, outdeg, "out")?;
        let rparts = pairs(OP, rcounts, rdispls, indeg, "in")?;
        self.blocking_exchange(OP, send, &sparts, recv, &rparts)
    }

    /// Non-blocking [`DistGraphComm::neighbor_alltoallv`].
    #[allow(clippy::too_many_arguments)]
    pub fn ineighbor_alltoallv<'s, 'env, T: Pod>(
        &self,
        s: &Scope<'s, 'env>,
        send: &'env [T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &'env mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<NeighborRequest<'s>> {
        const OP: &str = "neighbor_alltoallv";
        let (indeg, outdeg, _) = self.neighbors_count();
        let sends = send_parts(OP, send, &pairs(OP, scounts, sdispls, outdeg, "out")?)?;
        let recvs = split_disjoint(OP, recv, &pairs(OP, rcounts, rdispls, indeg, "in")?, "in-edge")?;
        self.start_exchange(s, OP, &sends, recvs)
    }

    /// Per-edge blocks of bytes with their own element sizes (MPI's
    /// per-neighbour datatypes, displacements in bytes).
    pub fn neighbor_alltoallw(&self, send: &[u8], sblocks: &[Block], recv: &mut [u8], rblocks: &[Block]) -> Result<()> {
        let (indeg, outdeg, _) = self.neighbors_count();
        let sparts = byte_parts(sblocks, outdeg, "out")?;
        let rparts = byte_parts(rblocks, indeg, "in")?;
        self.blocking_exchange("neighbor_alltoallw", send, &sparts, recv, &rparts)
    }

    /// Non-blocking [`DistGraphComm::neighbor_alltoallw`].
    pub fn ineighbor_alltoallw<'s, 'env>(
        &self,
        s: &Scope<'s, 'env>,
        send: &'env [u8],
        sblocks: &[Block],
        recv: &'env mut [u8],
        rblocks: &[Block],
    ) -> Result<NeighborRequest<'s>> {
        const OP: &str = "neighbor_alltoallw";
        let (indeg, outdeg, _) = self.neighbors_count();
        let sends = send_parts(OP, send, &byte_parts(sblocks, outdeg, "out")?)?;
        let recvs = split_disjoint(OP, recv, &byte_parts(rblocks, indeg, "in")?, "in-edge")?;
        self.start_exchange(s, OP, &sends, recvs)
    }
}

#[cfg(test)]
mod tests {
    use super::split_disjoint;

    #[test]
    fn parts_follow_edge_order_and_overlaps_are_named() {
        let mut buf = [0u8; 10];
        let parts = split_disjoint("t", &mut buf, &[(2, 6), (0, 3), (3, 0)], "in-edge").unwrap();
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [2, 0, 3]);
        let e = split_disjoint("t", &mut buf, &[(4, 0), (2, 3)], "in-edge").unwrap_err().to_string();
        assert!(e.contains("in-edge 1's receive region overlaps in-edge 0's"), "{e}");
        let e = split_disjoint("t", &mut buf, &[(4, 8)], "in-edge").unwrap_err().to_string();
        assert!(e.contains("in-edge 0: count 4 at displacement 8 exceeds the receive buffer of 10"), "{e}");
    }
}
