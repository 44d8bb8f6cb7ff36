//! The two constructors. Both are collective over the old communicator, and
//! both fail on every rank when any rank's arguments are wrong (a rank that
//! returned early would leave the others waiting in the next exchange).

use fmx_transport::Endpoint;

use super::{DistGraphComm, Info, Reorder, Weights};
use crate::coll::Op;
use crate::comm::Comm;
use crate::error::{Error, Result};

const ADJACENT: &str = "dist_graph_create_adjacent";
const GENERAL: &str = "dist_graph_create";

/// An edge as routed by the general constructor: who it goes to, its ends,
/// weight, and (origin rank, index there) to order multiple edges alike on
/// both ends.
const RECORD: usize = 6;
const ROLE_OUT: u32 = 0;
const ROLE_IN: u32 = 1;

/// (peer, weight) per edge, in neighbour order.
type EdgeList = Vec<(u32, u32)>;

fn weights_of<'a>(w: Weights<'a>, n: usize, what: &str, op: &'static str) -> Result<Option<&'a [u32]>> {
    match w {
        Weights::Unweighted => Ok(None),
        Weights::Values(v) if v.len() == n => Ok(Some(v)),
        Weights::Values(v) => Err(Error::InvalidGraph { op, detail: format!("{} {what} weights for {n} edges", v.len()) }),
    }
}

fn check_rank(c: &Comm, op: &'static str, r: u32, what: impl FnOnce() -> String) -> Result<()> {
    if r < c.size() {
        Ok(())
    } else {
        Err(Error::InvalidGraph { op, detail: format!("{}: rank {r} does not exist in a communicator of size {}", what(), c.size()) })
    }
}

impl Comm {
    /// A graph communicator from each process's own in- and out-edges
    /// (`MPI_Dist_graph_create_adjacent`). Multiple edges, self-loops and
    /// isolated processes are allowed; both ends must describe every edge
    /// with the same weights (checked unless `fmx_check_adjacent=false`).
    /// Neighbour order is the order given. Collective.
    pub fn dist_graph_create_adjacent(
        &self,
        sources: &[u32],
        source_weights: Weights<'_>,
        destinations: &[u32],
        dest_weights: Weights<'_>,
        info: &Info,
        reorder: Reorder,
    ) -> Result<DistGraphComm> {
        self.sh.check_live(ADJACENT)?;
        let local = (|| {
            let check = info.check_adjacent(ADJACENT)?;
            let sw = weights_of(source_weights, sources.len(), "source", ADJACENT)?;
            let dw = weights_of(dest_weights, destinations.len(), "destination", ADJACENT)?;
            if sw.is_some() != dw.is_some() {
                return Err(Error::InvalidGraph {
                    op: ADJACENT,
                    detail: format!("rank {} passed Unweighted for one weight array but not the other", self.rank()),
                });
            }
            for (i, &s) in sources.iter().enumerate() {
                check_rank(self, ADJACENT, s, || format!("sources[{i}] (edge {s} -> {})", self.rank()))?;
            }
            for (i, &d) in destinations.iter().enumerate() {
                check_rank(self, ADJACENT, d, || format!("destinations[{i}] (edge {} -> {d})", self.rank()))?;
            }
            let ins: Vec<(u32, u32)> = sources.iter().enumerate().map(|(i, &s)| (s, sw.map_or(0, |w| w[i]))).collect();
            let outs: Vec<(u32, u32)> = destinations.iter().enumerate().map(|(i, &d)| (d, dw.map_or(0, |w| w[i]))).collect();
            Ok((ins, outs, sw.is_some(), check))
        })();
        let weighted = local.as_ref().is_ok_and(|l| l.2);
        self.agree(ADJACENT, local.as_ref().err(), weighted, info)?;
        let (ins, outs, weighted, check) = local?;
        if check {
            self.check_both_ends(&ins, &outs, weighted)?;
        }
        let mine = [u32::from(super::grouped_by_peer(&ins) && super::grouped_by_peer(&outs))];
        let mut all = [0u32];
        self.allreduce(&mine, &mut all, Op::Min)?;
        // Neighbour order stays as given, under new names if reordered.
        self.graph_comm(ADJACENT, reorder, info, ins, outs, weighted, all[0] == 1, false)
    }

