//! Nothing silent, nothing hangs: a rank that panics, is killed, returns an
//! error or exits early is named by every other rank within a bounded time,
//! and the job ends with a failing code (issue 15; each test is named after
//! the item it covers). The rank program is `fmx-itest-fault`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fmx_itest::dump;
use fmx_launcher::{Launch, Outcome};

fn launch(np: u32, scenario: &str, env: &[(&str, &str)]) -> Launch {
    let mut l = Launch::new(np, env!("CARGO_BIN_EXE_fmx-itest-fault"));
    l.args = vec![scenario.into()];
    l.env = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    l.transport = std::env::var("FMX_ITEST_TRANSPORT").ok().filter(|t| !t.is_empty());
    l.capture = true;
    l.timeout = Some(Duration::from_secs(120));
    l
}

fn unix_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// `key=value` of a line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// What each survivor reported: rank -> (named rank, pending, at ms).
fn gone(o: &Outcome) -> BTreeMap<u32, (u32, bool, u128)> {
    o.lines
        .iter()
        .filter(|(_, e, l)| !e && l.starts_with("GONE "))
        .map(|(r, _, l)| {
            let named = field(l, "named").and_then(|v| v.parse().ok()).expect("named=");
            let pending = field(l, "pending") == Some("true");
            let at = field(l, "at").and_then(|v| v.parse().ok()).expect("at=");
            (*r, (named, pending, at))
        })
        .collect()
}

fn dying_at(o: &Outcome) -> u128 {
    o.lines
        .iter()
        .find_map(|(_, e, l)| (!e).then(|| field(l, "at").filter(|_| l.starts_with("DYING"))).flatten())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no DYING line:\n{}", dump(o)))
}

fn no_wrong_answers(o: &Outcome) {
    let wrong: Vec<_> = o.lines.iter().filter(|(_, e, l)| !e && l.starts_with("WRONG")).collect();
    assert!(wrong.is_empty(), "wrong answers {wrong:?}:\n{}", dump(o));
}

fn assert_no_files(o: &Outcome) {
    let left = fmx_itest::files_left(&o.job);
    assert!(left.is_empty(), "files left behind: {left:?}");
}

/// Item 1: rank 0 panics (in user code, in an active-message handler, in a
/// collective's reduction) or returns an error from `main`, while the others
/// wait on it. Every other rank gets an error naming rank 0, and the job
/// fails within the kill grace plus 1 s of the failure.
#[test]
fn item01_a_rank_that_panics_or_returns_an_error_is_named_and_fails_the_job() {
    let grace = Duration::from_secs(2);
    for place in ["user", "am", "coll", "err"] {
        for np in [2u32, 8] {
            let mut l = launch(np, "panic", &[("FAULT_WHERE", place)]);
            l.kill_grace = grace;
            let o = l.run().expect("launch");
            let ended = unix_ms();
            let what = format!("{place} on {np} ranks");
            assert_ne!(o.code, 0, "{what}: the job must fail:\n{}", dump(&o));
            if place != "err" {
                // (an error returned from main is only an exit code: every rank's
                // is 1 once the others have reported it, in any order)
                assert_eq!(o.failed_rank, Some(0), "{what}:\n{}", dump(&o));
            }
            no_wrong_answers(&o);
            let g = gone(&o);
            assert_eq!(g.len(), np as usize - 1, "{what}: every other rank reports:\n{}", dump(&o));
            assert!(g.values().all(|&(named, pending, _)| named == 0 && !pending), "{what}: {g:?}");
            let took = ended - dying_at(&o);
            // Bounded, not timed: about grace + 0.2 s here (README), but a
            // machine shared with another CPU-heavy job stretches it.
            assert!(took <= (grace + Duration::from_secs(5)).as_millis(), "{what}: the job took {took} ms to end:\n{}", dump(&o));
            eprintln!("item 1: {what}: job ended {took} ms after the failure, code {}", o.code);
            assert_no_files(&o);
        }
    }
}

