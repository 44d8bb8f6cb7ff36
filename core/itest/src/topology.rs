//! Rank-program scenarios for distributed graph topologies: the examples of
//! the MPI Forum ticket, random multigraphs against a sequential reference,
//! and bad input. Every rank computes the reference graph itself (it is the
//! test's oracle, not the library's input).

use fmx::{Block, Comm, DistGraphComm, Error, Info, Reorder, Weights};

type R = Result<(), String>;

fn e2s(e: Error) -> String {
    e.to_string()
}

/// An edge of a reference graph: ends, weight, and its global id.
#[derive(Clone, Copy, Debug)]
struct Edge {
    s: u32,
    d: u32,
    w: u32,
    id: u32,
}

/// splitmix64: the same stream on every rank for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The value element `t` of the block on edge `id` carries.
fn payload(id: u32, t: usize) -> u64 {
    u64::from(id) * 1000 + t as u64
}

/// In- and out-edges of `me` in the order fmx promises for `dist_graph_create`:
/// by peer, then by (giving rank, index there).
fn general_order(edges: &[Edge], giver: &[(u32, u32)], me: u32) -> (Vec<Edge>, Vec<Edge>) {
    let mut ins: Vec<Edge> = edges.iter().copied().filter(|e| e.d == me).collect();
    let mut outs: Vec<Edge> = edges.iter().copied().filter(|e| e.s == me).collect();
    ins.sort_by_key(|e| (e.s, giver[e.id as usize]));
    outs.sort_by_key(|e| (e.d, giver[e.id as usize]));
    (ins, outs)
}

/// Checks `neighbors()` against the expected lists and runs a
/// neighbor_alltoallv whose block on edge e has `count(e)` elements.
fn check_graph(g: &DistGraphComm, ins: &[Edge], outs: &[Edge], weighted: bool, count: impl Fn(u32) -> usize, what: &str) -> R {
    let (indeg, outdeg, w) = g.neighbors_count();
    if (indeg, outdeg, w) != (ins.len(), outs.len(), weighted) {
        return Err(format!("{what}: neighbors_count {:?}, expected {:?}", (indeg, outdeg, w), (ins.len(), outs.len(), weighted)));
    }
    let n = g.neighbors(indeg, outdeg);
    let want_src: Vec<u32> = ins.iter().map(|e| e.s).collect();
    let want_dst: Vec<u32> = outs.iter().map(|e| e.d).collect();
    if n.sources != want_src || n.destinations != want_dst {
        return Err(format!("{what}: neighbors {:?} -> {:?}, expected {want_src:?} -> {want_dst:?}", n.sources, n.destinations));
    }
    if weighted {
        let ws: Vec<u32> = ins.iter().map(|e| e.w).collect();
        let wd: Vec<u32> = outs.iter().map(|e| e.w).collect();
        if n.source_weights.as_deref() != Some(&ws[..]) || n.dest_weights.as_deref() != Some(&wd[..]) {
            return Err(format!("{what}: weights {:?} / {:?}, expected {ws:?} / {wd:?}", n.source_weights, n.dest_weights));
        }
    } else if n.source_weights.is_some() || n.dest_weights.is_some() {
        return Err(format!("{what}: an unweighted graph returned weights"));
    }
    // Truncated queries return a prefix.
    let t = g.neighbors(indeg / 2, outdeg.saturating_sub(1));
    if t.sources[..] != want_src[..indeg / 2] || t.destinations[..] != want_dst[..outdeg.saturating_sub(1)] {
        return Err(format!("{what}: truncated neighbors are not a prefix"));
    }
    if g.neighbors(indeg, outdeg) != n {
        return Err(format!("{what}: neighbors changed between calls"));
    }
    // neighbor_alltoallv, blocks packed with a one-element gap.
    let scounts: Vec<usize> = outs.iter().map(|e| count(e.id)).collect();
    let rcounts: Vec<usize> = ins.iter().map(|e| count(e.id)).collect();
    let gapped = |c: &[usize]| -> Vec<usize> { c.iter().scan(0, |a, &x| Some(std::mem::replace(a, *a + x + 1))).collect() };
    let (sd, rd) = (gapped(&scounts), gapped(&rcounts));
    let mut send = vec![0u64; scounts.iter().sum::<usize>() + outs.len()];
    for (j, e) in outs.iter().enumerate() {
        for t in 0..scounts[j] {
            send[sd[j] + t] = payload(e.id, t);
        }
    }
    let mut recv = vec![u64::MAX; rcounts.iter().sum::<usize>() + ins.len()];
    g.neighbor_alltoallv(&send, &scounts, &sd, &mut recv, &rcounts, &rd).map_err(e2s)?;
    for (i, e) in ins.iter().enumerate() {
        for t in 0..rcounts[i] {
            if recv[rd[i] + t] != payload(e.id, t) {
                return Err(format!("{what}: in-edge {i} (edge {} from {}) element {t}: got {}", e.id, e.s, recv[rd[i] + t]));
            }
        }
        if recv[rd[i] + rcounts[i]] != u64::MAX {
            return Err(format!("{what}: in-edge {i} wrote past its block"));
        }
    }
    // The same exchange as a persistent plan, twice.
    let mut plan = g.neighbor_alltoallv_plan::<u64>(&scounts, &rcounts).map_err(e2s)?;
    for round in 0..2u64 {
        for (j, e) in outs.iter().enumerate() {
            for (t, x) in plan.send_block_mut(j).map_err(e2s)?.iter_mut().enumerate() {
                *x = payload(e.id, t) ^ round;
            }
        }
        plan.run().map_err(|e| format!("{what}: plan: {e}"))?;
        for (i, e) in ins.iter().enumerate() {
            let got = plan.recv_block(i).map_err(e2s)?;
            if got.len() != rcounts[i] || got.iter().enumerate().any(|(t, &x)| x != payload(e.id, t) ^ round) {
                return Err(format!("{what}: plan round {round}: in-edge {i} got {got:?}"));
            }
        }
    }
    Ok(())
}

