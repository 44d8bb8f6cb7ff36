//! Rank program of the malleability tests (see tests/malleable.rs).
//!
//! `walk`: each world checks the state it received (every element), works
//! one step, and reconfigures to the next size of `FMX_ITEST_SIZES`, carrying
//! arrays of global_n in {0, 1, 7, M-1, 10^6+3} and the iteration count.
//! `FMX_ITEST_DIE=g:r` makes rank r of world g exit during its sends;
//! `FMX_ITEST_SLOW=g:r` makes it sleep 500 ms before them.
//! `intercomm`: intercommunicators between two halves of one world.
//! `spawn`: a world of 2 spawns 3 and both use the intercommunicator.

use fmx::malleable::{block_range, Malleable, Mode, Policy};
use fmx::{Intercomm, Source, Tag};

type R<T = ()> = Result<T, String>;

macro_rules! check {
    ($c:expr, $($fmt:tt)*) => {
        if !$c {
            return Err(format!($($fmt)*));
        }
    };
}

fn e2s(e: fmx::Error) -> String {
    e.to_string()
}

/// Element `i` of array `a` after `iter` steps of work.
fn value(a: usize, i: u64, iter: u64) -> u64 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((a as u64) << 56)).wrapping_add(iter)
}

/// The arrays carried into a world of `m` ranks.
fn sizes_for(m: u32) -> [u64; 5] {
    [0, 1, 7, u64::from(m) - 1, 1_000_003]
}

fn fresh(a: usize, rank: u32, size: u32, n: u64, iter: u64) -> Vec<u64> {
    block_range(rank, size, n).map(|i| value(a, i, iter)).collect()
}

fn verify(a: usize, block: &[u64], rank: u32, size: u32, n: u64, iter: u64) -> R {
    let r = block_range(rank, size, n);
    check!(
        block.len() as u64 == r.end - r.start,
        "array {a} (n={n}): rank {rank} got {} elements, expected {}",
        block.len(),
        r.end - r.start
    );
    if let Some(k) = r.clone().zip(block).position(|(i, &v)| v != value(a, i, iter)) {
        return Err(format!(
            "array {a} (n={n}): element {} is {} but should be {}",
            r.start + k as u64,
            block[k],
            value(a, r.start + k as u64, iter)
        ));
    }
    Ok(())
}

fn walk() -> R {
    let sizes: Vec<u32> = std::env::var("FMX_ITEST_SIZES")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("FMX_ITEST_SIZES: {s:?}")))
        .collect::<R<_>>()?;
    let rank_of_world = |var: &str| -> Option<(u32, u32)> {
        let v = std::env::var(var).ok()?;
        let (g, r) = v.split_once(':')?;
        Some((g.parse().ok()?, r.parse().ok()?))
    };
    let (die, slow) = (rank_of_world("FMX_ITEST_DIE"), rank_of_world("FMX_ITEST_SLOW"));
    let mut m = Malleable::init(Mode::from_env().map_err(e2s)?).map_err(e2s)?;
    let (me, size, generation) = (m.world().rank(), m.world().size(), m.reconfig_count());
    println!("PID {}", std::process::id());
    println!("WORLD {generation} size {size}");
    check!(!fmx::malleable::intercomm_available(), "intercomm_available outside the window");
    let restored = m
        .start(|inbox| {
            let in_window = fmx::malleable::intercomm_available() == inbox.intercomm().is_some();
            let iter = inbox.value::<u64>("iter")?;
            let arrays = sizes_for(size)
                .iter()
                .enumerate()
                .map(|(a, &n)| inbox.blocks::<u64>(&format!("a{a}"), n))
                .collect::<fmx::Result<Vec<_>>>()?;
            Ok((iter, arrays, in_window, inbox.old_size()))
        })
        .map_err(e2s)?;
    check!(!fmx::malleable::intercomm_available(), "intercomm_available after start");
    let (mut iter, mut arrays) = match restored {
        Some((iter, arrays, in_window, old)) => {
            check!(in_window, "intercomm_available was wrong inside start");
            check!(iter == u64::from(generation), "resume value {iter} after {generation} reconfigurations");
            check!(m.fmx().parent_size() == Some(old), "old size {old} vs parent_size {:?}", m.fmx().parent_size());
            for (a, (block, &n)) in arrays.iter().zip(&sizes_for(size)).enumerate() {
                verify(a, block, me, size, n, iter)?;
            }
            (iter, arrays)
        }
        None => {
            check!(generation == 0, "a fresh start in world {generation}");
            (0, sizes_for(size).iter().enumerate().map(|(a, &n)| fresh(a, me, size, n, 0)).collect())
        }
    };
    // One step of work.
    arrays.iter_mut().flatten().for_each(|v| *v = v.wrapping_add(1));
    iter += 1;
    let policy = policy(sizes)?;
    if me == 0 && generation == 0 && std::env::var_os("FMX_ITEST_SIGNAL").is_some() {
        relay_signal()?;
    }
    let max_gen = std::env::var("FMX_ITEST_MAX_GEN").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(u32::MAX);
    let decided = if generation < max_gen { m.check(&policy).map_err(e2s)? } else { None };
    if let Some(dep) = decided {
        let next = dep.new_size();
        let err = dep.leave(|out| {
            if slow == Some((generation, me)) {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            out.value("iter", iter)?;
            for (a, &n) in sizes_for(next).iter().enumerate() {
                if die == Some((generation, me)) && a == 4 {
                    eprintln!("dying on purpose in world {generation} during the redistribution");
                    std::process::exit(3);
                }
                // The M-1 array is made for the new size; the others carry the work done.
                let block = if n == sizes_for(size)[a] { std::mem::take(&mut arrays[a]) } else { fresh(a, me, size, n, iter) };
                out.blocks(&format!("a{a}"), &block, n)?;
            }
            Ok(())
        });
        return Err(format!("leave: {}", err.map_err(e2s).err().map_or_else(String::new, |e| e)));
    }
    println!("OK walk iter={iter} size={size} reconfigs={generation}");
    m.finalize().map_err(e2s)
}

