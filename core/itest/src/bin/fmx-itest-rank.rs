//! Rank program of the integration tests: `fmx-itest-rank SCENARIO`, run by
//! the tests under the fmx launcher. Prints `OK SCENARIO` on success; on a
//! failed check prints `FAIL ...` and exits 1.

use fmx::{Comm, Error, Op, SendAttempt, Source, Tag};
use fmx_itest::{fill, first_mismatch};

type R = Result<(), String>;

macro_rules! check {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!("line {}: {}", line!(), format!($($fmt)*)));
        }
    };
}

/// Which transport carries this rank's traffic (the tests check it).
fn announce(fmx: &fmx::Fmx) {
    println!("TRANSPORT {}", fmx.world().transport_name());
}

/// Which transport carries each peer's messages (and, under parity, which
/// node `Fmx::locality` says). Under a mixed transport
/// with `FMX_ITEST_NODES=parity` (the two-namespace test puts odd ranks on
/// the other "node"), peers of our parity go over shared memory and the
/// others over the network; otherwise every peer uses the one transport.
fn routes(fmx: &fmx::Fmx, w: &Comm) -> R {
    let me = w.rank();
    // Fmx::locality reports the node map the transport was chosen by: under
    // parity, two nodes of the even and the odd ranks.
    if std::env::var("FMX_ITEST_NODES").is_ok_and(|v| v == "parity") && w.transport_name().contains('+') {
        let loc = fmx.locality();
        let want = (me % 2, 2, me / 2, w.size().div_ceil(2) - (me % 2) * (w.size() % 2));
        let got = (loc.node, loc.nodes, loc.local_rank, loc.local_size);
        check!(got == want, "locality (node, nodes, local rank, local size) is {got:?}, expected {want:?}");
    }
    let name = w.transport_name();
    let parity = std::env::var("FMX_ITEST_NODES").is_ok_and(|v| v == "parity");
    let mut seen = Vec::new();
    for r in 0..w.size() {
        let got = w.transport_of(r).map_err(e2s)?;
        let want = match name.split_once('+') {
            Some((local, net)) if parity => {
                if r % 2 == me % 2 {
                    local
                } else {
                    net
                }
            }
            Some((local, _)) => local,
            None => name,
        };
        check!(got == want, "rank {r} goes over {got}, expected {want} (transport {name})");
        seen.push(got);
    }
    check!(w.transport_of(w.size()).is_err(), "transport_of({}) is not an error", w.size());
    println!("ROUTES {}", seen.join(","));
    // Fmx::connections: shared memory keeps none per peer; a network
    // transport (alone, or a mixed one's network half) connects to every
    // other rank during init, once each (FMX_CONNECT=eager), or lazily only
    // to those a message went between: after init none; after an alltoall,
    // every rank.
    let net = match name.split_once('+') {
        Some((_, net)) => Some(net),
        None if name == "shm" => None,
        None => Some(name),
    };
    let n = w.size();
    // Eagerly a mixed transport's network half spans the world (same-node
    // ranks too); lazily it connects only the ranks it carries messages to.
    let lazy = (0..n).any(|r| w.connects_on_demand(r).unwrap_or(false));
    let all: Vec<(u32, &str)> = (0..n)
        .filter(|&r| r != me)
        .filter_map(|r| Some((r, net?)))
        .filter(|&(r, t)| !lazy || w.transport_of(r).is_ok_and(|x| x == t))
        .collect();
    let after_init: Vec<(u32, &str)> = if lazy { Vec::new() } else { all.clone() };
    let connections = |want: &[(u32, &str)], when: &str| -> R {
        let conns = fmx.connections();
        let got: Vec<(u32, &str)> = conns.iter().map(|c| (c.rank, c.transport)).collect();
        check!(got == want, "connections {when}: {got:?}, expected {want:?} (transport {name}, lazy {lazy})");
        check!(conns.iter().all(|c| c.made_after > std::time::Duration::ZERO), "a connection made before init began: {conns:?}");
        let ms: Vec<u128> = conns.iter().map(|c| c.made_after.as_millis()).collect();
        println!("CONNECTIONS rank {me} {when}: {} over {}, made {:?} ms into init", conns.len(), net.unwrap_or("-"), ms);
        Ok(())
    };
    connections(&after_init, "after init")?;
    // Traffic both ways on every route: a ring of 8 B and 1 MiB, then an alltoall.
    for len in [8usize, 1 << 20] {
        let out = vec![me as u8; len];
        let mut got = vec![0u8; len];
        w.sendrecv(&out, (me + 1) % n, 3, &mut got, (me + n - 1) % n, 3).map_err(e2s)?;
        check!(got.iter().all(|&b| b == ((me + n - 1) % n) as u8), "{len} B from the left differ");
    }
    let out: Vec<u32> = (0..n).map(|r| me << 16 | r).collect();
    let mut got = vec![0u32; n as usize];
    w.alltoall(&out, &mut got).map_err(e2s)?;
    check!((0..n).all(|r| got[r as usize] == r << 16 | me), "alltoall: {got:?}");
    connections(&all, "after an alltoall")
}