/// Item 2: one of 8 ranks is killed while the others are in a collective,
/// and survivors stay alive after their error. fmxrun's notice reaches every
/// survivor, even those blocked on a live peer, naming the rank that died
/// (in tens of milliseconds here, see the README; the assertion allows 2.5 s,
/// under the 3 s grace, for a machine shared with another CPU-heavy job);
/// fmxrun kills the lingering ranks after the grace.
#[test]
fn item02_a_death_inside_a_collective_reaches_every_survivor_before_the_grace_ends() {
    for coll in ["allreduce", "bcast", "barrier", "neighbor", "spawn"] {
        let mut l = launch(8, "kill", &[("FAULT_COLL", coll), ("FAULT_LINGER", "1"), ("FAULT_VICTIM", "3")]);
        l.kill_grace = Duration::from_secs(3);
        let o = l.run().expect("launch");
        assert_eq!(o.code, 137, "{coll}: the job's code is the killed rank's:\n{}", dump(&o));
        assert_eq!(o.failed_rank, Some(3), "{coll}:\n{}", dump(&o));
        no_wrong_answers(&o);
        let g = gone(&o);
        assert_eq!(g.len(), 7, "{coll}: every survivor reports:\n{}", dump(&o));
        let died = dying_at(&o);
        let mut times = Vec::new();
        for (r, &(named, _, at)) in &g {
            assert_eq!(named, 3, "{coll}: rank {r} named rank {named}:\n{}", dump(&o));
            let took = at.saturating_sub(died);
            assert!(took <= 2500, "{coll}: rank {r} learned of the death after {took} ms:\n{}", dump(&o));
            times.push(took);
        }
        times.sort_unstable();
        eprintln!("item 2: {coll:>9}: survivors named rank 3 after {times:?} ms (max {} ms)", times[times.len() - 1]);
        assert_no_files(&o);
    }
}

/// Item 3: a receive from any source fails when one member dies (under
/// fmxrun's default, through its notice too). Survivors linger after their
/// error: one that exited at once would be a second dead member, and a
/// slower survivor (seen in the emulated VM) could rightly name it instead.
#[test]
fn item03_a_receive_from_any_source_fails_when_a_member_dies() {
    let o = launch(4, "wildcard", &[("FAULT_LINGER", "1"), ("FMX_LOG", "warn")]).run().expect("launch");
    assert_eq!(o.code, 3, "{}", dump(&o));
    no_wrong_answers(&o);
    let g = gone(&o);
    assert_eq!(g.len(), 3, "{}", dump(&o));
    assert!(g.values().all(|&(named, _, _)| named == 3), "{g:?}");
    // FMX_LOG=warn: each survivor logs the loss once.
    for r in 0..3 {
        let n = o.lines.iter().filter(|(who, e, l)| *who == r && *e && l.contains("WARN") && l.contains("rank 3 is gone")).count();
        assert_eq!(n, 1, "rank {r} logged the loss {n} times:\n{}", dump(&o));
    }
    assert_no_files(&o);
}

/// Item 3 (ULFM): with `--keep-going`, a pending wildcard receive reports the
/// dead member once, stays pending and completes from a live rank; a
/// blocking one fails naming it; finalize completes without it.
#[test]
fn item03_with_keep_going_a_wildcard_receive_stays_pending_and_completes() {
    let mut l = launch(4, "wildcard-pending", &[]);
    l.keep_going = true;
    let o = l.run().expect("launch");
    assert_eq!(o.code, 3, "the job's code is still the dead rank's:\n{}", dump(&o));
    let oks = o.lines.iter().filter(|(_, e, l)| !e && l == "OK wildcard-pending").count();
    assert_eq!(oks, 3, "{}", dump(&o));
    assert_no_files(&o);
}

/// Item 4: send_blocks/recv_blocks with a global size whose blocks cannot be
/// held is an error on every rank, naming the size (no panic, no abort).
#[test]
fn item04_blocks_that_cannot_be_held_are_an_error_on_every_rank() {
    for n in [1u64 << 40, u64::MAX] {
        let n = n.to_string();
        let o = launch(2, "blocks-huge", &[("FAULT_N", &n)]).run().expect("launch");
        let errs: Vec<_> = o.lines.iter().filter(|(_, e, l)| !e && l.starts_with("BLOCKS-ERROR")).collect();
        assert_eq!(errs.len(), 2, "n={n}: both ranks report an error:\n{}", dump(&o));
        assert!(errs.iter().all(|(_, _, l)| l.contains(&n)), "n={n}: the errors name the size:\n{}", dump(&o));
        assert!(!o.lines.iter().any(|(_, _, l)| l.contains("panicked")), "n={n}:\n{}", dump(&o));
        assert_eq!(o.code, 1, "{}", dump(&o));
    }
}

