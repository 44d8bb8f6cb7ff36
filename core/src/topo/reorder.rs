//! Rank reordering for graph communicators: processes that pass
//! `Reorder::Allowed` may get new ranks so that heavy edges stay inside a
//! *place* (a host, or a block of `fmx_reorder_group` consecutive ranks, e.g.
//! the cores of one socket); processes that pass `Reorder::No` keep theirs.
//!
//! The heuristic is a Kernighan–Lin style local search: starting from the
//! identity, repeatedly swap the two movable processes in different places
//! whose swap lowers the cut (the sum of weights of edges between places)
//! the most, until no swap helps. The cut never increases. It runs on rank 0
//! over the gathered out-edges, only when some process allows reordering:
//! one gatherv of the edges (O(E) memory on rank 0 only), one bcast of the
//! permutation. Unweighted edges weigh 1.

use super::Info;
use crate::coll::Op;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// The cut (sum of weights of edges between places) before and after reordering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingCost {
    /// With every process at its old rank.
    pub before: u64,
    /// With the ranks the graph communicator uses.
    pub after: u64,
}

/// Largest number of movable processes the local search considers (its
/// passes are quadratic in them); above it, ranks are kept.
const MAX_MOVABLE: usize = 2048;

/// The place of every slot (rank): blocks of `fmx_reorder_group`, else hosts.
fn places(c: &Comm, info: &Info, op: &'static str) -> Result<Vec<u32>> {
    if let Some(v) = info.get("fmx_reorder_group") {
        let k: u32 = v.parse().ok().filter(|&k| k > 0).ok_or_else(|| Error::InvalidGraph {
            op,
            detail: format!("info fmx_reorder_group={v:?}: expected a positive number of ranks"),
        })?;
        return Ok((0..c.size()).map(|r| r / k).collect());
    }
    let nodes = c.sh.boot.borrow().nodes();
    Ok(c.members.iter().map(|&w| nodes.get(w as usize).copied().unwrap_or(0)).collect())
}

/// Sum of weights of `edges` (s, d, w) whose ends sit in different places.
fn cut(edges: &[(u32, u32, u32)], slot: &[u32], place: &[u32]) -> u64 {
    edges
        .iter()
        .filter(|&&(s, d, _)| place[slot[s as usize] as usize] != place[slot[d as usize] as usize])
        .map(|&(_, _, w)| u64::from(w))
        .sum()
}

/// New slot of every process: pinned ones stay, movable ones are swapped
/// while a swap lowers the cut.
pub(crate) fn local_search(n: usize, edges: &[(u32, u32, u32)], pinned: &[bool], place: &[u32]) -> Vec<u32> {
    let mut slot: Vec<u32> = (0..n as u32).collect();
    let movable: Vec<usize> = (0..n).filter(|&p| !pinned[p]).collect();
    if movable.len() < 2 || movable.len() > MAX_MOVABLE {
        return slot;
    }
    // Undirected adjacency with weights summed per direction.
    let mut adj: Vec<Vec<(usize, i64)>> = vec![Vec::new(); n];
    for &(s, d, w) in edges {
        if s != d {
            adj[s as usize].push((d as usize, i64::from(w)));
            adj[d as usize].push((s as usize, i64::from(w)));
        }
    }
    let weight_to =
        |slot: &[u32], p: usize, pl: u32| -> i64 { adj[p].iter().filter(|&&(q, _)| place[slot[q] as usize] == pl).map(|&(_, w)| w).sum() };
    for _ in 0..4 * n {
        let mut best = (0i64, 0usize, 0usize);
        for (i, &a) in movable.iter().enumerate() {
            let pa = place[slot[a] as usize];
            for &b in &movable[i + 1..] {
                let pb = place[slot[b] as usize];
                if pa == pb {
                    continue;
                }
                let ab: i64 = adj[a].iter().filter(|&&(q, _)| q == b).map(|&(_, w)| w).sum();
                // Cut change if a and b trade places (Kernighan–Lin).
                let delta = weight_to(&slot, a, pa) - weight_to(&slot, a, pb) + weight_to(&slot, b, pb) - weight_to(&slot, b, pa) + 2 * ab;
                if delta < best.0 {
                    best = (delta, a, b);
                }
            }
        }
        if best.0 >= 0 {
            break;
        }
        slot.swap(best.1, best.2);
    }
    slot
}

