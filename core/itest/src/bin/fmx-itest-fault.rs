//! Rank program of the failure tests (tests/faults.rs): `fmx-itest-fault SCENARIO`.
//!
//! A victim fails (panics, returns an error, is killed, exits early); it
//! prints `DYING at=<unix ms>` just before. Every other rank reports what its
//! pending operation answered: `GONE by=<rank> named=<rank> pending=<bool>
//! at=<unix ms> err=<message>` for an error that names a rank, `WRONG ...`
//! for anything else. With `FAULT_LINGER=1` a rank stays alive after its
//! error (as a program that keeps computing would), so that only fmxrun's
//! notice can reach the ranks still waiting on it.

use fmx::{Error, Fmx, Op, Source, Tag};

type R = Result<(), String>;

fn e2s(e: Error) -> String {
    e.to_string()
}

fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn dying() {
    println!("DYING at={}", now_ms());
}

/// SIGKILL, as an OOM killer or a node failure would.
fn kill_self() -> ! {
    dying();
    let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
    std::thread::sleep(std::time::Duration::from_secs(60));
    unreachable!("kill -9 did not kill us");
}

/// Runs `op` as an iterative program would (again and again, at most for
/// 20 s) until it fails, then reports.
fn repeat(me: u32, mut op: impl FnMut() -> Result<(), Error>) -> R {
    let t = std::time::Instant::now();
    loop {
        match op() {
            Ok(()) if t.elapsed().as_secs() < 20 => {}
            r => return report(me, r),
        }
    }
}

