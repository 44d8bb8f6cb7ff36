//! Rank program of the misuse tests (tests/misuse.rs): `fmx-itest-misuse SCENARIO`.
//!
//! Ranks make the mistakes users make daily (collectives called with
//! different roots, lengths or operations; receive buffers too small) and
//! print what each call answered: `ERR by=<rank> kind=<variant> err=<message>`
//! or `OKV by=<rank> value=<...>` (a collective that returned Ok, with
//! what it produced). `OK <scenario>` ends a scenario whose checks passed.

use fmx::{Comm, Error, Op, Source, Tag};

type R = Result<(), String>;

fn e2s(e: Error) -> String {
    e.to_string()
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::CollectiveMismatch { .. } => "CollectiveMismatch",
        Error::Truncated { .. } => "Truncated",
        Error::PeerGone { .. } => "PeerGone",
        Error::JobFailed { .. } => "JobFailed",
        Error::InvalidCount { .. } => "InvalidCount",
        _ => "other",
    }
}

/// Prints what a call answered (the tests read it).
fn answer<T: std::fmt::Debug>(me: u32, r: Result<T, Error>) {
    match r {
        Ok(v) => println!("OKV by={me} value={v:?}"),
        Err(e) => println!("ERR by={me} kind={} err={e}", kind(&e)),
    }
}

macro_rules! check {
    ($c:expr, $($fmt:tt)*) => {
        if !$c {
            return Err(format!("line {}: {}", line!(), format!($($fmt)*)));
        }
    };
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let fmx = match fmx::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("FAIL init: {e}");
            std::process::exit(1);
        }
    };
    let w = fmx.world();
    let me = w.rank();
    let r = match scenario.as_str() {
        // Items 7-10: each rank reports; the test reads the answers.
        "bcast-roots" => {
            let mut v = [u64::from(me) + 100; 2];
            let r = w.bcast(&mut v, me % 2);
            answer(me, r.map(|()| v));
            Ok(())
        }
        "bcast-lengths" => {
            let mut v = vec![u64::MAX; 4 + (me % 2) as usize];
            if me == 0 {
                v.fill(7);
            }
            let r = w.bcast(&mut v, 0);
            answer(me, r.map(|()| v));
            Ok(())
        }
        "alltoall-lengths" => {
            let n = w.size() as usize;
            let m = 2 + (me % 2) as usize;
            let send = vec![u64::from(me); m * n];
            let mut recv = vec![u64::MAX; m * n];
            let r = w.alltoall(&send, &mut recv);
            answer(me, r.map(|()| recv));
            Ok(())
        }
        "gather-lengths" => {
            let n = w.size() as usize;
            let m = 2 + (me % 2) as usize;
            let mut recv = vec![u64::MAX; if me == 0 { 2 * n } else { 0 }];
            let r = w.gather(&vec![u64::from(me); m], &mut recv, 0);
            answer(me, r.map(|()| recv));
            Ok(())
        }
        "allreduce-lengths" => {
            let len = 400_000 + (me % 2) as usize;
            let mut out = vec![0u64; len];
            let r = w.allreduce(&vec![1u64; len], &mut out, Op::Sum);
            answer(me, r.map(|()| (out.len(), out.iter().all(|&x| x == u64::from(w.size())))));
            Ok(())
        }
        "reduce-roots" => {
            let mut out = [0u64];
            let r = w.reduce(&[1u64], &mut out, Op::Sum, me % 2);
            answer(me, r.map(|()| out));
            Ok(())
        }
        "coll-vs-barrier" => {
            let r = if me == 0 {
                w.barrier().map(|()| 0)
            } else {
                let mut out = [0u64];
                w.allreduce(&[1u64], &mut out, Op::Sum).map(|()| out[0])
            };
            answer(me, r);
            Ok(())
        }
        "irecv-truncate" => irecv_truncate(w),
        "allgatherv-zero" => allgatherv_zero(w),
        "vprop" => vprop(w),
        "graph-dup" => graph_dup(w),
        other => Err(format!("unknown scenario {other:?}")),
    };
    fmx_itest::report(&scenario, r);
    // The answers are printed; a rank whose collective failed cannot finalize
    // with the others (they may wait in the broken one), so it leaves.
    let _ = fmx.finalize();
}

