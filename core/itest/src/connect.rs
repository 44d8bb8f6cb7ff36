//! Rank-program scenarios for connections made on demand (`FMX_CONNECT`):
//! a sparse job connects only the peers it talks to, and ranks that all
//! start toward each other at once (crossing connects) neither deadlock nor
//! lose a message.

use fmx::{Comm, Error, Info, Reorder, Weights};

use crate::{fill, first_mismatch};

type R = Result<(), String>;

fn e2s(e: Error) -> String {
    e.to_string()
}

macro_rules! check {
    ($c:expr, $($m:tt)+) => {
        if !$c {
            return Err(format!($($m)+));
        }
    };
}

/// The peers a network transport holds connections to once every pair has
/// spoken, and whether they are made on demand. Shared memory holds none;
/// eagerly, a mixed transport's network half spans the world (same-node
/// ranks too); lazily, it connects only the ranks it carries messages to.
fn network_peers(w: &Comm) -> Result<(Vec<u32>, bool), String> {
    let me = w.rank();
    let others = (0..w.size()).filter(|&r| r != me);
    let mut routed = Vec::new();
    let mut lazy = false;
    for r in others.clone() {
        if w.transport_of(r).map_err(e2s)? != "shm" {
            routed.push(r);
            lazy |= w.connects_on_demand(r).map_err(e2s)?;
        }
    }
    // The mode asked for is the mode got (a transport that ignored
    // FMX_CONNECT=lazy would pass every check below as eager).
    let asked = std::env::var("FMX_CONNECT").ok();
    if !routed.is_empty() {
        if let Some(asked) = asked.as_deref().filter(|a| (*a == "lazy") != lazy) {
            return Err(format!(
                "rank {me}: FMX_CONNECT={asked}, but its network peers connect {}",
                if lazy { "lazily" } else { "eagerly" }
            ));
        }
    }
    if lazy || routed.is_empty() {
        return Ok((routed, lazy));
    }
    Ok((others.collect(), false))
}

/// The ranks `fmx.connections()` lists, after printing them with `when`.
fn connected(fmx: &fmx::Fmx, when: &str) -> Vec<u32> {
    let conns = fmx.connections();
    let list: Vec<String> = conns.iter().map(|c| format!("{}:{}@{}ms", c.rank, c.transport, c.made_after.as_millis())).collect();
    println!("CONNECTIONS rank {} {when}: {} [{}]", fmx.world().rank(), conns.len(), list.join(" "));
    conns.iter().map(|c| c.rank).collect()
}

/// Each rank exchanges only with its two ring neighbours (eager and
/// rendezvous sizes, checked): lazily, it then holds connections to those
/// two alone (eagerly, to every rank). Then an alltoall on the same job
/// connects every pair, and its results are checked.
pub fn sparse(fmx: &fmx::Fmx) -> R {
    let w = fmx.world();
    let (n, me) = (w.size(), w.rank());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let (net, lazy) = network_peers(w)?;
    let mut out = Vec::new();
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    let mut first = None;
    for round in 0..30u64 {
        let len = [8usize, 4096, 65536][round as usize % 3];
        out.resize(len, 0);
        got.resize(len, 0);
        for (to, from) in [(right, left), (left, right)] {
            fill(&mut out, me, round << 8 | u64::from(to));
            w.sendrecv(&out, to, 11, &mut got, from, 11).map_err(e2s)?;
            let m = first_mismatch(&got, from, round << 8 | u64::from(me));
            check!(m.is_none(), "round {round}: {len} B from {from} differ at {m:?}");
        }
        first.get_or_insert(t.elapsed());
    }
    let first = first.unwrap_or_default();
    println!("SPARSE rank {me}: first ring round {} us, all 30 rounds {} us", first.as_micros(), t.elapsed().as_micros());
    // Every rank has finished the ring before any counts (a rank that went on
    // to the alltoall would connect to us early), and has counted before any
    // goes on: a barrier over the ring's own connections.
    ring_barrier(w)?;
    let want: Vec<u32> = net.iter().copied().filter(|r| !lazy || *r == left || *r == right).collect();
    let have = connected(fmx, "after the ring");
    check!(have == want, "after the ring exchanges, connections to {have:?}, expected {want:?} (lazy: {lazy})");
    if lazy {
        check!(have.len() <= 2, "a ring neighbour exchange left {} connections", have.len());
    }
    let m = fmx.receive_memory();
    println!("RECVMEM rank {me}: eager_pool={} per_peer={} control={} resident={}", m.eager_pool, m.per_peer, m.control, m.eager_resident);
    // Lazily the eager memory is granted per connection: the two neighbours'
    // slices, no more (over a pair of transports the node's shared memory
    // adds a pool of its own: a network alone is checked).
    if lazy && !have.is_empty() && !w.transport_name().contains('+') {
        check!(
            m.eager_pool > 0 && m.eager_pool <= have.len() * m.per_peer,
            "with {} connections the eager pool is {} B, beyond {} slices of {} B",
            have.len(),
            m.eager_pool,
            have.len(),
            m.per_peer
        );
    }
    ring_barrier(w)?;
    let send: Vec<u64> = (0..n).map(|d| u64::from(me) << 32 | u64::from(d)).collect();
    let mut recv = vec![0u64; n as usize];
    w.alltoall(&send, &mut recv).map_err(e2s)?;
    check!((0..n).all(|s| recv[s as usize] == u64::from(s) << 32 | u64::from(me)), "alltoall: {recv:?}");
    let have = connected(fmx, "after an alltoall");
    check!(have == net, "after an alltoall, connections to {have:?}, expected every network peer {net:?}");
    Ok(())
}