/// Item 16: a rank that exits 0 before `fmx::init` is named by the others
/// within a few seconds (not after the 120 s start-up timeout).
#[test]
fn item16_a_rank_that_exits_before_init_is_named_within_seconds() {
    let t = Instant::now();
    let o = launch(3, "exit-before-init", &[]).run().expect("launch");
    assert_ne!(o.code, 0, "{}", dump(&o));
    assert_eq!(o.failed_rank, Some(1), "{}", dump(&o));
    let fails: Vec<_> = o.lines.iter().filter(|(_, e, l)| !e && l.starts_with("INIT-FAILED")).collect();
    assert_eq!(fails.len(), 2, "{}", dump(&o));
    for (r, _, l) in fails {
        assert!(l.contains("rank 1") && l.contains("before calling fmx::init"), "rank {r}: {l}");
        let ms: u64 = field(l, "after_ms").and_then(|v| v.parse().ok()).expect("after_ms");
        assert!(ms < 5000, "rank {r} failed after {ms} ms");
    }
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
}

/// Item 14: a wrapper that sets a wrong FMX_SIZE or the same FMX_RANK for
/// every process gets an error naming the conflict, on every rank.
#[test]
fn item14_a_wrong_size_or_a_duplicate_rank_is_named() {
    let o = launch(4, "kill", &[("FMX_SIZE", "5")]).run().expect("launch");
    assert_ne!(o.code, 0);
    let init_errors: Vec<_> = o.lines.iter().filter(|(_, e, l)| *e && l.contains("FAIL kill: init:")).collect();
    assert_eq!(init_errors.len(), 4, "every rank fails init:\n{}", dump(&o));
    assert!(init_errors.iter().all(|(_, _, l)| l.contains("5 ranks, but fmxrun started 4") && l.contains("FMX_SIZE")), "{}", dump(&o));

    let o = launch(3, "kill", &[("FMX_RANK", "1")]).run().expect("launch");
    assert_ne!(o.code, 0);
    let init_errors: Vec<_> = o.lines.iter().filter(|(_, e, l)| *e && l.contains("FAIL kill: init:")).collect();
    assert_eq!(init_errors.len(), 3, "every rank fails init:\n{}", dump(&o));
    assert!(init_errors.iter().all(|(_, _, l)| l.contains("rank 1") && l.contains("claimed by two processes")), "{}", dump(&o));
}

/// Item 15: with `/dev/shm` too small for a segment (a 256 KiB tmpfs in a
/// private mount namespace), init fails on every rank with an error naming
/// `/dev/shm`, the bytes needed and the bytes free; no rank dies of SIGBUS.
#[test]
fn item15_a_full_dev_shm_is_an_error_at_init_naming_it() {
    let rank = env!("CARGO_BIN_EXE_fmx-itest-fault");
    let mut l = Launch::new(4, "unshare");
    // -r: a user namespace, so that the mount needs no privilege.
    l.args = ["-rm", "sh", "-c", "mount -t tmpfs -o size=256k fmx-full /dev/shm && exec \"$0\" kill", rank].map(Into::into).to_vec();
    l.capture = true;
    l.timeout = Some(Duration::from_secs(60));
    l.env = vec![("FMX_TRANSPORT".into(), "shm".into())];
    let o = l.run().expect("launch");
    assert_eq!(o.code, 1, "{}", dump(&o));
    let errs: Vec<_> = o.lines.iter().filter(|(_, e, l)| *e && l.contains("FAIL kill: init:")).collect();
    assert_eq!(errs.len(), 4, "every rank fails init:\n{}", dump(&o));
    for (r, _, l) in errs {
        assert!(l.contains("in /dev/shm (") && l.contains("bytes free there") && l.contains("reserving"), "rank {r}: {l}");
    }
}

/// Item 5: the sender of a 64 MiB message (a rendezvous in flight) is
/// killed at various moments; the receiver always gets an error naming it
/// (over libfabric's shm provider its read never completes: the transport
/// abandons it, closing the endpoint, instead of waiting for ever).
#[test]
fn item05_a_killed_rendezvous_sender_is_named_by_the_receiver() {
    for delay in [0u32, 1, 2, 5, 10, 20, 40] {
        let d = delay.to_string();
        let mut l = launch(2, "rendezvous-kill", &[("FAULT_DELAY_MS", &d)]);
        l.kill_grace = Duration::from_secs(10);
        let o = l.run().expect("launch");
        assert_eq!(o.code, 137, "delay {delay} ms:\n{}", dump(&o));
        no_wrong_answers(&o);
        let g = gone(&o);
        assert_eq!(g.get(&1).map(|x| x.0), Some(0), "delay {delay} ms: rank 1 must name rank 0:\n{}", dump(&o));
        let took = g[&1].2.saturating_sub(dying_at(&o));
        assert!(took < 5000, "delay {delay} ms: rank 1 knew after {took} ms");
        assert_no_files(&o);
    }
}