/// Item 11: an `irecv` into a too-small buffer that the scope completes is
/// an error, as a blocking receive is.
fn irecv_truncate(w: &Comm) -> R {
    let me = w.rank();
    if me == 0 {
        w.send(&[1u32, 2, 3, 4], 1, 3).map_err(e2s)?;
        w.send(&[5u32, 6, 7, 8], 1, 4).map_err(e2s)?;
        return Ok(());
    }
    if me != 1 {
        return Ok(());
    }
    let mut small = [0u32; 2];
    let r = w.scope(|s| {
        let _leaked = s.irecv(&mut small, 0, 3)?;
        Ok(())
    });
    match r {
        Err(Error::Truncated { source_rank: 0, sent: 16, capacity: 8, .. }) => {}
        other => return Err(format!("scope end with a truncated irecv gave {other:?}")),
    }
    let mut small = [0u32; 2];
    let r = w.scope(|s| {
        let req = s.irecv(&mut small, 0, Tag::Value(4))?;
        s.wait(req)
    });
    match r {
        Err(Error::Truncated { source_rank: 0, sent: 16, capacity: 8, .. }) => Ok(()),
        other => Err(format!("wait on a truncated irecv gave {other:?}")),
    }
}

/// Item 12: a zero-count block sharing its displacement with a non-empty one.
fn allgatherv_zero(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size() as usize);
    // Rank 0 sends nothing; every other rank r sends r, at displacements
    // 0 (rank 0, empty), 0 (rank 1), 1 (rank 2), ...
    let counts: Vec<usize> = (0..n).map(|r| usize::from(r != 0)).collect();
    let displs: Vec<usize> = (0..n).map(|r| r.saturating_sub(1)).collect();
    let mine = vec![me; counts[me as usize]];
    let mut out = vec![u32::MAX; n - 1];
    w.allgatherv(&mine, &mut out, &counts, &displs).map_err(e2s)?;
    let want: Vec<u32> = (1..n as u32).collect();
    check!(out == want, "allgatherv with a zero block at a shared displacement: {out:?}");
    // Overlapping non-empty regions are refused on every rank.
    let overlap = vec![0usize; n];
    match w.allgatherv(&[me], &mut vec![0u32; n], &vec![1; n], &overlap) {
        Err(Error::InvalidCount { detail, .. }) if detail.contains("overlaps") => Ok(()),
        other => Err(format!("overlapping regions gave {other:?}")),
    }
}

/// splitmix64: the same stream on every rank from a shared seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A count in 0..=3, zero a third of the time.
    fn count(&mut self) -> usize {
        (self.next() % 4) as usize * usize::from(self.next() % 3 != 0)
    }
}

/// Displacements for `counts`, with random gaps; a zero-count block often
/// takes the displacement of the block before it (shared).
fn layout(rng: &mut Rng, counts: &[usize]) -> (Vec<usize>, usize) {
    let mut displs = Vec::with_capacity(counts.len());
    let mut at = 0;
    for &c in counts {
        if c == 0 && at > 0 && rng.next() % 2 == 0 {
            displs.push(at - 1);
            continue;
        }
        at += (rng.next() % 2) as usize;
        displs.push(at);
        at += c;
    }
    (displs, at + 1)
}

fn val(src: u32, dst: usize, i: usize, round: u64) -> u64 {
    (u64::from(src) << 48) ^ ((dst as u64) << 32) ^ ((i as u64) << 16) ^ round
}