/// Prints what a survivor's operation answered; lingers if asked.
fn report(me: u32, r: Result<(), Error>) -> R {
    match r {
        Ok(()) => println!("WRONG by={me} the operation succeeded"),
        Err(e @ Error::PeerGone { rank, pending, .. }) => {
            println!("GONE by={me} named={rank} pending={pending} at={} err={e}", now_ms());
        }
        Err(e) => println!("WRONG by={me} err={e:?}"),
    }
    if env("FAULT_LINGER") == "1" {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
    Err("the job failed, as it should".into())
}

fn main() {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    if scenario == "exit-before-init" && env("FMX_RANK") == "1" {
        std::process::exit(0);
    }
    let r = match scenario.as_str() {
        "panic" => panic_probe(),
        "kill" => kill_probe(),
        "wildcard" => wildcard(),
        "wildcard-pending" => wildcard_pending(),
        "exit-before-init" => exit_before_init(),
        "blocks-huge" => blocks_huge(),
        "rendezvous-kill" => rendezvous_kill(),
        other => Err(format!("unknown scenario {other:?}")),
    };
    fmx_itest::report(&scenario, r);
}

fn init() -> Result<Fmx, String> {
    fmx::init().map_err(|e| format!("init: {e}"))
}

/// Rank 0 fails in `FAULT_WHERE` (user code, an active-message handler, a
/// collective's reduction, or `main` returning an error) while the others
/// wait on it.
fn panic_probe() -> R {
    let fmx = init()?;
    let w = fmx.world();
    let me = w.rank();
    let place = env("FAULT_WHERE");
    let am = w.active_messages();
    am.register(1, |_, _| {
        dying();
        panic!("probe: a panic inside an active-message handler");
    });
    w.barrier().map_err(e2s)?;
    if me == 0 {
        match place.as_str() {
            "user" => {
                dying();
                panic!("probe: a panic in user code");
            }
            "err" => {
                dying();
                // `main` returns this through `?`: Fmx is dropped on the way (not a panic).
                return Err("probe: an error returned from main".into());
            }
            "am" => loop {
                am.extract(usize::MAX).map_err(e2s)?;
            },
            "coll" => {}
            other => return Err(format!("FAULT_WHERE={other:?}")),
        }
    }
    if place == "am" && me == 1 {
        am.begin_message_blocking(0, 0, 1).map_err(e2s)?.end_message().map_err(e2s)?;
    }
    if place == "coll" {
        let panics_on_0 = |a: &[u64], b: &mut [u64]| {
            if me == 0 {
                dying();
                panic!("probe: a panic inside a collective's reduction");
            }
            b[0] += a[0];
        };
        let mut out = [0u64];
        return repeat(me, || w.allreduce(&[1u64], &mut out, Op::User(&panics_on_0)));
    }
    let mut b = [0u8; 8];
    report(me, w.recv(&mut b, 0, 1).map(drop))
}

/// `FAULT_VICTIM` (default 3) is killed while the others are in
/// `FAULT_COLL`: allreduce, bcast, barrier, neighbor (a ring's
/// neighbor_alltoall) or spawn (spawn_world).
fn kill_probe() -> R {
    let fmx = init()?;
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    let victim = env("FAULT_VICTIM").parse().unwrap_or(3) % n;
    let (_, g) = fmx_itest::topology::ring_graph(w)?;
    w.barrier().map_err(e2s)?;
    if me == victim {
        std::thread::sleep(std::time::Duration::from_millis(300));
        kill_self();
    }
    let coll = env("FAULT_COLL");
    let mut out = [0u64; 4];
    let mut halo = [0u32; 2];
    repeat(me, || match coll.as_str() {
        "allreduce" => w.allreduce(&[1u64; 4], &mut out, Op::Sum),
        "bcast" => w.bcast(&mut out, victim),
        "barrier" => w.barrier(),
        "neighbor" => g.neighbor_alltoall(&[me; 2], &mut halo),
        "spawn" => fmx.spawn_world(1, "").map(drop),
        other => Err(Error::Launch(format!("FAULT_COLL={other:?}"))),
    })
}

/// `FAULT_VICTIM` (default the last rank) exits with code 3 while the
/// others receive from any source.
fn wildcard() -> R {
    let fmx = init()?;
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    w.barrier().map_err(e2s)?;
    if me == n - 1 {
        dying();
        std::process::exit(3);
    }
    let mut b = [0u8; 8];
    report(me, w.recv(&mut b, Source::Any, Tag::Any).map(drop))
}

/// Under `fmxrun --keep-going` (ULFM semantics): the last rank exits with
/// code 3; every survivor's receive from any source reports it once and
/// stays pending, and then completes with a message from a live rank; a
/// blocking receive from any source fails naming it; finalize completes
/// without it.
fn wildcard_pending() -> R {
    let fmx = init()?;
    let w = fmx.world();
    let (me, n) = (w.rank(), w.size());
    let dead = n - 1;
    let live = w.split((me != dead).then_some(0), 0).map_err(e2s)?;
    w.barrier().map_err(e2s)?;
    let Some(live) = live else {
        dying();
        std::process::exit(3);
    };
    let (m, from) = (live.size(), (me + live.size() - 1) % live.size());
    let mut got = [0u32];
    let token = [me];
    w.scope(|s| {
        let mut req = s.irecv(&mut got, Source::Any, 5)?;
        match s.wait_mut(&mut req) {
            Err(Error::PeerGone { rank, pending: true, .. }) if rank == dead => {}
            other => return Err(Error::Launch(format!("first wait: expected a pending PeerGone for rank {dead}, got {other:?}"))),
        }
        // Nobody sends before every survivor has seen the error.
        live.barrier()?;
        let _ = s.isend(&token, (me + 1) % m, 5)?;
        let st = s.wait_mut(&mut req)?;
        if st.source != from {
            return Err(Error::Launch(format!("second wait: a message from {}, expected {from}", st.source)));
        }
        Ok(())
    })
    .map_err(|e| format!("rank {me}: {e}"))?;
    if got[0] != from {
        return Err(format!("rank {me} received {} from {from}", got[0]));
    }
    // A blocking receive from any source is not kept: it fails naming the dead rank.
    match w.recv(&mut got, Source::Any, 6) {
        Err(Error::PeerGone { rank, pending: false, .. }) if rank == dead => {}
        other => return Err(format!("blocking recv(any): expected PeerGone for rank {dead}, got {other:?}")),
    }
    live.barrier().map_err(e2s)?;
    drop(live);
    fmx.finalize().map_err(e2s)
}

/// Rank 0 is killed while rank 1 receives its 64 MiB message (a rendezvous
/// in flight): rank 1 gets an error naming rank 0.
fn rendezvous_kill() -> R {
    let fmx = init()?;
    let w = fmx.world();
    let me = w.rank();
    let big = vec![7u8; 64 << 20];
    w.barrier().map_err(e2s)?;
    if me == 0 {
        let delay: u64 = env("FAULT_DELAY_MS").parse().unwrap_or(5);
        w.scope(|s| {
            let _ = s.isend(&big, 1, 1)?;
            std::thread::sleep(std::time::Duration::from_millis(delay));
            kill_self();
        })
        .map_err(e2s)?;
        return Ok(());
    }
    let mut got = vec![0u8; 64 << 20];
    report(me, w.recv(&mut got, 0, 1).map(drop))
}

/// Rank 1 exits with code 0 before calling `fmx::init` (see main).
fn exit_before_init() -> R {
    let t = std::time::Instant::now();
    match fmx::init() {
        Ok(_) => Err("init succeeded without rank 1".into()),
        Err(e) => {
            println!("INIT-FAILED after_ms={} err={e}", t.elapsed().as_millis());
            Err("the job failed, as it should".into())
        }
    }
}

/// send_blocks / recv_blocks across two halves of a world with a global size
/// (`FAULT_N`) whose blocks cannot be held: an error on every rank, naming it.
fn blocks_huge() -> R {
    let fmx = init()?;
    let w = fmx.world();
    let me = w.rank();
    let n: u64 = env("FAULT_N").parse().map_err(|_| "FAULT_N")?;
    let half = w.split(Some(me % 2), me as i32).map_err(e2s)?.ok_or("split")?;
    let ic = half.intercomm_create(0, w, u32::from(me % 2 == 0), 9).map_err(e2s)?;
    let r = if me % 2 == 0 {
        fmx::malleable::send_blocks::<u64>(&ic, &[1, 2, 3], n)
    } else {
        fmx::malleable::recv_blocks::<u64>(&ic, n).map(drop)
    };
    match r {
        Ok(()) => Err(format!("rank {me}: a global size of {n} was accepted")),
        Err(e) => {
            println!("BLOCKS-ERROR by={me} err={e}");
            Err("the job failed, as it should".into())
        }
    }
}
