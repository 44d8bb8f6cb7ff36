//! Distributed graph topologies (MPI-2.2's `MPI_Dist_graph_create` and
//! `_adjacent`) and the neighborhood collectives on them (MPI-3).
//!
//! Each process keeps only its own in- and out-edges (memory O(degree)).
//! Creation costs, for P ranks and E edges given by a process:
//! - `dist_graph_create_adjacent`: one allgather of a 16-byte agreement record
//!   per rank (weighted or not, reorder, info, input errors: every rank
//!   answers alike), then, unless `fmx_check_adjacent=false`, one sparse
//!   exchange (an alltoall of P counts and an alltoallv of the edge weights
//!   each process declared toward each neighbour) that proves both ends
//!   describe every edge with the same weights.
//! - `dist_graph_create`: the agreement allgather, then one alltoall of P
//!   counts and one alltoallv that sends each given edge to its two
//!   endpoints (5 words per edge end). No process ever holds the whole graph.

mod create;
mod info;
mod neighbor;
mod plan;
mod preconnect;
mod reorder;

pub use info::Info;
pub use neighbor::{Block, NeighborRequest};
pub use plan::NeighborPlan;
pub use reorder::MappingCost;

use crate::comm::{Comm, Topology};
use crate::error::Result;

/// Edge weights of a constructor: a distinct case, not a weight value
/// (`MPI_UNWEIGHTED`). Either every process passes `Unweighted` or none does.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// Every edge has the same (no) weight.
    Unweighted,
    /// One non-negative weight per edge, in the order of the edges.
    Values(&'a [u32]),
}

/// Whether the library may give this process a new rank in the graph
/// communicator (local per process, as in the final MPI-2.2 text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reorder {
    /// Keep this process's rank.
    No,
    /// The rank may change, to keep heavy edges inside a host (or a block of
    /// `fmx_reorder_group` ranks); see [`DistGraphComm::mapping_cost`].
    Allowed,
}

/// A process's neighbours, as [`DistGraphComm::neighbors`] returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbors {
    /// Ranks with an edge into this process, one per edge.
    pub sources: Vec<u32>,
    /// Their weights (`None` when the graph is unweighted).
    pub source_weights: Option<Vec<u32>>,
    /// Ranks this process has an edge to, one per edge.
    pub destinations: Vec<u32>,
    /// Their weights (`None` when the graph is unweighted).
    pub dest_weights: Option<Vec<u32>>,
}

/// A communicator with a distributed graph topology: the group of the
/// communicator it was created from, a fresh tag space, and this process's
/// edges. It dereferences to [`Comm`] for point-to-point and collectives.
pub struct DistGraphComm {
    comm: Comm,
    /// In-edges (source, weight), in neighbour-collective order.
    ins: Vec<(u32, u32)>,
    /// Out-edges (destination, weight), in neighbour-collective order.
    outs: Vec<(u32, u32)>,
    weighted: bool,
    /// On every rank, each peer's edges are adjacent in both lists, so the
    /// blocks between two processes can travel as one message.
    grouped: bool,
    /// Set when some process allowed reordering.
    cost: Option<MappingCost>,
}

/// Whether each peer's edges form one run in `edges`.
pub(crate) fn grouped_by_peer(edges: &[(u32, u32)]) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut prev = None;
    for &(peer, _) in edges {
        if prev != Some(peer) && !seen.insert(peer) {
            return false;
        }
        prev = Some(peer);
    }
    true
}

impl std::ops::Deref for DistGraphComm {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl std::fmt::Debug for DistGraphComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistGraphComm")
            .field("comm", &self.comm)
            .field("indegree", &self.ins.len())
            .field("outdegree", &self.outs.len())
            .field("weighted", &self.weighted)
            .finish_non_exhaustive()
    }
}

impl DistGraphComm {
    fn new(mut comm: Comm, ins: Vec<(u32, u32)>, outs: Vec<(u32, u32)>, weighted: bool, grouped: bool, cost: Option<MappingCost>) -> Self {
        comm.topology = Topology::DistGraph;
        Self { comm, ins, outs, weighted, grouped, cost }
    }

    /// A graph communicator with the same group, edges and weights and a
    /// fresh tag space (collective), as `MPI_Comm_dup` keeps the topology.
    pub fn dup(&self) -> Result<DistGraphComm> {
        let comm = self.comm.dup()?;
        Ok(Self::new(comm, self.ins.clone(), self.outs.clone(), self.weighted, self.grouped, self.cost))
    }

    /// [`Topology::DistGraph`].
    pub fn topology(&self) -> Topology {
        self.comm.topology
    }

    /// `(indegree, outdegree, weighted)`: edges into and out of this process
    /// (multiple edges counted each), and false if created `Unweighted`.
    pub fn neighbors_count(&self) -> (usize, usize, bool) {
        (self.ins.len(), self.outs.len(), self.weighted)
    }

    /// The first `max_in` in-edges and `max_out` out-edges, in the order the
    /// neighbourhood collectives use; the same on every call.
    pub fn neighbors(&self, max_in: usize, max_out: usize) -> Neighbors {
        let ins = &self.ins[..max_in.min(self.ins.len())];
        let outs = &self.outs[..max_out.min(self.outs.len())];
        Neighbors {
            sources: ins.iter().map(|e| e.0).collect(),
            source_weights: self.weighted.then(|| ins.iter().map(|e| e.1).collect()),
            destinations: outs.iter().map(|e| e.0).collect(),
            dest_weights: self.weighted.then(|| outs.iter().map(|e| e.1).collect()),
        }
    }

    /// The cut (sum of weights of edges between hosts, or between blocks of
    /// `fmx_reorder_group` ranks) with the old ranks and with this
    /// communicator's; `None` when no process allowed reordering.
    pub fn mapping_cost(&self) -> Option<MappingCost> {
        self.cost
    }

    /// The underlying communicator.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }
}