/// A registered buffer sent 100 times is registered once; a plain slice that
/// is freed and whose address is reused with other contents delivers the new
/// contents every time (no stale registration can exist).
fn registered(fmx: &fmx::Fmx, w: &Comm) -> R {
    if w.rank() > 1 {
        return Ok(());
    }
    let peer = 1 - w.rank();
    // Above the eager and bounce limits, below the split threshold: one
    // one-sided operation per message on each side.
    let n = 100_000;
    let before = fmx.registration_stats();
    let mut buf = fmx.alloc_registered::<u8>(n).map_err(e2s)?;
    let after_alloc = fmx.registration_stats();
    for i in 0..100u64 {
        if w.rank() == 0 {
            fill(&mut buf, 0, i);
            w.send(&buf[..], peer, i as i32).map_err(e2s)?;
        } else {
            buf.fill(0);
            let st = w.recv(&mut buf[..], peer, i as i32).map_err(e2s)?;
            check!(st.count == n, "registered round {i}: count {}", st.count);
            check!(first_mismatch(&buf, 0, i).is_none(), "registered round {i} differs at {:?}", first_mismatch(&buf, 0, i));
        }
    }
    let end = fmx.registration_stats();
    drop(buf);
    // Plain slices, bounced (32 KiB) and registered per operation (300 KiB,
    // which glibc maps and unmaps: the next one often gets the same address).
    let mut reused = 0;
    for &len in &[32usize << 10, 300 << 10] {
        let mut last = 0usize;
        for round in 0..20u64 {
            let tag = 1000 + round as i32;
            let mut v = vec![0u8; len];
            if w.rank() == 0 {
                fill(&mut v, 7, round);
                reused += usize::from(v.as_ptr() as usize == last);
                last = v.as_ptr() as usize;
                w.send(&v, peer, tag).map_err(e2s)?;
            } else {
                let st = w.recv(&mut v, peer, tag).map_err(e2s)?;
                check!(st.count == len, "plain {len} round {round}: count {}", st.count);
                check!(
                    first_mismatch(&v, 7, round).is_none(),
                    "plain {len} round {round}: stale or wrong data at {:?}",
                    first_mismatch(&v, 7, round)
                );
            }
            drop(v);
        }
    }
    println!(
        "REGSTATS owned_registrations={} per_op_during_owned={} owned_hits={} reused_addresses={reused} ",
        after_alloc.registrations - before.registrations,
        end.per_operation - after_alloc.per_operation,
        end.owned_hits - after_alloc.owned_hits,
    );
    Ok(())
}

fn e2s(e: Error) -> String {
    e.to_string()
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    if scenario == "join" {
        fmx_itest::report(&scenario, join());
        return;
    }
    if scenario == "am" {
        fmx_itest::report(&scenario, active_messages());
        return;
    }
    let fmx = match fmx::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("FAIL init: {e}");
            std::process::exit(1);
        }
    };
    announce(&fmx);
    if scenario == "abort" {
        // Rank 1 ends the job; the others wait on it for ever (only the
        // launcher's kill ends them).
        if fmx.world().rank() == 1 {
            fmx.abort(7, "the test asks rank 1 to abort");
        }
        let r = fmx.world().recv(&mut [0u8; 1], 1, 5);
        fmx_itest::report(&scenario, Err(format!("the wait on rank 1 ended: {r:?}")));
        std::process::exit(1);
    }
    if scenario == "node-loss" {
        // Ends the job through the launcher, as MPI_Abort would: the ranks of
        // the lost node cannot finalize.
        match node_loss(&fmx) {
            Ok(Survivor::Leader { lost }) => fmx.abort(4, &format!("lost ranks {lost:?} (their node is gone)")),
            // A survivor that is not its node's leader: the leader ends the
            // job. It must not exit first: under Hydra the first rank to exit
            // non-zero ends the job, killing the leader before it has named
            // every lost rank. It waits for the leader's abort to kill it (a
            // message never sent; a leader that dies instead ends the wait).
            Ok(Survivor::Member { leader }) => {
                let r = fmx.world().recv(&mut [0u8; 1], leader, 79);
                eprintln!("node-loss: the wait on the leader, rank {leader}, ended: {r:?}");
                std::process::exit(4)
            }
            Err(e) => {
                fmx_itest::report(&scenario, Err(e));
                std::process::exit(1);
            }
        }
    }
    let w = fmx.world();
    let r = match scenario.as_str() {
        "registered" => registered(&fmx, w),
        "identity" => fmx_itest::launchers::identity(&fmx),
        "graph-7.3" => fmx_itest::topology::example_7_3(w),
        "graph-7.4" => fmx_itest::topology::example_7_4(w),
        "graph-random" => fmx_itest::topology::random_graphs(w),
        "graph-errors" => fmx_itest::topology::bad_graphs(w),
        "graph-reorder" => fmx_itest::topology::reorder(w),
        "graph-credits" => fmx_itest::topology::sized_credits(&fmx),
        "spawn" => fmx_itest::launchers::spawn(&fmx, 3),
        "spawn-child" => fmx_itest::launchers::spawn_child(&fmx),
        "p2p-order" => p2p_order(w),
        "zero" => zero(w),
        "credit-stall" => credit_stall(w),
        "truncate" => truncate(w),
        "sizes" => sizes(w),
        "coll" => coll(w),
        "early-exit" => early_exit(w),
        "bad-input" => bad_input(w),
        "dup-split" => dup_split(w),
        "ring" => ring(w),
        "stress" => stress(w, false),
        "stress-sizes" => stress(w, true),
        "routes" => routes(&fmx, w),
        "sparse" => fmx_itest::connect::sparse(&fmx),
        "crossing" => fmx_itest::connect::crossing(w),
        "preconnect" => fmx_itest::connect::preconnect(&fmx),
        // The last rank finishes 3 s after the others (more than FMX_PMI_TIMEOUT in the test).
        "late-finalize" => {
            if w.rank() + 1 == w.size() {
                std::thread::sleep(std::time::Duration::from_secs(3));
            }
            fmx.finalize().map_err(e2s)
        }
        "finalize-use" => {
            let c = w.dup().map_err(e2s);
            let r = c.and_then(|c| {
                fmx.finalize().map_err(e2s)?;
                match c.send(&[1u8], 0, 0) {
                    Err(Error::Finalized(_)) => {}
                    other => return Err(format!("send after finalize gave {other:?}")),
                }
                match c.barrier() {
                    Err(Error::Finalized(_)) => Ok(()),
                    other => Err(format!("barrier after finalize gave {other:?}")),
                }
            });
            fmx_itest::report(&scenario, r);
            return;
        }
        other => Err(format!("unknown scenario {other:?}")),
    };
    fmx_itest::report(&scenario, r);
    if let Err(e) = fmx.finalize() {
        eprintln!("FAIL finalize: {e}");
        std::process::exit(1);
    }
}