    /// A graph communicator from edges any process may give for any source
    /// (`MPI_Dist_graph_create`): source `sources[i]` has `degrees[i]` edges,
    /// to the next `degrees[i]` entries of `destinations` (and `weights`).
    /// Each edge is routed to its two ends; no process sees the whole graph.
    /// Neighbour order: by peer rank, then by (giving rank, position there).
    /// Collective.
    pub fn dist_graph_create(
        &self,
        sources: &[u32],
        degrees: &[usize],
        destinations: &[u32],
        weights: Weights<'_>,
        info: &Info,
        reorder: Reorder,
    ) -> Result<DistGraphComm> {
        self.sh.check_live(GENERAL)?;
        let local = (|| {
            info.check_adjacent(GENERAL)?;
            if degrees.len() != sources.len() {
                return Err(Error::InvalidGraph {
                    op: GENERAL,
                    detail: format!("{} sources but {} degrees (one degree per source)", sources.len(), degrees.len()),
                });
            }
            let total = degrees.iter().try_fold(0usize, |a, &d| a.checked_add(d));
            if total != Some(destinations.len()) {
                return Err(Error::InvalidGraph {
                    op: GENERAL,
                    detail: format!("degrees add up to {total:?} edges but {} destinations are given", destinations.len()),
                });
            }
            let w = weights_of(weights, destinations.len(), "edge", GENERAL)?;
            let mut edges = Vec::with_capacity(destinations.len());
            let mut k = 0;
            for (i, (&s, &deg)) in sources.iter().zip(degrees).enumerate() {
                check_rank(self, GENERAL, s, || format!("sources[{i}]"))?;
                for _ in 0..deg {
                    let d = destinations[k];
                    check_rank(self, GENERAL, d, || format!("destinations[{k}] (edge {s} -> {d}, of sources[{i}])"))?;
                    edges.push((s, d, w.map_or(0, |w| w[k]), k as u32));
                    k += 1;
                }
            }
            Ok((edges, w.is_some()))
        })();
        let weighted = local.as_ref().is_ok_and(|l| l.1);
        self.agree(GENERAL, local.as_ref().err(), weighted, info)?;
        let (edges, weighted) = local?;
        let (ins, outs) = self.route_edges(&edges)?;
        // Edges come sorted by peer: each peer's are adjacent on every rank.
        self.graph_comm(GENERAL, reorder, info, ins, outs, weighted, true, true)
    }

    /// The graph communicator: a dup, or with reordering a split by the new
    /// ranks and the edges renamed (re-sorted by new peer when `resort`; the
    /// sort is stable, so multiple edges keep their agreed order).
    #[allow(clippy::too_many_arguments)]
    fn graph_comm(
        &self,
        op: &'static str,
        reorder: Reorder,
        info: &Info,
        mut ins: Vec<(u32, u32)>,
        mut outs: Vec<(u32, u32)>,
        weighted: bool,
        grouped: bool,
        resort: bool,
    ) -> Result<DistGraphComm> {
        self.size_credits(&ins, weighted, info)?;
        if info.get("fmx_preconnect") == Some("true") {
            self.preconnect(op, ins.iter().chain(&outs).map(|e| e.0))?;
        }
        let Some((perm, cost)) = self.reorder_ranks(op, reorder == Reorder::Allowed, &outs, info)? else {
            return Ok(DistGraphComm::new(self.dup()?, ins, outs, weighted, grouped, None));
        };
        let me = perm[self.rank() as usize];
        let comm = self
            .split(Some(0), me as i32)?
            .ok_or_else(|| Error::InvalidGraph { op, detail: "reordering lost this process (split returned no communicator)".into() })?;
        for e in ins.iter_mut().chain(outs.iter_mut()) {
            e.0 = perm[e.0 as usize];
        }
        if resort {
            ins.sort_by_key(|e| e.0);
            outs.sort_by_key(|e| e.0);
        }
        Ok(DistGraphComm::new(comm, ins, outs, weighted, grouped, Some(cost)))
    }