/// Example 7.3 built the three ways of the ticket: the same neighbours each time.
pub fn example_7_3(w: &Comm) -> R {
    if w.size() != 4 {
        return Err(format!("example 7.3 needs 4 ranks, got {}", w.size()));
    }
    let me = w.rank();
    let adj: [&[u32]; 4] = [&[1, 3], &[0], &[3], &[0, 2]];
    let edges: Vec<Edge> = adj
        .iter()
        .enumerate()
        .flat_map(|(s, ds)| ds.iter().map(move |&d| (s as u32, d)))
        .enumerate()
        .map(|(id, (s, d))| Edge { s, d, w: 1, id: id as u32 })
        .collect();
    let info = Info::new();
    // 1. Each process gives its outgoing edges (unweighted).
    let dests = adj[me as usize];
    let g1 = w.dist_graph_create(&[me], &[dests.len()], dests, Weights::Unweighted, &info, Reorder::No).map_err(e2s)?;
    let giver1: Vec<(u32, u32)> =
        edges.iter().map(|e| (e.s, adj[e.s as usize].iter().position(|&d| d == e.d).unwrap_or(0) as u32)).collect();
    let (ins, outs) = general_order(&edges, &giver1, me);
    check_graph(&g1, &ins, &outs, false, |_| 2, "7.3 outgoing")?;
    // 2. The whole graph on process 0, with unit weights.
    let (srcs, degs, dsts): (Vec<u32>, Vec<usize>, Vec<u32>) =
        if me == 0 { ((0..4).collect(), adj.iter().map(|a| a.len()).collect(), adj.concat()) } else { (vec![], vec![], vec![]) };
    let ones = vec![1u32; dsts.len()];
    let g2 = w.dist_graph_create(&srcs, &degs, &dsts, Weights::Values(&ones), &info, Reorder::No).map_err(e2s)?;
    let giver2: Vec<(u32, u32)> = edges.iter().map(|e| (0, e.id)).collect();
    let (ins2, outs2) = general_order(&edges, &giver2, me);
    check_graph(&g2, &ins2, &outs2, true, |id| id as usize % 3, "7.3 whole graph on 0")?;
    // 3. Adjacent: each process its in- and out-edges, as in the ticket's table.
    let sources: Vec<u32> = (0..4u32).filter(|&s| adj[s as usize].contains(&me)).collect();
    let sw = vec![1u32; sources.len()];
    let dw = vec![1u32; dests.len()];
    let g3 = w.dist_graph_create_adjacent(&sources, Weights::Values(&sw), dests, Weights::Values(&dw), &info, Reorder::No).map_err(e2s)?;
    let ins3: Vec<Edge> = sources.iter().map(|&s| *edges.iter().find(|e| e.s == s && e.d == me).unwrap_or(&edges[0])).collect();
    let outs3: Vec<Edge> = dests.iter().map(|&d| *edges.iter().find(|e| e.s == me && e.d == d).unwrap_or(&edges[0])).collect();
    check_graph(&g3, &ins3, &outs3, true, |_| 1, "7.3 adjacent")?;
    // The three agree on the neighbour sets.
    let sorted = |g: &DistGraphComm| {
        let n = g.neighbors(usize::MAX, usize::MAX);
        let (mut s, mut d) = (n.sources, n.destinations);
        s.sort_unstable();
        d.sort_unstable();
        (s, d)
    };
    if sorted(&g1) != sorted(&g2) || sorted(&g2) != sorted(&g3) {
        return Err(format!("7.3: the three constructions differ: {:?} {:?} {:?}", sorted(&g1), sorted(&g2), sorted(&g3)));
    }
    Ok(())
}