/// Matching order, wildcards, pre-posted receives, probe and test.
fn p2p_order(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size());
    if me != 0 {
        for (seq, tag) in [(0u32, 5), (1, 6), (2, 5)] {
            w.send(&[me, seq], 0, tag).map_err(e2s)?;
        }
    } else {
        let mut m = [0u32; 2];
        let st = w.recv(&mut m, 1, 5).map_err(e2s)?;
        check!(m == [1, 0] && st.source == 1 && st.tag == 5 && st.count == 2, "first (1,5): {m:?} {st:?}");
        let st = w.recv(&mut m, 1, Tag::Any).map_err(e2s)?;
        check!(m == [1, 1] && st.tag == 6, "(1,any) must be the tag-6 message: {m:?} {st:?}");
        w.recv(&mut m, 1, 5).map_err(e2s)?;
        check!(m == [1, 2], "second (1,5): {m:?}");
        let mut next = vec![0u32; n as usize];
        for _ in 0..3 * (n - 2) {
            let st = w.recv(&mut m, Source::Any, Tag::Any).map_err(e2s)?;
            let src = st.source as usize;
            check!(m[0] == st.source && m[1] == next[src], "from {src}: got {m:?}, expected seq {} (non-overtaking)", next[src]);
            let want_tag = if m[1] == 1 { 6 } else { 5 };
            check!(st.tag == want_tag, "tag {} for seq {}", st.tag, m[1]);
            next[src] += 1;
        }
    }
    // Pre-posted receives: the earliest matching posted receive wins.
    w.barrier().map_err(e2s)?;
    if me == 0 {
        let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
        w.scope(|s| {
            let ra = s.irecv(&mut a, Source::Any, 9)?;
            let rb = s.irecv(&mut b, 1, 9)?;
            s.comm().barrier()?;
            let sa = s.wait(ra)?;
            let sb = s.wait(rb)?;
            if sa.source != 1 || sb.source != 1 {
                return Err(Error::Bootstrap(format!("sources {sa:?} {sb:?}")));
            }
            Ok(())
        })
        .map_err(e2s)?;
        check!(a == *b"aaaa" && b == *b"bbbb", "posted order: a={a:?} b={b:?}");
    } else {
        w.barrier().map_err(e2s)?;
        if me == 1 {
            w.send(b"aaaa", 0, 9).map_err(e2s)?;
            w.send(b"bbbb", 0, 9).map_err(e2s)?;
        }
    }
    // Probe, then receive; test until done.
    if me == 1 {
        w.send(&[7u8; 12], 0, 11).map_err(e2s)?;
        w.send(&[8u8; 3], 0, 12).map_err(e2s)?;
    } else if me == 0 {
        let st = w.probe(1, 11).map_err(e2s)?;
        check!(st.source == 1 && st.tag == 11 && st.bytes == 12, "probe: {st:?}");
        let mut buf = vec![0u8; st.bytes as usize];
        w.recv(&mut buf, 1, 11).map_err(e2s)?;
        check!(buf == [7u8; 12], "after probe: {buf:?}");
        let mut small = [0u8; 3];
        let st = w
            .scope(|s| {
                let r = s.irecv(&mut small, 1, 12)?;
                while !s.test(&r)? {}
                s.wait(r)
            })
            .map_err(e2s)?;
        check!(small == [8; 3] && st.count == 3, "test/wait: {small:?} {st:?}");
        check!(w.iprobe(Source::Any, Tag::Any).map_err(e2s)?.is_none(), "nothing else pending");
    }
    Ok(())
}

fn zero(w: &Comm) -> R {
    if w.rank() == 1 {
        w.send::<u8>(&[], 0, 1).map_err(e2s)?;
        w.send::<u64>(&[], 0, 2).map_err(e2s)?;
    } else if w.rank() == 0 {
        let st = w.recv::<u8>(&mut [], 1, 1).map_err(e2s)?;
        check!(st.count == 0 && st.bytes == 0 && st.tag == 1, "{st:?}");
        let mut big = [9u64; 4];
        let st = w.recv(&mut big, Source::Any, Tag::Any).map_err(e2s)?;
        check!(st.count == 0 && st.tag == 2 && big == [9; 4], "{st:?} {big:?}");
    }
    Ok(())
}

/// Rank 0 sends 8 eager messages to rank 1, which sleeps 300 ms before
/// taking them: with one slot per peer (FMX_POOL_SLOTS = n - 1), rank 0's
/// second send waits for a credit at least that long (FMX_LOG reports it).
fn credit_stall(w: &Comm) -> R {
    match w.rank() {
        0 => {
            let msgs: Vec<u64> = (0..8).collect();
            w.scope(|s| {
                for m in &msgs {
                    let _ = s.isend(std::slice::from_ref(m), 1, 7)?;
                }
                Ok(())
            })
            .map_err(e2s)?;
        }
        1 => {
            std::thread::sleep(std::time::Duration::from_millis(300));
            for i in 0..8u64 {
                let mut b = [0u64];
                w.recv(&mut b, 0, 7).map_err(e2s)?;
                check!(b[0] == i, "message {i} arrived as {}", b[0]);
            }
        }
        _ => {}
    }
    w.barrier().map_err(e2s)
}

fn truncate(w: &Comm) -> R {
    for (m, len, cap) in [(0u64, 100usize, 10usize), (1, 1 << 20, 512 << 10)] {
        if w.rank() == 1 {
            let mut b = vec![0u8; len];
            fill(&mut b, 1, m);
            w.send(&b, 0, 3).map_err(e2s)?;
        } else if w.rank() == 0 {
            let mut b = vec![0u8; cap];
            match w.recv(&mut b, 1, 3) {
                Err(Error::Truncated { source_rank: 1, tag: 3, sent, capacity }) if sent == len as u64 && capacity == cap as u64 => {}
                other => return Err(format!("expected truncation of {len} into {cap}, got {other:?}")),
            }
        }
        // Communication goes on normally afterwards.
        let mut x = [0u32];
        w.allreduce(&[1u32], &mut x, Op::Sum).map_err(e2s)?;
        check!(x[0] == w.size(), "allreduce after truncation: {x:?}");
    }
    Ok(())
}