/// Property test of the v-collectives with random counts (zeros and zero
/// blocks at shared displacements included) against what each rank must get.
fn vprop(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size() as usize);
    let rounds: u64 = std::env::var("VPROP_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let (ring, g) = fmx_itest::topology::ring_graph(w)?;
    for round in 0..rounds {
        let mut rng = Rng(round.wrapping_mul(7919) + 1);
        // c[i][j]: elements rank i sends rank j.
        let c: Vec<Vec<usize>> = (0..n).map(|_| (0..n).map(|_| rng.count()).collect()).collect();
        let root = (round % n as u64) as u32;
        let me_u = me as usize;

        // gatherv: rank r sends c[r][0] elements to the root.
        let counts: Vec<usize> = (0..n).map(|r| c[r][0]).collect();
        let (displs, len) = layout(&mut rng, &counts);
        let mine: Vec<u64> = (0..counts[me_u]).map(|i| val(me, 0, i, round)).collect();
        let mut out = vec![u64::MAX; if me == root { len } else { 0 }];
        w.gatherv(&mine, &mut out, &counts, &displs, root).map_err(|e| format!("round {round} gatherv: {e}"))?;
        if me == root {
            for r in 0..n {
                for i in 0..counts[r] {
                    check!(out[displs[r] + i] == val(r as u32, 0, i, round), "round {round} gatherv from {r} element {i}");
                }
            }
        }

        // scatterv: the root sends c[0][r] elements to rank r.
        let counts: Vec<usize> = (0..n).map(|r| c[0][r]).collect();
        let (displs, len) = layout(&mut rng, &counts);
        let mut send = vec![u64::MAX; len];
        for r in 0..n {
            for i in 0..counts[r] {
                send[displs[r] + i] = val(root, r, i, round);
            }
        }
        let mut got = vec![0u64; counts[me_u]];
        w.scatterv(&send, &counts, &displs, &mut got, root).map_err(|e| format!("round {round} scatterv: {e}"))?;
        check!(got.iter().enumerate().all(|(i, &x)| x == val(root, me_u, i, round)), "round {round} scatterv");

        // allgatherv: rank r contributes c[r][r] elements.
        let counts: Vec<usize> = (0..n).map(|r| c[r][r]).collect();
        let (displs, len) = layout(&mut rng, &counts);
        let mine: Vec<u64> = (0..counts[me_u]).map(|i| val(me, 9, i, round)).collect();
        let mut out = vec![u64::MAX; len];
        w.allgatherv(&mine, &mut out, &counts, &displs).map_err(|e| format!("round {round} allgatherv: {e}"))?;
        for r in 0..n {
            for i in 0..counts[r] {
                check!(out[displs[r] + i] == val(r as u32, 9, i, round), "round {round} allgatherv from {r} element {i}");
            }
        }

        // alltoallv: c[me][j] to j, c[j][me] from j.
        let scounts = c[me_u].clone();
        let rcounts: Vec<usize> = (0..n).map(|j| c[j][me_u]).collect();
        let (sdispls, slen) = layout(&mut rng, &scounts);
        let (rdispls, rlen) = layout(&mut Rng(round + 77 + me_u as u64), &rcounts);
        let mut send = vec![u64::MAX; slen];
        for j in 0..n {
            for i in 0..scounts[j] {
                send[sdispls[j] + i] = val(me, j, i, round);
            }
        }
        let mut recv = vec![u64::MAX; rlen];
        w.alltoallv(&send, &scounts, &sdispls, &mut recv, &rcounts, &rdispls).map_err(|e| format!("round {round} alltoallv: {e}"))?;
        for j in 0..n {
            for i in 0..rcounts[j] {
                check!(recv[rdispls[j] + i] == val(j as u32, me_u, i, round), "round {round} alltoallv from {j} element {i}");
            }
        }

        // Neighbours on the ring: rank i sends c[i][k] elements along its out-edge k.
        let sc = [c[me_u][0], c[me_u][1 % n]];
        let left = ring[0] as usize;
        let right = ring[1] as usize;
        // In-edge 0 is from the left neighbour (its out-edge 1), in-edge 1 from the right (its out-edge 0).
        let rc = [c[left][1 % n], c[right][0]];
        let (sd, slen) = layout(&mut rng, &sc);
        let (rd, rlen) = layout(&mut Rng(round * 3 + me_u as u64), &rc);
        let mut send = vec![u64::MAX; slen];
        for k in 0..2 {
            for i in 0..sc[k] {
                send[sd[k] + i] = val(me, k, i, round);
            }
        }
        let mut recv = vec![u64::MAX; rlen];
        g.neighbor_alltoallv(&send, &sc, &sd, &mut recv, &rc, &rd).map_err(|e| format!("round {round} neighbor_alltoallv: {e}"))?;
        let from = [(left, 1usize), (right, 0usize)];
        for k in 0..2 {
            for i in 0..rc[k] {
                check!(recv[rd[k] + i] == val(from[k].0 as u32, from[k].1, i, round), "round {round} neighbor_alltoallv in-edge {k}");
            }
        }
        // The same as alltoallw, in bytes.
        let block = |d: usize, c: usize| fmx::Block { displ: d * 8, count: c, elem_size: 8 };
        let sb = [block(sd[0], sc[0]), block(sd[1], sc[1])];
        let rb = [block(rd[0], rc[0]), block(rd[1], rc[1])];
        let mut recvw = vec![u64::MAX; rlen];
        g.neighbor_alltoallw(bytemuck::cast_slice(&send), &sb, bytemuck::cast_slice_mut(&mut recvw), &rb)
            .map_err(|e| format!("round {round} neighbor_alltoallw: {e}"))?;
        check!(recvw == recv, "round {round} neighbor_alltoallw differs from alltoallv");
        // allgatherv: each rank sends its c[me][me] elements to both neighbours.
        let mine: Vec<u64> = (0..c[me_u][me_u]).map(|i| val(me, 5, i, round)).collect();
        let rc = [c[left][left], c[right][right]];
        let (rd, rlen) = layout(&mut rng, &rc);
        let mut recv = vec![u64::MAX; rlen];
        g.neighbor_allgatherv(&mine, &mut recv, &rc, &rd).map_err(|e| format!("round {round} neighbor_allgatherv: {e}"))?;
        for (k, &(src, _)) in from.iter().enumerate() {
            for i in 0..rc[k] {
                check!(recv[rd[k] + i] == val(src as u32, 5, i, round), "round {round} neighbor_allgatherv in-edge {k}");
            }
        }
    }
    println!("VPROP rounds={rounds}");
    Ok(())
}