/// `FMX_ITEST_POLICY`: `schedule` (the sizes, the default), `external`
/// (fmxrun's request file) or `step:STEP:MIN:MAX`.
fn policy(sizes: Vec<u32>) -> R<Policy> {
    let p = std::env::var("FMX_ITEST_POLICY").unwrap_or_default();
    Ok(match p.split(':').collect::<Vec<_>>()[..] {
        [] | [""] | ["schedule"] => Policy::Schedule { sizes, every: 1 },
        ["external"] => Policy::External { file: None, every: 1 },
        ["step", step, min, max] => {
            let num = |v: &str| v.parse::<u32>().map_err(|_| format!("FMX_ITEST_POLICY: {v:?}"));
            Policy::Step { step: num(step)?, min: num(min)?, max: num(max)?, every: 1 }
        }
        _ => return Err(format!("FMX_ITEST_POLICY={p:?}")),
    })
}

/// Rank 0 of the first world asks fmxrun for one rank more with SIGUSR1 and
/// waits until fmxrun has written the request.
fn relay_signal() -> R {
    let launcher = std::env::var(fmx::ENV_LAUNCHER_PID).map_err(|_| "no launcher pid")?;
    let file = std::env::var(fmx::ENV_RECONFIG_REQUEST).map_err(|_| "no request file")?;
    let st = std::process::Command::new("kill").args(["-USR1", &launcher]).status().map_err(|e| format!("kill: {e}"))?;
    check!(st.success(), "kill -USR1 {launcher} failed");
    let t = std::time::Instant::now();
    while !std::path::Path::new(&file).exists() {
        check!(t.elapsed() < std::time::Duration::from_secs(20), "fmxrun did not write {file} within 20 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// Two halves of one world (even and odd ranks) joined by `intercomm_create`.
fn intercomm() -> R {
    let fmx = fmx::init().map_err(e2s)?;
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    check!(n >= 3, "needs 3 ranks");
    let half = w.split(Some(me % 2), me as i32).map_err(e2s)?.ok_or("split")?;
    // Leaders: world ranks 0 (evens) and 1 (odds), talking over the world.
    let remote_leader = if me % 2 == 0 { 1 } else { 0 };
    let ic = half.intercomm_create(0, w, remote_leader, 77).map_err(e2s)?;
    let (evens, odds) = (n.div_ceil(2), n / 2);
    let (mine, theirs) = if me % 2 == 0 { (evens, odds) } else { (odds, evens) };
    check!(ic.local_size() == mine && ic.remote_size() == theirs, "sizes {} {}", ic.local_size(), ic.remote_size());
    check!(ic.rank() == half.rank(), "rank");
    let (evens_g, odds_g): (Vec<u32>, Vec<u32>) = (0..n).partition(|r| r % 2 == 0);
    let (mine_g, theirs_g) = if me % 2 == 0 { (&evens_g, &odds_g) } else { (&odds_g, &evens_g) };
    check!(ic.local_group() == *mine_g && ic.remote_group() == *theirs_g, "groups {:?} {:?}", ic.local_group(), ic.remote_group());
    // Every local rank sends its rank to every remote rank; statuses name remote ranks.
    let sends: Vec<_> = (0..theirs).map(|d| [ic.rank() * 100 + d]).collect();
    let mut got = vec![[0u32]; theirs as usize];
    let st = ic
        .scope(|s| {
            let mut reqs = Vec::new();
            for (src, g) in got.iter_mut().enumerate() {
                reqs.push(s.irecv(g, src as u32, 5)?);
            }
            for (d, v) in sends.iter().enumerate() {
                reqs.push(s.isend(v, d as u32, 5)?);
            }
            s.wait_all(reqs)
        })
        .map_err(e2s)?;
    for (src, g) in got.iter().enumerate() {
        check!(g[0] == src as u32 * 100 + ic.rank() && st[src].source == src as u32, "from remote {src}: {} (status {:?})", g[0], st[src]);
    }
    let mut any = [0u32];
    if ic.rank() == 0 {
        ic.send(&[me], 0, 9).map_err(e2s)?;
        let st = ic.recv(&mut any, Source::Any, Tag::Any).map_err(e2s)?;
        check!(st.source == 0 && st.tag == 9 && any[0] == remote_leader, "leader swap {st:?} {any:?}");
    }
    ic.barrier().map_err(e2s)?;
    // Evens' blocks of 1001 elements to the odds, with the directionless API.
    let total = 1001;
    if me % 2 == 0 {
        let block: Vec<u64> = block_range(ic.rank(), ic.local_size(), total).map(|i| i * 3).collect();
        fmx::malleable::send_blocks(&ic, &block, total).map_err(e2s)?;
    } else {
        let got = fmx::malleable::recv_blocks::<u64>(&ic, total).map_err(e2s)?;
        check!(got.iter().copied().eq(block_range(ic.rank(), ic.local_size(), total).map(|i| i * 3)), "recv_blocks content");
    }
    match fmx::malleable::redistribute_blocks::<u64>(&ic, &[], total) {
        Err(fmx::Error::Intercomm { detail, .. }) if detail.contains("send_blocks and recv_blocks") => {}
        other => return Err(format!("redistribute_blocks without a direction gave {other:?}")),
    }
    // Bad remote rank: a clear error, not a hang.
    match ic.send(&[1u8], theirs, 0) {
        Err(fmx::Error::InvalidRank { rank, size, .. }) if rank == i64::from(theirs) && size == theirs => {}
        other => return Err(format!("send to remote rank {theirs} gave {other:?}")),
    }
    // Merge: odds pass high=false, so they come first.
    let merged = ic.merge(me % 2 == 0).map_err(e2s)?;
    check!(merged.size() == n, "merged size");
    let expect = if me % 2 == 1 { half.rank() } else { odds + half.rank() };
    check!(merged.rank() == expect, "merged rank {} expected {expect}", merged.rank());
    let mut sum = [0u32];
    merged.allreduce(&[me], &mut sum, fmx::Op::Sum).map_err(e2s)?;
    check!(sum[0] == n * (n - 1) / 2, "allreduce over merged");
    // Overlapping groups are refused with a clear error on every rank.
    match w.intercomm_create(0, w, 1, 78) {
        Err(e) if e.to_string().contains("disjoint") => {}
        other => return Err(format!("overlapping groups gave {other:?}")),
    }
    drop(ic);
    fmx.finalize().map_err(e2s)?;
    println!("OK intercomm");
    Ok(())
}

fn exchange(ic: &Intercomm, tag: i32) -> R {
    let me = ic.rank();
    for d in 0..ic.remote_size() {
        ic.send(&[me, d], d, tag).map_err(e2s)?;
    }
    for s in 0..ic.remote_size() {
        let mut v = [0u32; 2];
        let st = ic.recv(&mut v, s, tag).map_err(e2s)?;
        check!(v == [s, me] && st.source == s, "from remote {s}: {v:?}");
    }
    Ok(())
}

/// Old rank 1 waits on the intercommunicator with a world receive posted;
/// old rank 0's rendezvous send to it completes only if that wait also
/// progresses the world, and only then does old rank 0 let new rank 0 release
/// old rank 1 (valid MPI; one engine at a time would deadlock).
fn cross_progress(w: &fmx::Comm, ic: &Intercomm) -> R {
    const BIG: usize = 4 << 20;
    match (ic.side(), w.rank()) {
        (Some(fmx::Side::Old), 0) => {
            let big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
            w.send(&big, 1, 50).map_err(e2s)?;
            ic.send(&[1u32], 0, 51).map_err(e2s)?;
        }
        (Some(fmx::Side::Old), 1) => {
            let mut big = vec![0u8; BIG];
            let mut go = [0u32];
            w.scope(|s| {
                let r = s.irecv(&mut big, 0, 50)?;
                ic.recv(&mut go, 0, 52)?;
                s.wait(r)
            })
            .map_err(e2s)?;
            check!(go == [2] && big.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "cross-progress data");
        }
        (Some(fmx::Side::New), 0) => {
            let mut go = [0u32];
            ic.recv(&mut go, 0, 51).map_err(e2s)?;
            ic.send(&[2u32], 1, 52).map_err(e2s)?;
        }
        _ => {}
    }
    Ok(())
}

/// A world of 2 spawns 3 with `spawn_world`; the children find it with `parent`.
fn spawn() -> R {
    let fmx = fmx::init().map_err(e2s)?;
    let w = fmx.world();
    let ic = match fmx.parent().map_err(e2s)? {
        None => {
            check!(fmx.reconfig_count() == 0 && fmx.parent_size().is_none(), "first world");
            let ic = fmx.spawn_world(3, "hello").map_err(e2s)?;
            check!(ic.side() == Some(fmx::Side::Old) && ic.local_size() == 2 && ic.remote_size() == 3, "old side {ic:?}");
            ic
        }
        Some(ic) => {
            check!(fmx.spawn_values() == "hello" && fmx.reconfig_count() == 1 && fmx.parent_size() == Some(2), "values");
            check!(ic.side() == Some(fmx::Side::New) && ic.local_size() == 3 && ic.remote_size() == 2 && w.size() == 3, "new side {ic:?}");
            ic
        }
    };
    check!(
        ic.local_group() == (0..w.size()).collect::<Vec<_>>() && ic.remote_group() == (0..ic.remote_size()).collect::<Vec<_>>(),
        "groups"
    );
    exchange(&ic, 3)?;
    cross_progress(w, &ic)?;
    // 7 elements from 2 old ranks to 3 new ones (4+3 -> 3+2+2).
    let old = ic.side() == Some(fmx::Side::Old);
    let block: Vec<u32> = if old { block_range(w.rank(), 2, 7).map(|i| i as u32 + 10).collect() } else { Vec::new() };
    let got = fmx::malleable::redistribute_blocks(&ic, &block, 7).map_err(e2s)?;
    let want: Vec<u32> = if old { Vec::new() } else { block_range(w.rank(), 3, 7).map(|i| i as u32 + 10).collect() };
    check!(got == want, "redistribute_blocks gave {got:?}, expected {want:?}");
    if !old {
        match fmx::malleable::redistribute_blocks(&ic, &[1u32], 7) {
            Err(fmx::Error::Reconfig(e)) if e.contains("must pass an empty slice") => {}
            other => return Err(format!("a new rank passing data gave {other:?}")),
        }
    }
    ic.barrier().map_err(e2s)?;
    let merged = ic.merge(ic.side() == Some(fmx::Side::New)).map_err(e2s)?;
    check!(merged.size() == 5, "merged size");
    let mut sum = [0u32];
    merged.allreduce(&[merged.rank()], &mut sum, fmx::Op::Sum).map_err(e2s)?;
    check!(sum[0] == 10, "merged allreduce {sum:?}");
    drop(merged);
    ic.free().map_err(e2s)?;
    check!(w.allreduce(&[1u32], &mut sum, fmx::Op::Sum).is_ok() && sum[0] == w.size(), "world after free");
    fmx.finalize().map_err(e2s)?;
    println!("OK spawn {}", if old { "old" } else { "new" });
    Ok(())
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let r = match scenario.as_str() {
        "walk" => walk(),
        "intercomm" => intercomm(),
        "spawn" => spawn(),
        other => Err(format!("unknown scenario {other:?}")),
    };
    if let Err(e) = r {
        eprintln!("FAIL {scenario}: {e}");
        std::process::exit(1);
    }
}