const SIZES: &[usize] =
    &[0, 1, 2, 3, 7, 8, 63, 64, 65, 1000, 16343, 16344, 16345, 65536, 131071, 131072, 131073, (1 << 20) + 3, 4 << 20, 64 << 20];

/// Ping-pong of every size with content checks, blocking and non-blocking.
fn sizes(w: &Comm) -> R {
    if w.rank() > 1 {
        return Ok(());
    }
    let peer = 1 - w.rank();
    for (k, &len) in SIZES.iter().enumerate() {
        let m = k as u64;
        if std::env::var_os("FMX_ITEST_TRACE").is_some() {
            eprintln!("rank {} size {len}", w.rank());
        }
        let mut buf = vec![0u8; len];
        if w.rank() == 0 {
            fill(&mut buf, 0, m);
            w.send(&buf, peer, k as i32).map_err(e2s)?;
            buf.fill(0);
            let st = w.recv(&mut buf, peer, k as i32).map_err(e2s)?;
            check!(st.count == len, "echo of {len}: count {}", st.count);
            check!(first_mismatch(&buf, 1, m).is_none(), "echo of {len} bytes differs at {:?}", first_mismatch(&buf, 1, m));
        } else {
            let st = w.recv(&mut buf, peer, k as i32).map_err(e2s)?;
            check!(st.count == len, "{len}: count {}", st.count);
            check!(first_mismatch(&buf, 0, m).is_none(), "{len} bytes differ at {:?}", first_mismatch(&buf, 0, m));
            fill(&mut buf, 1, m);
            w.send(&buf, peer, k as i32).map_err(e2s)?;
        }
    }
    // Non-blocking, many in flight in both directions, mixed sizes.
    let lens = [5usize, 20_000, 300_000, 0, 2 << 20, 17];
    let outs: Vec<Vec<u8>> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let mut b = vec![0u8; l];
            fill(&mut b, w.rank(), 100 + i as u64);
            b
        })
        .collect();
    let mut ins: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
    w.scope(|s| {
        let mut reqs = Vec::new();
        for (i, b) in ins.iter_mut().enumerate() {
            reqs.push(s.irecv(b, peer, i as i32)?);
        }
        for (i, b) in outs.iter().enumerate().rev() {
            reqs.push(s.isend(b, peer, i as i32)?);
        }
        s.wait_all(reqs).map(drop)
    })
    .map_err(e2s)?;
    for (i, b) in ins.iter().enumerate() {
        check!(first_mismatch(b, peer, 100 + i as u64).is_none(), "non-blocking message {i} ({} bytes) differs", b.len());
    }
    Ok(())
}

/// Displacements that place `counts` one after another with `gap` unused elements between them.
fn displacements(counts: &[usize], gap: usize) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |next, &c| {
            let d = *next;
            *next += c + gap;
            Some(d)
        })
        .collect()
}

fn val(rank: u32, i: usize) -> i64 {
    (i64::from(rank) + 1) * 1000 + (i as i64 % 997) - 400
}