    /// Sizes senders' shares of our eager pool by our in-edges (FM's credits
    /// meeting the declared topology), when the graph spans every process and
    /// `fmx_size_credits` is not false: each process publishes, all agree the
    /// transport could, a barrier, then everyone adopts the shares granted to it.
    fn size_credits(&self, ins: &[(u32, u32)], weighted: bool, info: &Info) -> Result<()> {
        let world = self.world_to_comm.len();
        if self.size() as usize != world || info.get("fmx_size_credits") == Some("false") {
            return Ok(());
        }
        let me = self.members[self.rank() as usize];
        let mut weights = vec![0u64; world];
        for &(s, w) in ins {
            let ws = self.members[s as usize];
            if ws != me {
                weights[ws as usize] += if weighted { u64::from(w).max(1) } else { 1 };
            }
        }
        let ok = self.sh.engine.borrow_mut().tp.publish_receive_shares(&weights)?;
        let mut all = [0u32];
        self.allreduce(&[u32::from(ok)], &mut all, Op::Min)?;
        if all[0] == 0 {
            return Ok(());
        }
        self.barrier()?;
        self.sh.engine.borrow_mut().tp.adopt_receive_shares();
        // Every sender switches its windows now rather than at its next send,
        // so the memory goes back at once: each waits until the receivers have
        // released what it sent, and everyone polls meanwhile.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let everyone = crate::engine::WaitsOn::AnyOf(self.members.clone());
        self.retry_until(&everyone, "sizing eager pools (dist_graph_create)", || {
            let mut e = self.sh.engine.borrow_mut();
            if !e.tp.settle_receive_shares() {
                return Ok(Some(()));
            }
            e.progress(&mut self.sh.lend.borrow_mut())?;
            if std::time::Instant::now() > deadline {
                return Err(Error::InvalidGraph {
                    op: "dist_graph_create",
                    detail: "sizing eager pools: a peer did not release its messages within 120 s".into(),
                });
            }
            Ok(None)
        })?;
        // Everyone switched; one more look makes each receiver follow.
        self.barrier()?;
        self.sh.engine.borrow_mut().progress(&mut self.sh.lend.borrow_mut())?;
        Ok(())
    }

    /// One allgather of (flags, info digest): every rank learns whether any
    /// rank's input was wrong, and whether all agree on weights and info.
    fn agree(&self, op: &'static str, local_error: Option<&Error>, weighted: bool, info: &Info) -> Result<()> {
        let digest = info.digest();
        let mine = [u32::from(local_error.is_some()), u32::from(weighted), digest as u32, (digest >> 32) as u32];
        let mut all = vec![0u32; 4 * self.size() as usize];
        self.allgather(&mine, &mut all)?;
        let recs: Vec<&[u32]> = all.chunks(4).collect();
        if let Some(e) = local_error {
            return Err(Error::InvalidGraph { op, detail: e.to_string() });
        }
        if let Some(bad) = recs.iter().position(|r| r[0] != 0) {
            return Err(Error::InvalidGraph { op, detail: format!("rank {bad}'s arguments are invalid (its error names the problem)") });
        }
        if let Some(r) = recs.iter().position(|r| r[1] != recs[0][1]) {
            let says = |w: u32| if w != 0 { "weights" } else { "Unweighted" };
            return Err(Error::InvalidGraph {
                op,
                detail: format!(
                    "rank {r} passed {} but rank 0 passed {}: either every process passes Unweighted or none does",
                    says(recs[r][1]),
                    says(recs[0][1])
                ),
            });
        }
        if let Some(r) = recs.iter().position(|r| r[2..] != recs[0][2..]) {
            return Err(Error::InvalidGraph {
                op,
                detail: format!("rank {r}'s info differs from rank 0's: every process must pass the same info"),
            });
        }
        Ok(())
    }