impl Comm {
    /// When any process allows it, computes new ranks on rank 0 and returns
    /// (new rank of every old rank, cost); `None` when every process said No.
    pub(crate) fn reorder_ranks(
        &self,
        op: &'static str,
        allowed: bool,
        outs: &[(u32, u32)],
        info: &Info,
    ) -> Result<Option<(Vec<u32>, MappingCost)>> {
        let any = [u32::from(allowed)];
        let mut all = [0u32];
        self.allreduce(&any, &mut all, Op::Max)?;
        if all[0] == 0 {
            return Ok(None);
        }
        let place = places(self, info, op)?;
        let n = self.size() as usize;
        let mut pinned = vec![0u32; n];
        self.allgather(&[u32::from(!allowed)], &mut pinned)?;
        // Out-edges (destination, weight) of everyone to rank 0.
        let mine: Vec<u32> = outs.iter().flat_map(|&(d, w)| [d, w]).collect();
        let mut counts = vec![0u32; n];
        self.gather(&[mine.len() as u32], &mut counts, 0)?;
        let counts: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
        let displs = super::create::prefix(&counts);
        let mut flat = vec![0u32; if self.rank() == 0 { counts.iter().sum() } else { 0 }];
        self.gatherv(&mine, &mut flat, &counts, &displs, 0)?;
        // Rank 0 computes; everyone gets [before, after (as u32 pairs)..., permutation].
        let mut result = vec![0u32; 4 + n];
        if self.rank() == 0 {
            let edges: Vec<(u32, u32, u32)> =
                (0..n).flat_map(|s| flat[displs[s]..displs[s] + counts[s]].chunks_exact(2).map(move |e| (s as u32, e[0], e[1]))).collect();
            let pinned: Vec<bool> = pinned.iter().map(|&p| p != 0).collect();
            let identity: Vec<u32> = (0..n as u32).collect();
            let slot = local_search(n, &edges, &pinned, &place);
            let before = cut(&edges, &identity, &place);
            let after = cut(&edges, &slot, &place);
            result[..4].copy_from_slice(&[before as u32, (before >> 32) as u32, after as u32, (after >> 32) as u32]);
            result[4..].copy_from_slice(&slot);
        }
        self.bcast(&mut result, 0)?;
        let cost = MappingCost {
            before: u64::from(result[0]) | u64::from(result[1]) << 32,
            after: u64::from(result[2]) | u64::from(result[3]) << 32,
        };
        Ok(Some((result[4..].to_vec(), cost)))
    }
}

#[cfg(test)]
mod tests {
    use super::{cut, local_search};

    #[test]
    fn swaps_bring_heavy_pairs_together_and_leave_pinned_ranks() {
        // Places {0,1} {2,3} {4,5} {6,7}; heavy edges r <-> r+4.
        let place: Vec<u32> = (0..8).map(|r| r / 2).collect();
        let edges: Vec<(u32, u32, u32)> = (0..4).flat_map(|r| [(r, r + 4, 10), (r + 4, r, 10)]).chain([(0, 1, 1)]).collect();
        let mut pinned = vec![false; 8];
        pinned[0] = true;
        pinned[3] = true;
        let identity: Vec<u32> = (0..8).collect();
        let slot = local_search(8, &edges, &pinned, &place);
        assert_eq!((slot[0], slot[3]), (0, 3), "pinned ranks keep their slots");
        let (before, after) = (cut(&edges, &identity, &place), cut(&edges, &slot, &place));
        assert_eq!(before, 80);
        assert!(after < before, "{after} >= {before}");
        let mut sorted = slot.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, identity, "a permutation");
    }

    #[test]
    fn nothing_movable_means_identity() {
        let place = vec![0, 1];
        assert_eq!(local_search(2, &[(0, 1, 5)], &[true, false], &place), [0, 1]);
    }
}