/// Every collective against a sequential reference, several sizes and roots.
fn coll(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size());
    let nn = n as usize;
    w.barrier().map_err(e2s)?;
    for len in [1usize, 7, 100, 20_000] {
        let mine: Vec<i64> = (0..len).map(|i| val(me, i)).collect();
        // allreduce with every op
        for (name, op) in [("sum", Op::Sum), ("min", Op::Min), ("max", Op::Max)] {
            let mut out = vec![0i64; len];
            w.allreduce(&mine, &mut out, op).map_err(e2s)?;
            for i in 0..len {
                let all = (0..n).map(|r| val(r, i));
                let want = match name {
                    "sum" => all.sum(),
                    "min" => all.min().unwrap_or(0),
                    _ => all.max().unwrap_or(0),
                };
                check!(out[i] == want, "allreduce {name} len {len} n {n}: [{i}] = {} want {want}", out[i]);
            }
        }
        let xor = |a: &[i64], b: &mut [i64]| b.iter_mut().zip(a).for_each(|(o, &x)| *o ^= x);
        let mut out = vec![0i64; len];
        w.allreduce(&mine, &mut out, Op::User(&xor)).map_err(e2s)?;
        for i in 0..len {
            let want = (0..n).fold(0, |a, r| a ^ val(r, i));
            check!(out[i] == want, "allreduce user xor len {len}: [{i}]");
        }
        for root in 0..n {
            // reduce
            let mut out = vec![0i64; if me == root { len } else { 0 }];
            w.reduce(&mine, &mut out, Op::Sum, root).map_err(e2s)?;
            if me == root {
                for i in 0..len {
                    let want: i64 = (0..n).map(|r| val(r, i)).sum();
                    check!(out[i] == want, "reduce len {len} root {root}: [{i}]");
                }
            }
            // bcast
            let mut b: Vec<i64> = if me == root { mine.clone() } else { vec![0; len] };
            w.bcast(&mut b, root).map_err(e2s)?;
            check!((0..len).all(|i| b[i] == val(root, i)), "bcast len {len} root {root}");
            // gather / scatter
            let mut g = vec![0i64; if me == root { len * nn } else { 0 }];
            w.gather(&mine, &mut g, root).map_err(e2s)?;
            if me == root {
                check!((0..nn).all(|r| (0..len).all(|i| g[r * len + i] == val(r as u32, i))), "gather len {len} root {root}");
            }
            let src: Vec<i64> = if me == root { (0..nn * len).map(|k| val((k / len) as u32, k)).collect() } else { vec![] };
            let mut sc = vec![0i64; len];
            w.scatter(&src, &mut sc, root).map_err(e2s)?;
            check!((0..len).all(|i| sc[i] == val(me, me as usize * len + i)), "scatter len {len} root {root}");
            // gatherv / scatterv with rank-dependent counts (rank r: r % 3 * len / 2 elements), reversed placement
            let counts: Vec<usize> = (0..nn).map(|r| (r % 3) * len / 2).collect();
            let total: usize = counts.iter().sum();
            let mut displs = vec![0usize; nn];
            let mut off = 0;
            for r in (0..nn).rev() {
                displs[r] = off;
                off += counts[r];
            }
            let mine_v: Vec<i64> = (0..counts[me as usize]).map(|i| val(me, i)).collect();
            let mut gv = vec![-1i64; if me == root { total } else { 0 }];
            w.gatherv(&mine_v, &mut gv, &counts, &displs, root).map_err(e2s)?;
            if me == root {
                for r in 0..nn {
                    check!((0..counts[r]).all(|i| gv[displs[r] + i] == val(r as u32, i)), "gatherv len {len} root {root} rank {r}");
                }
            }
            let mut sv = vec![0i64; counts[me as usize]];
            let srcv: Vec<i64> = if me == root { (0..total).map(|k| k as i64 * 3).collect() } else { vec![] };
            w.scatterv(&srcv, &counts, &displs, &mut sv, root).map_err(e2s)?;
            let d = displs[me as usize];
            check!((0..sv.len()).all(|i| sv[i] == (d + i) as i64 * 3), "scatterv len {len} root {root}");
        }
        // allgather / allgatherv
        let mut ag = vec![0i64; len * nn];
        w.allgather(&mine, &mut ag).map_err(e2s)?;
        check!((0..nn).all(|r| (0..len).all(|i| ag[r * len + i] == val(r as u32, i))), "allgather len {len} n {n}");
        let counts: Vec<usize> = (0..nn).map(|r| (r + 1) * len / nn).collect();
        let displs = displacements(&counts, 1);
        let mut agv = vec![-7i64; displs[nn - 1] + counts[nn - 1] + 1];
        let mine_v: Vec<i64> = (0..counts[me as usize]).map(|i| val(me, i)).collect();
        w.allgatherv(&mine_v, &mut agv, &counts, &displs).map_err(e2s)?;
        for r in 0..nn {
            check!((0..counts[r]).all(|i| agv[displs[r] + i] == val(r as u32, i)), "allgatherv len {len} rank {r}");
            check!(agv[displs[r] + counts[r]] == -7, "allgatherv wrote into a gap");
        }
        // alltoall / alltoallv
        let blk = len.div_ceil(nn).max(1);
        let sendb: Vec<i64> = (0..blk * nn).map(|k| val(me, k) * 10 + (k / blk) as i64).collect();
        let mut recvb = vec![0i64; blk * nn];
        w.alltoall(&sendb, &mut recvb).map_err(e2s)?;
        for j in 0..nn {
            check!(
                (0..blk).all(|i| recvb[j * blk + i] == val(j as u32, me as usize * blk + i) * 10 + i64::from(me)),
                "alltoall blk {blk} from {j}"
            );
        }
        // alltoallv: rank r sends (r + dest) % 3 * blk elements to dest.
        let cnt = |from: usize, to: usize| (from + to) % 3 * blk;
        let scounts: Vec<usize> = (0..nn).map(|d| cnt(me as usize, d)).collect();
        let sdispls = displacements(&scounts, 0);
        let rcounts: Vec<usize> = (0..nn).map(|s| cnt(s, me as usize)).collect();
        let rdispls = displacements(&rcounts, 0);
        let sendv: Vec<i64> = (0..scounts.iter().sum::<usize>()).map(|k| i64::from(me) * 1_000_000 + k as i64).collect();
        let mut recvv = vec![0i64; rcounts.iter().sum()];
        w.alltoallv(&sendv, &scounts, &sdispls, &mut recvv, &rcounts, &rdispls).map_err(e2s)?;
        for s in 0..nn {
            let their_sdispl: usize = (0..me as usize).map(|d| cnt(s, d)).sum();
            check!(
                (0..rcounts[s]).all(|i| recvv[rdispls[s] + i] == s as i64 * 1_000_000 + (their_sdispl + i) as i64),
                "alltoallv from {s}"
            );
        }
    }
    Ok(())
}

/// Rank 1 dies at once; the others must get an error naming it, not hang.
fn early_exit(w: &Comm) -> R {
    if w.rank() == 1 {
        std::process::exit(3);
    }
    let t = std::time::Instant::now();
    let mut b = [0u8; 8];
    match w.recv(&mut b, 1, 0) {
        Err(Error::PeerGone { rank: 1, .. }) => {
            println!("PEER-GONE rank 1 noticed by rank {} after {} ms", w.rank(), t.elapsed().as_millis());
            std::process::exit(0);
        }
        other => Err(format!("expected PeerGone for rank 1, got {other:?}")),
    }
}

/// The ranks of node 0 wait on every rank of the other nodes, which wait on
/// rank 0 until the harness powers their node off (hw-tests/rxe-cluster).
/// Each lost rank must be named, with the time it was noticed (the kernel's
/// uptime: the harness's clock inside the guest, whose busybox `date` has no
/// sub-second field).
/// Then the survivors tell their node's leader (its lowest rank), which
/// returns the lost ranks: it ends the job once every survivor has reported.
fn node_loss(fmx: &fmx::Fmx) -> Result<Survivor, String> {
    let w = fmx.world();
    let me = w.rank();
    w.barrier().map_err(e2s)?;
    let (mut remote, mut local) = (Vec::new(), Vec::new());
    for r in 0..w.size() {
        if w.transport_of(r).map_err(e2s)? == "shm" {
            local.push(r);
        } else {
            remote.push(r);
        }
    }
    let mut b = [0u8; 8];
    if fmx.locality().node != 0 {
        println!("NODE-LOSS waiting rank {me}");
        return match w.recv(&mut b, 0, 77) {
            Ok(_) => Err("rank 0 sent a message it never sends".into()),
            Err(e) => Err(format!("waiting on rank 0: {e}")),
        };
    }
    println!("NODE-LOSS ready rank {me} waits on {remote:?}");
    for &r in &remote {
        match w.recv(&mut b, r, 77) {
            Err(Error::PeerGone { rank, .. }) if rank == r => {
                let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
                let at = uptime.split_whitespace().next().unwrap_or("unknown");
                println!("LOST rank {r} noticed by rank {me} at uptime {at}");
            }
            other => return Err(format!("waiting on rank {r} of the lost node: expected PeerGone naming it, got {other:?}")),
        }
    }
    if local[0] != me {
        w.send(&[1u8], local[0], 78).map_err(e2s)?;
        return Ok(Survivor::Member { leader: local[0] });
    }
    for &l in &local[1..] {
        w.recv(&mut b[..1], l, 78).map_err(e2s)?;
    }
    Ok(Survivor::Leader { lost: remote })
}