/// Example 7.4 on P x Q = size (Q = 2), built with dist_graph_create, one
/// source per rank, degree 8; every neighbourhood collective checked.
pub fn example_7_4(w: &Comm) -> R {
    let n = w.size();
    if n < 4 || n % 2 != 0 {
        return Err(format!("the torus needs an even number of ranks >= 4, got {n}"));
    }
    let me = w.rank();
    let mut edges = Vec::new();
    for r in 0..n {
        // The benchmark's torus: P = n/2, Q = 2 from 4 ranks.
        let (d, wt, _) = torus(r, n);
        for j in 0..8 {
            edges.push(Edge { s: r, d: d[j], w: wt[j], id: r * 8 + j as u32 });
        }
    }
    let (d, wt, _) = torus(me, n);
    let g = w.dist_graph_create(&[me], &[8], &d, Weights::Values(&wt), &Info::new(), Reorder::No).map_err(e2s)?;
    let giver: Vec<(u32, u32)> = edges.iter().map(|e| (e.s, e.id % 8)).collect();
    let (ins, outs) = general_order(&edges, &giver, me);
    check_graph(&g, &ins, &outs, true, |id| 1 + id as usize % 4, "7.4")?;
    // allgather: every in-neighbour's rank, 3 times.
    let mut got = vec![0u32; 3 * ins.len()];
    g.neighbor_allgather(&[me; 3], &mut got).map_err(e2s)?;
    let want: Vec<u32> = ins.iter().flat_map(|e| [e.s; 3]).collect();
    if got != want {
        return Err(format!("neighbor_allgather: {got:?}, expected {want:?}"));
    }
    // allgatherv: in-edge i's block at displacement 5*i (rank, rank+1).
    let rc = vec![2usize; ins.len()];
    let rd: Vec<usize> = (0..ins.len()).map(|i| 5 * i).collect();
    let mut got = vec![u32::MAX; 5 * ins.len()];
    g.neighbor_allgatherv(&[me, me + 1], &mut got, &rc, &rd).map_err(e2s)?;
    for (i, e) in ins.iter().enumerate() {
        if got[5 * i..5 * i + 3] != [e.s, e.s + 1, u32::MAX] {
            return Err(format!("neighbor_allgatherv: in-edge {i}: {:?}", &got[5 * i..5 * i + 3]));
        }
    }
    // alltoall: out-edge j's block is (edge id, me).
    let send: Vec<u32> = outs.iter().flat_map(|e| [e.id, me]).collect();
    let mut got = vec![0u32; 2 * ins.len()];
    g.neighbor_alltoall(&send, &mut got).map_err(e2s)?;
    let want: Vec<u32> = ins.iter().flat_map(|e| [e.id, e.s]).collect();
    if got != want {
        return Err(format!("neighbor_alltoall: {got:?}, expected {want:?}"));
    }
    let mut plan = g.neighbor_alltoall_plan::<u32>(2).map_err(e2s)?;
    plan.send_mut().map_err(e2s)?.copy_from_slice(&send);
    plan.run().map_err(e2s)?;
    if plan.recv().map_err(e2s)? != want {
        return Err(format!("neighbor_alltoall_plan: {:?}, expected {want:?}", plan.recv()));
    }
    nonblocking_and_persistent(&g, &ins, &outs)?;
    // alltoallw: u16 on even out-edges, u64 on odd ones (receivers know by the edge id).
    let elem = |id: u32| if id % 2 == 0 { 2usize } else { 8 };
    let mut send = Vec::new();
    let mut sblocks = Vec::new();
    for e in &outs {
        sblocks.push(Block { displ: send.len(), count: 1, elem_size: elem(e.id) });
        send.extend_from_slice(&u64::from(e.id).to_le_bytes()[..elem(e.id)]);
    }
    let mut rblocks = Vec::new();
    let mut len = 0;
    for e in &ins {
        rblocks.push(Block { displ: len, count: 1, elem_size: elem(e.id) });
        len += elem(e.id);
    }
    let mut recv = vec![0u8; len];
    g.neighbor_alltoallw(&send, &sblocks, &mut recv, &rblocks).map_err(e2s)?;
    for (e, b) in ins.iter().zip(&rblocks) {
        let mut v = [0u8; 8];
        v[..b.elem_size].copy_from_slice(&recv[b.displ..b.displ + b.elem_size]);
        if u64::from_le_bytes(v) != u64::from(e.id) {
            return Err(format!("neighbor_alltoallw: edge {} gave {}", e.id, u64::from_le_bytes(v)));
        }
    }
    Ok(())
}