/// A barrier that uses only the ring's connections: a token goes round
/// twice; when a rank sees it the second time, every rank has entered.
fn ring_barrier(w: &Comm) -> R {
    let (n, me) = (w.size(), w.rank());
    if n == 1 {
        return Ok(());
    }
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let mut token = [0u8];
    for _ in 0..2 {
        if me == 0 {
            w.send(&token, right, 12).map_err(e2s)?;
            w.recv(&mut token, left, 12).map_err(e2s)?;
        } else {
            w.recv(&mut token, left, 12).map_err(e2s)?;
            w.send(&token, right, 12).map_err(e2s)?;
        }
    }
    Ok(())
}

/// Every rank sends to every other at the same instant, 100 times, with no
/// barrier first: lazily, the first round opens every connection from both
/// ends at once. No deadlock, no lost or misdelivered message.
pub fn crossing(w: &Comm) -> R {
    let (n, me) = (w.size(), w.rank());
    let rounds = 100u32;
    for round in 0..rounds {
        let out: Vec<[u32; 3]> = (0..n).map(|d| [me, d, round]).collect();
        let mut inbox = vec![[u32::MAX; 3]; n as usize];
        w.scope(|s| {
            for (src, b) in inbox.iter_mut().enumerate().filter(|&(src, _)| src as u32 != me) {
                let _ = s.irecv(&mut b[..], src as u32, 13)?;
            }
            for dst in (0..n).filter(|&d| d != me) {
                let _ = s.isend(&out[dst as usize][..], dst, 13)?;
            }
            Ok(())
        })
        .map_err(|e| format!("round {round}: {e}"))?;
        for src in (0..n).filter(|&s| s != me) {
            let got = inbox[src as usize];
            check!(got == [src, me, round], "round {round}: from {src} got {got:?}, expected {:?}", [src, me, round]);
        }
    }
    println!("CROSSING rank {me}: {rounds} rounds with {} peers", n - 1);
    Ok(())
}

/// A ring graph created with `fmx_preconnect=true`: when it returns, every
/// rank holds connections to both its neighbours although no message went
/// between them; a neighbour exchange then runs on them. A bad value of the
/// key is an error naming it, on every rank.
pub fn preconnect(fmx: &fmx::Fmx) -> R {
    let w = fmx.world();
    let (n, me) = (w.size(), w.rank());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let nbrs = [left, right];
    let bad = w.dist_graph_create_adjacent(
        &nbrs,
        Weights::Unweighted,
        &nbrs,
        Weights::Unweighted,
        &Info::new().set("fmx_preconnect", "yes"),
        Reorder::No,
    );
    match bad {
        Err(e) if e.to_string().contains("fmx_preconnect=\"yes\"") => {}
        Err(e) => return Err(format!("fmx_preconnect=yes: the error does not name the key: {e}")),
        Ok(_) => return Err("fmx_preconnect=yes created a graph".into()),
    }
    // Without the adjacency check and credit sizing, creating the graph runs
    // only small tree collectives, which leave some neighbours unconnected.
    let info = Info::new().set("fmx_preconnect", "true").set("fmx_check_adjacent", "false").set("fmx_size_credits", "false");
    let g = w.dist_graph_create_adjacent(&nbrs, Weights::Unweighted, &nbrs, Weights::Unweighted, &info, Reorder::No).map_err(e2s)?;
    let have = connected(fmx, "after creating the graph");
    let (net, lazy) = network_peers(w)?;
    for r in nbrs.iter().filter(|r| net.contains(r)) {
        check!(have.contains(r), "neighbour {r} is not connected after the graph's creation with fmx_preconnect: {have:?}");
    }
    if lazy && n >= 8 {
        check!(have.len() < net.len(), "every peer is connected ({have:?}): the test cannot tell what fmx_preconnect did");
    }
    let mut plan = g.neighbor_alltoall_plan::<u64>(4).map_err(e2s)?;
    for j in 0..2 {
        plan.send_block_mut(j).map_err(e2s)?.fill(u64::from(me));
    }
    plan.run().map_err(e2s)?;
    for (i, src) in nbrs.iter().enumerate() {
        let got = plan.recv_block(i).map_err(e2s)?;
        check!(got.iter().all(|&x| x == u64::from(*src)), "from neighbour {src}: {got:?}");
    }
    Ok(())
}