/// What a rank of the surviving node does once it has named every lost rank.
enum Survivor {
    /// The node's lowest rank: every other survivor reported; it ends the job.
    Leader { lost: Vec<u32> },
    /// Another survivor: it reported to `leader` and waits for the job's end.
    Member { leader: u32 },
}

fn bad_input(w: &Comm) -> R {
    let n = w.size();
    match w.send(&[1u8], n, 0) {
        Err(Error::InvalidRank { rank, size, .. }) if rank == i64::from(n) && size == n => {}
        other => return Err(format!("send to rank {n}: {other:?}")),
    }
    match w.recv(&mut [0u8], n + 5, 0) {
        Err(Error::InvalidRank { .. }) => {}
        other => return Err(format!("recv from rank {}: {other:?}", n + 5)),
    }
    match w.send(&[1u8], 0, -4) {
        Err(Error::InvalidTag { tag: -4, .. }) => {}
        other => return Err(format!("negative tag: {other:?}")),
    }
    match w.bcast(&mut [0u8], n) {
        Err(Error::InvalidRank { what: "root", .. }) => {}
        other => return Err(format!("bcast root {n}: {other:?}")),
    }
    let mut out = [0i32; 2];
    match w.allreduce(&[1i32, 2, 3], &mut out, Op::Sum) {
        Err(Error::InvalidCount { what: "allreduce", .. }) => {}
        other => return Err(format!("allreduce 3 into 2: {other:?}")),
    }
    let counts = vec![4usize; n as usize];
    let displs = vec![0usize; n as usize];
    let mut small = vec![0u8; 2];
    match w.allgatherv(&[0u8; 4], &mut small, &counts, &displs) {
        Err(Error::InvalidCount { detail, .. }) if detail.contains("rank 0's count 4") => {}
        other => return Err(format!("oversized allgatherv counts: {other:?}")),
    }
    match w.alltoallv(&[0u8; 4], &counts[..1], &displs[..1], &mut small, &counts, &displs) {
        Err(Error::InvalidCount { .. }) => {}
        other => return Err(format!("short counts array: {other:?}")),
    }
    // Typed receive of a message that is not a whole number of elements.
    let peer = (w.rank() + 1) % n;
    let from = (w.rank() + n - 1) % n;
    let mut r = [0u32; 2];
    let got = w.sendrecv(&[1u8, 2, 3], peer, 1, &mut r, from, 1);
    match got {
        Err(Error::PartialElement { bytes: 3, elem_size: 4, .. }) => {}
        other => return Err(format!("3 bytes into u32s: {other:?}")),
    }
    w.barrier().map_err(e2s)
}

fn dup_split(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size());
    let d = w.dup().map_err(e2s)?;
    check!(d.rank() == me && d.size() == n, "dup shape");
    if me == 1 {
        d.send(&[111u32], 0, 1).map_err(e2s)?;
        w.send(&[222u32], 0, 1).map_err(e2s)?;
    } else if me == 0 {
        let mut x = [0u32];
        w.recv(&mut x, 1, 1).map_err(e2s)?;
        check!(x == [222], "world recv took {x:?}: tag spaces leak between dup and world");
        d.recv(&mut x, Source::Any, Tag::Any).map_err(e2s)?;
        check!(x == [111], "dup recv took {x:?}");
    }
    // Split by parity, key reverses the order.
    let s = w.split(Some(me % 2), -(me as i32)).map_err(e2s)?.ok_or("split gave None for a color")?;
    let members: Vec<u32> = (0..n).filter(|r| r % 2 == me % 2).collect();
    check!(s.size() as usize == members.len(), "split size {}", s.size());
    check!(s.rank() as usize == members.len() - 1 - members.iter().position(|&r| r == me).unwrap_or(0), "split rank {}", s.rank());
    let mut sum = [0u32];
    s.allreduce(&[me], &mut sum, Op::Sum).map_err(e2s)?;
    check!(sum[0] == members.iter().sum::<u32>(), "split allreduce {sum:?}");
    // Collectives on world and on the split interleave without mixing.
    let mut b = [me];
    s.bcast(&mut b, 0).map_err(e2s)?;
    check!(b[0] == *members.last().unwrap_or(&0), "split bcast from its rank 0 (highest world rank)");
    let none = w.split(if me == 0 { None } else { Some(0) }, 0).map_err(e2s)?;
    check!(none.is_none() == (me == 0), "undefined color");
    if let Some(c) = none {
        check!(c.size() == n - 1, "color 0 holds all but rank 0");
        c.barrier().map_err(e2s)?;
    }
    Ok(())
}

/// A neighbour exchange around the ring, many times (oversubscription: progress must not starve).
fn ring(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size());
    let iters: usize = std::env::var("RING_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let mut got = [0u64];
    let t = std::time::Instant::now();
    for i in 0..iters as u64 {
        w.sendrecv(&[i * 100 + u64::from(me)], right, 0, &mut got, left, 0).map_err(e2s)?;
        check!(got[0] == i * 100 + u64::from(left), "iteration {i}: got {}", got[0]);
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("RING n={n} iters={iters} us_per_exchange={us:.2}");
    Ok(())
}

/// The size of message `seq` from `src` to `dst` in the random-size stress (0..=max).
fn stress_len(src: u32, dst: u32, seq: u64, max: usize) -> usize {
    let mut x = (u64::from(src) << 48) ^ (u64::from(dst) << 32) ^ seq ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x % (max as u64 + 1)) as usize
}

