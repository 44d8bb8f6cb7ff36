//! Where the ranks of the job run, as the launcher reported it.

/// This process's place among the job's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Locality {
    /// Index of this process's node (0-based, the launcher's numbering).
    pub node: u32,
    /// Number of nodes the job spans.
    pub nodes: u32,
    /// Rank among the processes on this node (0-based, in world-rank order).
    pub local_rank: u32,
    /// Number of processes on this node.
    pub local_size: u32,
}

impl Locality {
    /// From the node index of every rank.
    pub(crate) fn from_nodes(nodes: &[u32], rank: u32) -> Self {
        let node = nodes[rank as usize];
        let mut distinct = nodes.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let local_rank = nodes[..rank as usize].iter().filter(|&&n| n == node).count() as u32;
        let local_size = nodes.iter().filter(|&&n| n == node).count() as u32;
        Self { node, nodes: distinct.len() as u32, local_rank, local_size }
    }
}

#[cfg(test)]
mod tests {
    use super::Locality;

    #[test]
    fn local_ranks_follow_world_order_on_each_node() {
        let nodes = [0, 1, 0, 1, 1];
        assert_eq!(Locality::from_nodes(&nodes, 3), Locality { node: 1, nodes: 2, local_rank: 1, local_size: 3 });
        assert_eq!(Locality::from_nodes(&nodes, 2), Locality { node: 0, nodes: 2, local_rank: 1, local_size: 2 });
    }
}