/// Item 13: a graph communicator's dup keeps the topology; topology() says so.
fn graph_dup(w: &Comm) -> R {
    let (me, n) = (w.rank(), w.size());
    let ring = [(me + n - 1) % n, (me + 1) % n];
    // Weight 5 on each edge to the right, 3 on each edge to the left.
    let (from, to) = ([5u32, 3], [3u32, 5]);
    let g = w
        .dist_graph_create_adjacent(
            &ring,
            fmx::Weights::Values(&from),
            &ring,
            fmx::Weights::Values(&to),
            &fmx::Info::default(),
            fmx::Reorder::No,
        )
        .map_err(e2s)?;
    let d = g.dup().map_err(e2s)?;
    check!(d.neighbors_count() == g.neighbors_count(), "dup's counts {:?}", d.neighbors_count());
    check!(d.neighbors(2, 2) == g.neighbors(2, 2), "dup's neighbours");
    check!(d.topology() == fmx::Topology::DistGraph, "dup's topology {:?}", d.topology());
    let as_comm: &Comm = &d;
    check!(as_comm.topology() == fmx::Topology::DistGraph, "through &Comm: {:?}", as_comm.topology());
    check!(w.topology() == fmx::Topology::Undefined, "the world has no topology");
    let s = g.split(Some(0), 0).map_err(e2s)?.ok_or("split")?;
    check!(s.topology() == fmx::Topology::Undefined, "split drops the topology (MPI_Comm_split)");
    let mut got = [0u32; 2];
    // The dup has its own tag space: a message on g is not seen on d.
    d.neighbor_alltoall(&[me, me], &mut got).map_err(e2s)?;
    check!(got == ring, "neighbor_alltoall on the dup: {got:?}");
    g.send(&[me], ring[1], 1).map_err(e2s)?;
    g.probe(ring[0], 1).map_err(e2s)?;
    check!(d.iprobe(Source::Any, Tag::Any).map_err(e2s)?.is_none(), "a message sent on the graph communicator reached its dup");
    let mut one = [0u32];
    g.recv(&mut one, ring[0], 1).map_err(e2s)?;
    check!(one[0] == ring[0], "got {one:?}");
    g.barrier().map_err(e2s)?;
    Ok(())
}