/// All-to-all, `STRESS_MSGS` messages per ordered pair (default 10^5), in
/// windows of `STRESS_WINDOW`; every message's content checked. With `sizes`,
/// each message has a pseudo-random size up to `STRESS_MAX_BYTES`.
fn stress(w: &Comm, sizes: bool) -> R {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let msgs = env("STRESS_MSGS", 100_000);
    let window = env("STRESS_WINDOW", 32) as usize;
    let max = env("STRESS_MAX_BYTES", 512) as usize;
    let (me, n) = (w.rank(), w.size());
    let peers: Vec<u32> = (0..n).filter(|&p| p != me).collect();
    let cap = if sizes { max } else { 16 };
    let mut inbox = vec![vec![0u8; cap]; peers.len() * window];
    let mut outbox = vec![vec![0u8; cap]; peers.len() * window];
    let mut seq = 0u64;
    let t = std::time::Instant::now();
    while seq < msgs {
        let k = window.min((msgs - seq) as usize);
        for (pi, &p) in peers.iter().enumerate() {
            for j in 0..k {
                let m = seq + j as u64;
                let b = &mut outbox[pi * window + j];
                let len = if sizes { stress_len(me, p, m, max) } else { 16 };
                b.resize(len, 0);
                fill(b, me, m ^ (u64::from(p) << 40));
            }
        }
        let statuses = w
            .scope(|s| {
                let mut reqs = Vec::new();
                for (pi, chunk) in inbox.chunks_mut(window).enumerate() {
                    for b in chunk.iter_mut().take(k) {
                        b.resize(cap, 0);
                        reqs.push(s.irecv(&mut b[..], peers[pi], 7)?);
                    }
                }
                for (pi, chunk) in outbox.chunks(window).enumerate() {
                    for b in chunk.iter().take(k) {
                        let _ = s.isend(&b[..], peers[pi], 7)?;
                    }
                }
                s.wait_all(reqs)
            })
            .map_err(e2s)?;
        for (idx, st) in statuses.iter().enumerate() {
            let (pi, j) = (idx / k, idx % k);
            let p = peers[pi];
            let m = seq + j as u64;
            let len = if sizes { stress_len(p, me, m, max) } else { 16 };
            check!(st.source == p && st.count == len, "message {m} from {p}: status {st:?}, expected {len} bytes");
            let b = &inbox[pi * window + j][..len];
            check!(first_mismatch(b, p, m ^ (u64::from(me) << 40)).is_none(), "message {m} from {p}: content differs");
        }
        seq += k as u64;
    }
    println!("STRESS n={n} msgs_per_pair={msgs} secs={:.2}", t.elapsed().as_secs_f64());
    Ok(())
}

