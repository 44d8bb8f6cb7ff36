//! Which two ranks of a launcher's world measure a point-to-point test:
//! `--pair A,B`, or by default rank 0 and the first rank on another node
//! (the network between two nodes is what a cluster user benchmarks), or
//! rank 1 when every rank shares a node.

/// `A,B` from the command line.
pub fn parse(v: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--pair {v:?}: expected two ranks, A,B (for example 0,4)");
    let (a, b) = v.split_once(',').ok_or_else(bad)?;
    Ok((a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?))
}

/// The measuring pair for a world whose rank `r` runs on node `nodes[r]`.
pub fn choose(asked: Option<(u32, u32)>, nodes: &[u32]) -> Result<(u32, u32), String> {
    let size = nodes.len() as u32;
    match asked {
        Some((a, b)) if a == b => Err(format!("--pair {a},{b}: the pair must be two different ranks")),
        Some((a, b)) if a >= size || b >= size => {
            Err(format!("--pair {a},{b}: rank {} is not in the world of {size} ranks", if a >= size { a } else { b }))
        }
        Some(p) => Ok(p),
        None if size < 2 => Err(format!(
            "fmx-perf needs at least 2 ranks; the launcher's world has {size} (start it with 2 or more, or alone, without a launcher, to start a pair of its own)"
        )),
        None => Ok((0, (1..size).find(|&r| nodes[r as usize] != nodes[0]).unwrap_or(1))),
    }
}

/// The key that puts A first and B second when splitting the world, the
/// others after them in rank order.
pub fn key(rank: u32, (a, b): (u32, u32)) -> i32 {
    match rank {
        r if r == a => 0,
        r if r == b => 1,
        r => 2 + r as i32,
    }
}

/// `mbw_mr`'s order of the world: ranks by node, then rank. Position k
/// streams to position k + n/2, so where the job has two nodes of equal size
/// every pair crosses between them (on one node: rank i to rank i + n/2).
pub fn streaming_order(nodes: &[u32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
    order.sort_by_key(|&r| (nodes[r as usize], r));
    order
}

/// The pairs of `order` as a header line: "0 (node 0) -> 1 (node 1), ...".
pub fn describe_streams(order: &[u32], nodes: &[u32]) -> String {
    let half = order.len() / 2;
    (0..half)
        .map(|k| {
            let (s, r) = (order[k], order[k + half]);
            format!("{s} (node {}) -> {r} (node {})", nodes[s as usize], nodes[r as usize])
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pair_crosses_nodes_when_there_are_two() {
        assert_eq!(choose(None, &[0, 0, 0, 1, 1]), Ok((0, 3)));
        assert_eq!(choose(None, &[0, 1, 0, 1]), Ok((0, 1)));
        assert_eq!(choose(None, &[0, 0, 0]), Ok((0, 1)));
        assert_eq!(choose(Some((2, 0)), &[0, 0, 0]), Ok((2, 0)));
    }

    #[test]
    fn a_bad_pair_is_named() {
        assert_eq!(choose(Some((1, 1)), &[0, 0]), Err("--pair 1,1: the pair must be two different ranks".into()));
        assert_eq!(choose(Some((0, 5)), &[0, 0]), Err("--pair 0,5: rank 5 is not in the world of 2 ranks".into()));
        assert!(choose(None, &[0]).unwrap_err().starts_with("fmx-perf needs at least 2 ranks; the launcher's world has 1 (start it"));
        assert!(parse("3").unwrap_err().contains("expected two ranks, A,B"));
        assert_eq!(parse("2, 7"), Ok((2, 7)));
    }

    #[test]
    fn streams_cross_nodes_when_there_are_two() {
        let parity = [0, 1, 0, 1];
        let order = streaming_order(&parity);
        assert_eq!(order, [0, 2, 1, 3]);
        assert_eq!(describe_streams(&order, &parity), "0 (node 0) -> 1 (node 1), 2 (node 0) -> 3 (node 1)");
        assert_eq!(streaming_order(&[0; 4]), [0, 1, 2, 3]);
        assert_eq!(describe_streams(&[0, 1, 2, 3], &[0; 4]), "0 (node 0) -> 2 (node 0), 1 (node 0) -> 3 (node 0)");
    }

    #[test]
    fn the_pair_leads_the_split_world() {
        let mut order: Vec<u32> = (0..5).collect();
        order.sort_by_key(|&r| key(r, (3, 1)));
        assert_eq!(order, [3, 1, 0, 2, 4]);
    }
}