    /// Every edge as both ends declared it: each process sends each
    /// destination the sorted weights of its edges there and compares what
    /// arrives with its own in-edges. Fails on every rank if any rank differs.
    fn check_both_ends(&self, ins: &[(u32, u32)], outs: &[(u32, u32)], weighted: bool) -> Result<()> {
        let n = self.size() as usize;
        let mut to: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(d, w) in outs {
            to[d as usize].push(w);
        }
        let got = self.sparse_exchange(&to)?;
        let mut from: Vec<Vec<u32>> = vec![Vec::new(); n];
        for &(s, w) in ins {
            from[s as usize].push(w);
        }
        let me = self.rank();
        let mut mismatch = None;
        for (s, (mut declared_by_source, mut mine)) in got.into_iter().zip(from).enumerate() {
            declared_by_source.sort_unstable();
            mine.sort_unstable();
            if declared_by_source != mine {
                let show = |v: &[u32]| if weighted { format!("{} (weights {v:?})", v.len()) } else { v.len().to_string() };
                mismatch = Some(format!(
                    "edges rank {s} -> rank {me}: rank {s} declares {} among its destinations, rank {me} declares {} among its sources",
                    show(&declared_by_source),
                    show(&mine)
                ));
                break;
            }
        }
        let first = [if mismatch.is_some() { me } else { u32::MAX }];
        let mut agreed = [0u32];
        self.allreduce(&first, &mut agreed, Op::Min)?;
        match (mismatch, agreed[0]) {
            (Some(detail), _) => Err(Error::InvalidGraph { op: ADJACENT, detail }),
            (None, u32::MAX) => Ok(()),
            (None, r) => Err(Error::InvalidGraph {
                op: ADJACENT,
                detail: format!("rank {r} found an edge its two ends describe differently (its error names it)"),
            }),
        }
    }

    /// Sends each edge to its two endpoints; returns this process's
    /// (in-edges, out-edges), multiple edges ordered alike on both ends.
    fn route_edges(&self, edges: &[(u32, u32, u32, u32)]) -> Result<(EdgeList, EdgeList)> {
        let me = self.rank();
        let mut to: Vec<Vec<u32>> = vec![Vec::new(); self.size() as usize];
        for &(s, d, w, k) in edges {
            to[s as usize].extend_from_slice(&[ROLE_OUT, s, d, w, me, k]);
            to[d as usize].extend_from_slice(&[ROLE_IN, s, d, w, me, k]);
        }
        let got = self.sparse_exchange(&to)?;
        let mut ins = Vec::new();
        let mut outs = Vec::new();
        for rec in got.iter().flat_map(|v| v.chunks_exact(RECORD)) {
            let [role, s, d, w, origin, k] = rec.try_into().unwrap_or([u32::MAX; RECORD]);
            match role {
                ROLE_OUT => outs.push((d, origin, k, w)),
                ROLE_IN => ins.push((s, origin, k, w)),
                _ => return Err(Error::InvalidGraph { op: GENERAL, detail: "a routed edge record is malformed".into() }),
            }
        }
        ins.sort_unstable();
        outs.sort_unstable();
        Ok((ins.into_iter().map(|(s, _, _, w)| (s, w)).collect(), outs.into_iter().map(|(d, _, _, w)| (d, w)).collect()))
    }

    /// `to[r]` to rank r; returns what each rank sent us (an alltoall of the
    /// counts, then one alltoallv).
    fn sparse_exchange(&self, to: &[Vec<u32>]) -> Result<Vec<Vec<u32>>> {
        let n = self.size() as usize;
        let scounts: Vec<u32> = to.iter().map(|v| v.len() as u32).collect();
        let mut rcounts = vec![0u32; n];
        self.alltoall(&scounts, &mut rcounts)?;
        let sc: Vec<usize> = scounts.iter().map(|&c| c as usize).collect();
        let rc: Vec<usize> = rcounts.iter().map(|&c| c as usize).collect();
        let sd = prefix(&sc);
        let rd = prefix(&rc);
        let send: Vec<u32> = to.concat();
        let mut recv = vec![0u32; rc.iter().sum()];
        self.alltoallv(&send, &sc, &sd, &mut recv, &rc, &rd)?;
        Ok((0..n).map(|r| recv[rd[r]..rd[r] + rc[r]].to_vec()).collect())
    }
}

/// Exclusive prefix sums (displacements of packed blocks).
pub(crate) fn prefix(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}