/// FM's dynamic process model: ranks start after random delays, the send rule
/// holds before the join, everyone communicates after it, and the eager
/// receive memory is the configured pool whatever the number of ranks.
fn join() -> R {
    let rank: u64 = std::env::var("FMX_RANK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let delay = (rank * 7919 + u64::from(std::process::id())) % 500;
    std::thread::sleep(std::time::Duration::from_millis(delay));
    let fmx = fmx::init_with(fmx::InitOptions { defer_join: true }).map_err(e2s)?;
    announce(&fmx);
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    // Before anyone has sent: larger IDs are forbidden, smaller ones allowed (newcomer credits).
    for j in me + 1..n {
        let got = w.try_send(&[1u8], j, 50).map_err(e2s)?;
        check!(got == SendAttempt::NotAllowed, "rank {me} -> {j} before the join: {got:?}, the rule forbids it");
    }
    for j in 0..me {
        // Connected on demand, the first message may wait while the
        // transport connects (Backpressure, with progress); never NotAllowed.
        let t = std::time::Instant::now();
        let mut got = w.try_send(&[me as u8], j, 51).map_err(e2s)?;
        while got == SendAttempt::Backpressure && w.connects_on_demand(j).map_err(e2s)? && t.elapsed().as_secs() < 30 {
            w.progress().map_err(e2s)?;
            std::thread::yield_now();
            got = w.try_send(&[me as u8], j, 51).map_err(e2s)?;
        }
        check!(got == SendAttempt::Sent, "rank {me} -> smaller {j} before the join: {got:?}");
    }
    // Nobody sends to a larger ID before every rank has checked the above.
    let dir = std::path::PathBuf::from(std::env::var("FMX_JOIN_DIR").map_err(|_| "FMX_JOIN_DIR not set")?);
    std::fs::write(dir.join(format!("ready-{me}")), b"").map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    while (0..n).any(|r| !dir.join(format!("ready-{r}")).exists()) {
        check!(t.elapsed().as_secs() < 60, "ranks never got ready");
        // Connected on demand, a peer's first message needs our progress to connect.
        w.progress().map_err(e2s)?;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // A blocking send to the next larger ID makes progress until that rank's join message opens the way.
    if me + 1 < n {
        w.send(&[u64::from(me)], me + 1, 52).map_err(e2s)?;
    }
    fmx.wait_for_join(n).map_err(e2s)?;
    fmx.reallocate_credits().map_err(e2s)?;
    for j in me + 1..n {
        let mut b = [0u8];
        w.recv(&mut b, j, 51).map_err(e2s)?;
        check!(u32::from(b[0]) == j, "hello from {j}: {b:?}");
    }
    if me > 0 {
        let mut b = [0u64];
        w.recv(&mut b, me - 1, 52).map_err(e2s)?;
        check!(b[0] == u64::from(me - 1), "blocking hello from {}: {b:?}", me - 1);
    }
    // Every pair communicates.
    let send: Vec<u64> = (0..n).map(|d| u64::from(me) * 100 + u64::from(d)).collect();
    let mut recv = vec![0u64; n as usize];
    w.alltoall(&send, &mut recv).map_err(e2s)?;
    check!((0..n).all(|s| recv[s as usize] == u64::from(s) * 100 + u64::from(me)), "alltoall after the join: {recv:?}");
    let m = fmx.receive_memory();
    println!("RECVMEM n={n} eager_pool={} per_peer={} control={} own={}", m.eager_pool, m.per_peer, m.control, m.own);
    fmx.finalize().map_err(e2s)
}

fn wait_for_file(path: &std::path::Path) -> R {
    let t = std::time::Instant::now();
    while !path.exists() {
        check!(t.elapsed().as_secs() < 60, "{} never appeared", path.display());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(())
}

/// Active messages: pieces in order, replies from handlers, no credit -> None,
/// large messages, and a handler that tries to block gets an error.
fn active_messages() -> R {
    use std::cell::RefCell;
    use std::rc::Rc;
    // 'static so that a handler can (try to) capture the communicator.
    let fmx: &'static fmx::Fmx = Box::leak(Box::new(fmx::init().map_err(e2s)?));
    announce(fmx);
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    let am = w.active_messages();
    let replies = Rc::new(RefCell::new(Vec::<(u32, u64)>::new()));
    let bigs = Rc::new(RefCell::new(Vec::<(u32, usize, bool)>::new()));
    let refused = Rc::new(RefCell::new(None::<String>));
    am.register(1, |msg, out| {
        let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
        assert_eq!(msg.receive(&mut a), 8);
        assert_eq!(msg.receive(&mut b), 8);
        let v = u64::from_le_bytes(a) * 1000 + u64::from_le_bytes(b);
        out.send(msg.sender(), 2, (v + 1).to_le_bytes().to_vec());
    });
    let r = replies.clone();
    am.register(2, move |msg, _| {
        let mut x = [0u8; 8];
        msg.receive(&mut x);
        r.borrow_mut().push((msg.sender(), u64::from_le_bytes(x)));
    });
    let b = bigs.clone();
    am.register(3, move |msg, _| {
        let mut data = vec![0u8; msg.len()];
        msg.receive(&mut data);
        let ok = first_mismatch(&data, msg.sender(), 33).is_none();
        b.borrow_mut().push((msg.sender(), data.len(), ok));
    });
    let done = Rc::new(RefCell::new(0u32));
    let dn = done.clone();
    am.register(5, move |_, _| *dn.borrow_mut() += 1);
    let f = refused.clone();
    am.register(4, move |_, _| {
        *f.borrow_mut() = Some(match w.send(&[0u8], 0, 0) {
            Err(Error::InHandler(what)) => format!("refused {what}"),
            other => format!("not refused: {other:?}"),
        });
    });
    // No credit -> None: rank 1 spends its single slot toward rank 0 (FMX_SHM_POOL_SLOTS = n - 1)
    // while rank 0 does not poll (it waits for a file rank 1 creates afterwards).
    if let Ok(dir) = std::env::var("FMX_AM_DIR") {
        let flag = std::path::Path::new(&dir).join("spent");
        if me == 1 {
            // (the credit of our join message may still be on its way back)
            let mut s = am.begin_message_blocking(0, 16, 1).map_err(e2s)?;
            s.send_piece(&7u64.to_le_bytes()).map_err(e2s)?;
            s.send_piece(&1u64.to_le_bytes()).map_err(e2s)?;
            s.end_message().map_err(e2s)?;
            check!(am.begin_message(0, 16, 1).map_err(e2s)?.is_none(), "begin_message with no credit must answer None");
            std::fs::write(&flag, b"").map_err(|e| e.to_string())?;
        } else if me == 0 {
            wait_for_file(&flag)?;
        }
    }
    // Every rank asks every other rank (and itself) in two pieces.
    for d in 0..n {
        let mut s = am.begin_message_blocking(d, 16, 1).map_err(e2s)?;
        s.send_piece(&u64::from(me).to_le_bytes()).map_err(e2s)?;
        s.send_piece(&u64::from(d).to_le_bytes()).map_err(e2s)?;
        s.end_message().map_err(e2s)?;
    }
    // A message longer than a slot, to the next rank.
    let mut big = vec![0u8; 100_000];
    fill(&mut big, me, 33);
    let next = (me + 1) % n;
    let mut s = am.begin_message_blocking(next, big.len(), 3).map_err(e2s)?;
    s.send_piece(&big[..1000]).map_err(e2s)?;
    s.send_piece(&big[1000..]).map_err(e2s)?;
    check!(s.send_piece(&[0]).is_err(), "a piece past the declared length is refused");
    s.end_message().map_err(e2s)?;
    if me == 0 {
        let mut s = am.begin_message_blocking(me, 0, 4).map_err(e2s)?;
        s.send_piece(&[]).map_err(e2s)?;
        s.end_message().map_err(e2s)?;
    }
    let extra = u32::from(me == 1 && std::env::var_os("FMX_AM_DIR").is_some());
    let t = std::time::Instant::now();
    while replies.borrow().len() < (n + extra) as usize || bigs.borrow().is_empty() || (me == 0 && refused.borrow().is_none()) {
        am.extract(usize::MAX).map_err(e2s)?;
        check!(t.elapsed().as_secs() < 60, "active messages did not all arrive: {} replies", replies.borrow().len());
    }
    for &(src, v) in replies.borrow().iter() {
        let want = if me == 1 && src == 0 && v == 7001 + 1 { v } else { u64::from(me) * 1000 + u64::from(src) + 1 };
        check!(v == want, "reply from {src}: {v}");
    }
    check!(bigs.borrow()[0] == ((me + n - 1) % n, 100_000, true), "large message: {:?}", bigs.borrow());
    if me == 0 {
        let r = refused.borrow().clone().unwrap_or_default();
        check!(r == "refused send", "blocking call in a handler: {r}");
    }
    // Keep serving the others (their handlers run only when we extract) until everyone is done.
    for d in 0..n {
        let s = am.begin_message_blocking(d, 0, 5).map_err(e2s)?;
        s.end_message().map_err(e2s)?;
    }
    while *done.borrow() < n {
        am.extract(usize::MAX).map_err(e2s)?;
        check!(t.elapsed().as_secs() < 90, "only {} ranks said done", done.borrow());
    }
    fmx.finalize().map_err(e2s)
}