/// Random multigraphs (self-loops, isolated ranks, zero-count edges), built
/// with both constructors and random partitions of who gives which edge.
pub fn random_graphs(w: &Comm) -> R {
    let (n, me) = (w.size(), w.rank());
    let seeds = std::env::var("FMX_ITEST_GRAPH_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(6u64);
    for seed in 0..seeds {
        let mut rng = Rng(seed * 7919 + u64::from(n));
        let m = rng.below(4 * u64::from(n) + 1) as u32;
        // Rank n-1 stays isolated in odd seeds (when there is more than one rank).
        let isolated = (seed % 2 == 1 && n > 1).then_some(n - 1);
        let pick = |rng: &mut Rng| loop {
            let r = rng.below(u64::from(n)) as u32;
            if Some(r) != isolated {
                break r;
            }
        };
        let edges: Vec<Edge> = (0..m)
            .map(|id| {
                let s = pick(&mut rng);
                // A self-loop now and then; repeated pairs happen by chance.
                let d = if rng.below(6) == 0 { s } else { pick(&mut rng) };
                Edge { s, d, w: rng.below(5) as u32, id }
            })
            .collect();
        let weighted = seed % 3 != 0;
        let count = |id: u32| ((u64::from(id) * 2_654_435_761 + seed) % 4) as usize;
        let what = format!("seed {seed} ({m} edges, {})", if weighted { "weighted" } else { "unweighted" });
        // General: edge e is given by a random rank, grouped by source there.
        let giver_rank: Vec<u32> = edges.iter().map(|_| rng.below(u64::from(n)) as u32).collect();
        let mine: Vec<Edge> = edges.iter().copied().filter(|e| giver_rank[e.id as usize] == me).collect();
        let mut srcs: Vec<u32> = mine.iter().map(|e| e.s).collect();
        srcs.dedup();
        let mut degs = Vec::new();
        let mut dsts = Vec::new();
        let mut wts = Vec::new();
        let mut giver = vec![(0u32, 0u32); edges.len()];
        let mut runs = Vec::new();
        for (k, e) in mine.iter().enumerate() {
            if k == 0 || mine[k - 1].s != e.s {
                runs.push(0usize);
            }
            *runs.last_mut().unwrap_or(&mut 0) += 1;
            giver[e.id as usize] = (me, dsts.len() as u32);
            dsts.push(e.d);
            wts.push(e.w);
        }
        degs.extend(runs);
        // Everyone needs everyone's (giver, index) to know the order: recompute them all.
        for r in 0..n {
            let mut k = 0u32;
            for e in edges.iter().filter(|e| giver_rank[e.id as usize] == r) {
                giver[e.id as usize] = (r, k);
                k += 1;
            }
        }
        let wv = if weighted { Weights::Values(&wts) } else { Weights::Unweighted };
        let g = w.dist_graph_create(&srcs, &degs, &dsts, wv, &Info::new(), Reorder::No).map_err(|e| format!("{what}: {e}"))?;
        let (ins, outs) = general_order(&edges, &giver, me);
        check_graph(&g, &ins, &outs, weighted, count, &format!("{what}, general"))?;
        // Adjacent: in- and out-edges by edge id (so both ends list multiple edges alike).
        let ins: Vec<Edge> = edges.iter().copied().filter(|e| e.d == me).collect();
        let outs: Vec<Edge> = edges.iter().copied().filter(|e| e.s == me).collect();
        let s: Vec<u32> = ins.iter().map(|e| e.s).collect();
        let d: Vec<u32> = outs.iter().map(|e| e.d).collect();
        let sw: Vec<u32> = ins.iter().map(|e| e.w).collect();
        let dw: Vec<u32> = outs.iter().map(|e| e.w).collect();
        let (swv, dwv) = if weighted { (Weights::Values(&sw), Weights::Values(&dw)) } else { (Weights::Unweighted, Weights::Unweighted) };
        let g = w.dist_graph_create_adjacent(&s, swv, &d, dwv, &Info::new(), Reorder::No).map_err(|e| format!("{what}: {e}"))?;
        check_graph(&g, &ins, &outs, weighted, count, &format!("{what}, adjacent"))?;
        if isolated == Some(me) && (g.neighbors_count().0, g.neighbors_count().1) != (0, 0) {
            return Err(format!("{what}: isolated rank {me} has neighbours"));
        }
    }
    Ok(())
}

/// Wrong input gives an error on every rank naming the problem, and the
/// communicator still works afterwards (no rank is left waiting).
pub fn bad_graphs(w: &Comm) -> R {
    let (n, me) = (w.size(), w.rank());
    if n < 2 {
        return Err("bad-graphs needs 2 ranks".into());
    }
    let info = Info::new();
    let expect = |r: Result<DistGraphComm, Error>, mine: &str, others: &str, what: &str| -> R {
        match r {
            Ok(_) => Err(format!("{what}: accepted")),
            Err(e) => {
                let text = e.to_string();
                if text.contains(mine) || text.contains(others) {
                    Ok(())
                } else {
                    Err(format!("{what}: error {text:?} names neither {mine:?} nor {others:?}"))
                }
            }
        }
    };
    // A destination outside the communicator, given by the last rank only.
    let d = if me == n - 1 { vec![n] } else { vec![] };
    let srcs = if me == n - 1 { vec![me] } else { vec![] };
    let degs = if me == n - 1 { vec![1] } else { vec![] };
    let r = w.dist_graph_create(&srcs, &degs, &d, Weights::Unweighted, &info, Reorder::No);
    expect(
        r,
        &format!("destinations[0] (edge {} -> {n}, of sources[0]): rank {n} does not exist", n - 1),
        &format!("rank {}'s arguments are invalid", n - 1),
        "rank outside",
    )?;
    // Degrees that do not add up.
    let r = w.dist_graph_create(&[me], &[2], &[0], Weights::Unweighted, &info, Reorder::No);
    expect(r, "degrees add up to Some(2) edges but 1 destinations are given", "arguments are invalid", "degrees")?;
    // Unweighted on rank 0 only.
    let one = [1u32];
    let wv = if me == 0 { Weights::Unweighted } else { Weights::Values(&one) };
    let r = w.dist_graph_create(&[me], &[1], &[me], wv, &info, Reorder::No);
    expect(r, "rank 1 passed weights but rank 0 passed Unweighted", "rank 1 passed weights", "unweighted mix")?;
    // Different info on rank 1.
    let other = Info::new().set("fmx_check_adjacent", "false");
    let r = w.dist_graph_create(&[], &[], &[], Weights::Unweighted, if me == 1 { &other } else { &info }, Reorder::No);
    expect(r, "rank 1's info differs from rank 0's", "rank 1's info differs", "info mismatch")?;
    // An unknown info key.
    let r = w.dist_graph_create(&[], &[], &[], Weights::Unweighted, &Info::new().set("fmx_quality", "best"), Reorder::No);
    expect(r, "info key \"fmx_quality\" is not known", "arguments are invalid", "unknown info key")?;
    // Adjacent edges described differently: rank 0 says 0 -> 1 weighs 2, rank 1 says 3.
    let (s, sw, d, dw): (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>) = match me {
        0 => (vec![], vec![], vec![1], vec![2]),
        1 => (vec![0], vec![3], vec![], vec![]),
        _ => (vec![], vec![], vec![], vec![]),
    };
    let r = w.dist_graph_create_adjacent(&s, Weights::Values(&sw), &d, Weights::Values(&dw), &info, Reorder::No);
    expect(
        r,
        "edges rank 0 -> rank 1: rank 0 declares 1 (weights [2]) among its destinations, rank 1 declares 1 (weights [3])",
        "rank 1 found an edge",
        "adjacent weights",
    )?;
    // An edge only one end declares; the check can be turned off (then it is the user's promise).
    let d = if me == 0 { vec![1] } else { vec![] };
    let r = w.dist_graph_create_adjacent(&[], Weights::Unweighted, &d, Weights::Unweighted, &info, Reorder::No);
    expect(
        r,
        "edges rank 0 -> rank 1: rank 0 declares 1 among its destinations, rank 1 declares 0",
        "rank 1 found an edge",
        "one-sided edge",
    )?;
    // A neighbour exchange whose counts disagree: ring 0 -> 1 -> ... ; rank 1 expects 3, rank 0 sends 2.
    let g = w
        .dist_graph_create_adjacent(&[(me + n - 1) % n], Weights::Unweighted, &[(me + 1) % n], Weights::Unweighted, &info, Reorder::No)
        .map_err(e2s)?;
    let sc = [if me == 0 { 2usize } else { 3 }];
    let send = [7u32; 3];
    let mut recv = [0u32; 3];
    let r = g.neighbor_alltoallv(&send, &sc, &[0], &mut recv, &[3], &[0]);
    match (me, r) {
        (1, Err(e)) if e.to_string().contains("in-edge 0 (from rank 0) delivered 2 elements but 3 were expected") => {}
        (1, other) => return Err(format!("short block: {other:?}")),
        (_, Err(e)) => return Err(format!("rank {me}: {e}")),
        (_, Ok(())) => {}
    }
    // Bad counts arrays are named locally.
    match g.neighbor_alltoallv(&send, &[1, 1], &[0, 1], &mut recv, &[1], &[0]) {
        Err(e) if e.to_string().contains("2 out counts and 2 displacements for 1 out-edges") => {}
        other => return Err(format!("counts length: {other:?}")),
    }
    // Nobody was left behind: the communicators still work.
    w.barrier().map_err(e2s)?;
    g.barrier().map_err(e2s)
}

/// Two non-blocking neighbourhood collectives overlapped in one scope, and a
/// persistent plan run many times (with its misuse errors).
fn nonblocking_and_persistent(g: &DistGraphComm, ins: &[Edge], outs: &[Edge]) -> R {
    let me = g.rank();
    let send: Vec<u32> = outs.iter().flat_map(|e| [e.id, me]).collect();
    let mut a2a = vec![0u32; 2 * ins.len()];
    let mut gathered = vec![0u32; ins.len()];
    g.scope(|s| {
        let a = g.ineighbor_alltoall(s, &send, &mut a2a)?;
        let b = g.ineighbor_allgather(s, std::slice::from_ref(&me), &mut gathered)?;
        b.wait(s)?;
        a.wait(s)
    })
    .map_err(e2s)?;
    let want: Vec<u32> = ins.iter().flat_map(|e| [e.id, e.s]).collect();
    let want_g: Vec<u32> = ins.iter().map(|e| e.s).collect();
    if a2a != want || gathered != want_g {
        return Err(format!("overlapped ineighbor_alltoall/allgather: {a2a:?} {gathered:?}, expected {want:?} {want_g:?}"));
    }
    // Persistent allgather(v) and alltoallw.
    let mut ag = g.neighbor_allgather_plan::<u32>(2).map_err(e2s)?;
    let mut agv = g.neighbor_allgatherv_plan::<u32>(1, &vec![1; ins.len()]).map_err(e2s)?;
    let elem = |id: u32| if id % 2 == 0 { 2usize } else { 8 };
    let sb: Vec<usize> = outs.iter().map(|e| elem(e.id)).collect();
    let rb: Vec<usize> = ins.iter().map(|e| elem(e.id)).collect();
    let mut aw = g.neighbor_alltoallw_plan(&sb, &rb).map_err(e2s)?;
    for round in 0..3u32 {
        ag.send_mut().map_err(e2s)?.copy_from_slice(&[me, me + 100 * round]);
        agv.send_mut().map_err(e2s)?.copy_from_slice(&[me + round]);
        for (j, e) in outs.iter().enumerate() {
            aw.send_block_mut(j).map_err(e2s)?.copy_from_slice(&u64::from(e.id + round).to_le_bytes()[..elem(e.id)]);
        }
        ag.run().map_err(e2s)?;
        agv.run().map_err(e2s)?;
        aw.run().map_err(e2s)?;
        for (i, e) in ins.iter().enumerate() {
            let mut v = [0u8; 8];
            v[..elem(e.id)].copy_from_slice(aw.recv_block(i).map_err(e2s)?);
            if ag.recv_block(i).map_err(e2s)? != [e.s, e.s + 100 * round]
                || agv.recv_block(i).map_err(e2s)? != [e.s + round]
                || u64::from_le_bytes(v) != u64::from(e.id + round)
            {
                return Err(format!("persistent allgather/allgatherv/alltoallw round {round}: in-edge {i} from {}", e.s));
            }
        }
    }
    let count = |id: u32| 1 + (id as usize * 7) % 5;
    let sc: Vec<usize> = outs.iter().map(|e| count(e.id)).collect();
    let rc: Vec<usize> = ins.iter().map(|e| count(e.id)).collect();
    let mut plan = g.neighbor_alltoallv_plan::<u64>(&sc, &rc).map_err(e2s)?;
    if plan.wait().is_ok() {
        return Err("wait() without start() was accepted".into());
    }
    let iters = 200u64;
    for it in 0..iters {
        for (j, e) in outs.iter().enumerate() {
            for (t, x) in plan.send_block_mut(j).map_err(e2s)?.iter_mut().enumerate() {
                *x = payload(e.id, t) + it * 1_000_000;
            }
        }
        plan.start().map_err(e2s)?;
        match plan.recv() {
            Err(e) if e.to_string().contains("in flight") => {}
            other => return Err(format!("recv() while in flight gave {other:?}")),
        }
        if plan.start().is_ok() {
            return Err("a second start() before wait() was accepted".into());
        }
        plan.wait().map_err(e2s)?;
        for (i, e) in ins.iter().enumerate() {
            let got = plan.recv_block(i).map_err(e2s)?;
            for (t, &x) in got.iter().enumerate() {
                if x != payload(e.id, t) + it * 1_000_000 {
                    return Err(format!("plan iteration {it}: in-edge {i} element {t} is {x}"));
                }
            }
        }
    }
    Ok(())
}

/// Reordering with pinned ranks: ranks 0 and 3 pass `Reorder::No`, the others
/// `Allowed`; places are pairs of ranks (`fmx_reorder_group=2`); heavy edges
/// join r and r + n/2. Pinned ranks keep their rank, the cut does not grow
/// (here it shrinks), and a neighbour exchange gives every process the same
/// data as without reordering.
pub fn reorder(w: &Comm) -> R {
    let (n, me) = (w.size(), w.rank());
    if n < 4 || n % 2 != 0 {
        return Err(format!("graph-reorder needs an even number of ranks >= 4, got {n}"));
    }
    let half = n / 2;
    let heavy = (me + half) % n;
    let (dests, weights) = (vec![heavy, (me + 1) % n], vec![10u32, 1]);
    let info = Info::new().set("fmx_reorder_group", "2");
    let pinned = me == 0 || me == 3;
    let mode = if pinned { Reorder::No } else { Reorder::Allowed };
    let g = w.dist_graph_create(&[me], &[2], &dests, Weights::Values(&weights), &info, mode).map_err(e2s)?;
    if pinned && g.rank() != me {
        return Err(format!("pinned rank {me} became rank {}", g.rank()));
    }
    let cost = g.mapping_cost().ok_or("no mapping cost after a reorder")?;
    if cost.after > cost.before || cost.after == cost.before {
        return Err(format!("the cut did not shrink: {cost:?}"));
    }
    // New rank -> old rank, to read neighbors() in old names.
    let mut old_of = vec![0u32; n as usize];
    g.allgather(&[me], &mut old_of).map_err(e2s)?;
    let nb = g.neighbors(usize::MAX, usize::MAX);
    let mut got_in: Vec<(u32, u32)> =
        nb.sources.iter().zip(nb.source_weights.as_deref().unwrap_or_default()).map(|(&s, &wt)| (old_of[s as usize], wt)).collect();
    let mut want_in = vec![((me + half) % n, 10u32), ((me + n - 1) % n, 1)];
    got_in.sort_unstable();
    want_in.sort_unstable();
    if got_in != want_in {
        return Err(format!("in-neighbours in old ranks {got_in:?}, expected {want_in:?}"));
    }
    // Every process sends its old rank along each out-edge: the data each
    // receives is what it would receive without reordering.
    let mut recv = vec![0u32; nb.sources.len()];
    g.neighbor_alltoall(&vec![me; nb.destinations.len()], &mut recv).map_err(e2s)?;
    let mut from: Vec<u32> = recv.clone();
    from.sort_unstable();
    let mut want: Vec<u32> = want_in.iter().map(|e| e.0).collect();
    want.sort_unstable();
    if from != want {
        return Err(format!("exchange after reorder delivered {recv:?}, expected old ranks {want:?}"));
    }
    // Nobody allowing it: ranks and costs stay as they were.
    let g2 = w.dist_graph_create(&[me], &[2], &dests, Weights::Values(&weights), &info, Reorder::No).map_err(e2s)?;
    if g2.rank() != me || g2.mapping_cost().is_some() {
        return Err(format!("Reorder::No everywhere changed rank {me} to {} or reported {:?}", g2.rank(), g2.mapping_cost()));
    }
    if me == 0 {
        println!("REORDER cut before {} after {}", cost.before, cost.after);
    }
    Ok(())
}

/// Eager pools sized by the torus (Example 7.4 on every rank): the resident
/// eager memory shrinks, and traffic of every kind still arrives intact,
/// including between processes that are not neighbours (one-slot windows).
pub fn sized_credits(fmx: &fmx::Fmx) -> R {
    let w = fmx.world();
    let (n, me) = (w.size(), w.rank());
    let before = fmx.receive_memory();
    let (d, wt, _) = torus(me, n);
    let g = w.dist_graph_create(&[me], &[8], &d, Weights::Values(&wt), &Info::new(), Reorder::No).map_err(e2s)?;
    let after = fmx.receive_memory();
    println!("POOL rank {me} eager resident before {} after {} bytes", before.eager_resident, after.eager_resident);
    // Connected on demand, memory is granted per connection as the graph's
    // creation connects the neighbours: at most a slice per connection.
    // (Over a pair of transports the node's shared memory adds its own pool:
    // only a network alone is checked so.)
    if (0..n).any(|r| w.connects_on_demand(r).unwrap_or(false)) {
        let conns = fmx.connections().len();
        if !w.transport_name().contains('+') && after.eager_resident > conns * after.per_peer {
            return Err(format!(
                "with {conns} connections made on demand, {} bytes of eager memory: beyond a slice of {} each",
                after.eager_resident, after.per_peer
            ));
        }
    } else {
        // From 8 ranks some processes are not neighbours (on 4, all are, with equal weights).
        let shrinks = w.transport_name() == "shm" && n >= 8;
        if after.eager_resident > before.eager_resident || (shrinks && after.eager_resident >= before.eager_resident) {
            return Err(format!("eager memory went from {} to {} bytes", before.eager_resident, after.eager_resident));
        }
    }
    let (indeg, outdeg, _) = g.neighbors_count();
    let nb = g.neighbors(indeg, outdeg);
    // Neighbour exchanges, eager (a plan) and rendezvous (64 KiB blocks).
    for k in [512usize, 8192] {
        let mut plan = g.neighbor_alltoall_plan::<u64>(k).map_err(e2s)?;
        for round in 0..20u64 {
            for j in 0..outdeg {
                let v = u64::from(me) << 32 | round << 16 | j as u64;
                plan.send_block_mut(j).map_err(e2s)?.fill(v);
            }
            plan.run().map_err(e2s)?;
            for i in 0..indeg {
                let got = plan.recv_block(i).map_err(e2s)?;
                if got.iter().any(|&x| x >> 32 != u64::from(nb.sources[i]) || (x >> 16) & 0xffff != round) {
                    return Err(format!("k={k} round {round}: in-edge {i} from {} got {:#x}", nb.sources[i], got[0]));
                }
            }
        }
    }
    // Every pair, neighbours or not: a world alltoall and a burst of eager messages.
    let block = 256usize;
    let send: Vec<u32> = (0..n).flat_map(|r| (0..block as u32).map(move |t| me << 20 | r << 10 | t)).collect();
    let mut recv = vec![0u32; send.len()];
    for _ in 0..10 {
        w.alltoall(&send, &mut recv).map_err(e2s)?;
        for r in 0..n as usize {
            if recv[r * block] != (r as u32) << 20 | me << 10 {
                return Err(format!("alltoall block from {r}: {:#x}", recv[r * block]));
            }
        }
    }
    // One direction only, from rank 0 to a rank it has no edge to (a one-slot
    // window there): credits must come back without reverse traffic.
    if let Some(t) = (1..n).find(|r| !torus(0, n).0.contains(r)) {
        let payload = [7u8; 512];
        let mut inbox = [0u8; 512];
        for i in 0..100 {
            if me == 0 {
                w.send(&payload, t, 5).map_err(|e| format!("one-way message {i} to {t}: {e}"))?;
            } else if me == t {
                w.recv(&mut inbox, 0, 5).map_err(e2s)?;
                if inbox != payload {
                    return Err(format!("one-way message {i} differs"));
                }
            }
        }
    }
    w.barrier().map_err(e2s)?;
    let msgs = 50usize;
    let out: Vec<Vec<u8>> = (0..n).map(|r| (0..1024).map(|i| (me as usize * 7 + r as usize * 13 + i) as u8).collect()).collect();
    let mut inbox: Vec<Vec<u8>> = (0..n as usize * msgs).map(|_| vec![0u8; 1024]).collect();
    w.scope(|s| {
        let mut slots = inbox.iter_mut();
        for src in (0..n).filter(|&r| r != me) {
            for _ in 0..msgs {
                let b = slots.next().expect("a slot per message");
                let _ = s.irecv(&mut b[..], src, 9)?;
            }
        }
        for dst in (0..n).filter(|&r| r != me) {
            for _ in 0..msgs {
                let _ = s.isend(&out[dst as usize][..], dst, 9)?;
            }
        }
        Ok(())
    })
    .map_err(e2s)?;
    let mut k = 0;
    for src in (0..n).filter(|&r| r != me) {
        for _ in 0..msgs {
            let want: Vec<u8> = (0..1024).map(|i| (src as usize * 7 + me as usize * 13 + i) as u8).collect();
            if inbox[k] != want {
                return Err(format!("burst message from {src} differs"));
            }
            k += 1;
        }
    }
    Ok(())
}

/// Destinations and weights of `rank` in the n-rank torus of Example 7.4 of
/// the MPI Forum ticket (P x Q, Q = 2 from 4 ranks on, diagonal edges of weight
/// 1, straight ones of weight 2); the neighbour benchmark uses it too.
pub fn torus(rank: u32, n: u32) -> ([u32; 8], [u32; 8], (u32, u32)) {
    let q = if n >= 4 && n % 2 == 0 { 2 } else { 1 };
    let p = n / q;
    let (y, x) = (rank / p, rank % p);
    let d = [
        p * y + (x + 1) % p,
        p * y + (p + x - 1) % p,
        p * ((y + 1) % q) + x,
        p * ((q + y - 1) % q) + x,
        p * ((y + 1) % q) + (x + 1) % p,
        p * ((q + y - 1) % q) + (x + 1) % p,
        p * ((y + 1) % q) + (p + x - 1) % p,
        p * ((q + y - 1) % q) + (p + x - 1) % p,
    ];
    (d, [2, 2, 2, 2, 1, 1, 1, 1], (p, q))
}

/// Each rank's two ring neighbours, left then right (both in- and out-edges),
/// and the unweighted graph communicator over them.
pub fn ring_graph(w: &fmx::Comm) -> Result<([u32; 2], DistGraphComm), String> {
    let (me, n) = (w.rank(), w.size());
    let ring = [(me + n - 1) % n, (me + 1) % n];
    let g = w
        .dist_graph_create_adjacent(&ring, Weights::Unweighted, &ring, Weights::Unweighted, &Info::default(), Reorder::No)
        .map_err(|e| format!("the ring graph: {e}"))?;
    Ok((ring, g))
}
