//! Intercommunicators, spawning and DMR-style reconfiguration, each job
//! launched under fmxrun's process manager (fmx_launcher).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use fmx_itest::dump;
use fmx_launcher::{Launch, Outcome};

fn launch(np: u32, scenario: &str, env: &[(&str, String)]) -> Outcome {
    let mut l = Launch::new(np, env!("CARGO_BIN_EXE_fmx-itest-malleable"));
    l.args = vec![scenario.into()];
    l.env = env.iter().map(|(k, v)| ((*k).into(), v.into())).collect();
    l.transport = std::env::var("FMX_ITEST_TRANSPORT").ok().filter(|t| !t.is_empty());
    l.capture = true;
    l.kill_grace = Duration::from_secs(10);
    l.timeout = Some(Duration::from_secs(300));
    let o = l.run().expect("launch");
    assert!(!o.timed_out, "{scenario} timed out:\n{}", dump(&o));
    o
}

fn lines<'a>(o: &'a Outcome, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    o.lines.iter().filter(move |(_, e, l)| !e && l.starts_with(prefix)).map(|(_, _, l)| l.as_str())
}

/// The sizes the worlds had, in order (from their `WORLD g size s` lines).
fn world_sizes(o: &Outcome) -> Vec<u32> {
    let set: BTreeSet<(u32, u32)> = lines(o, "WORLD ")
        .map(|l| {
            let v: Vec<&str> = l.split(' ').collect();
            (v[1].parse().unwrap(), v[3].parse().unwrap())
        })
        .collect();
    set.into_iter().map(|(_, s)| s).collect()
}

/// Every process of every world is gone, and nothing of the job is left in the shm directory.
fn assert_clean(o: &Outcome) {
    for pid in lines(o, "PID ").map(|l| l[4..].to_string()) {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} outlived the job");
    }
    let left = fmx_itest::files_left(&o.job);
    assert!(left.is_empty(), "files left: {left:?}");
    assert!(!std::env::temp_dir().join(format!("fmx-{}.reconfig", o.job)).exists(), "request file left");
}

/// A walk that visits every transition N -> M, N and M in 1..=6, once
/// (an Euler circuit of the complete digraph with loops), from world size `first`.
fn every_transition(first: u32) -> Vec<u32> {
    let mut out: Vec<Vec<u32>> = (0..=6).map(|_| (1..=6).collect()).collect();
    let (mut stack, mut path) = (vec![first], Vec::new());
    while let Some(&v) = stack.last() {
        match out[v as usize].pop() {
            Some(w) => stack.push(w),
            None => path.push(stack.pop().unwrap()),
        }
    }
    path.reverse();
    path
}

fn join(sizes: &[u32]) -> String {
    sizes.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn every_n_to_m_from_1_to_6_in_one_job() {
    let walk = every_transition(1);
    let pairs: BTreeSet<(u32, u32)> = walk.windows(2).map(|w| (w[0], w[1])).collect();
    assert_eq!((pairs.len(), walk.len()), (36, 37), "the walk covers all 36 transitions once");
    let o = launch(walk[0], "walk", &[("FMX_ITEST_SIZES", join(&walk[1..]))]);
    assert_eq!(o.code, 0, "{}", dump(&o));
    assert_eq!(world_sizes(&o), walk, "{}", dump(&o));
    let last = *walk.last().unwrap();
    let ok: Vec<_> = lines(&o, "OK walk").collect();
    assert_eq!(ok.len(), last as usize, "{}", dump(&o));
    assert!(ok.iter().all(|l| *l == format!("OK walk iter=37 size={last} reconfigs=36")), "{ok:?}");
    assert_clean(&o);
}

#[test]
fn checkpoint_restart_carries_the_same_state_through_files() {
    let dir = std::env::temp_dir().join(format!("fmx-ckpt-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let env = [
        ("FMX_ITEST_SIZES", "5,1,3,3,6".to_string()),
        ("FMX_MALLEABLE_MODE", "checkpoint".to_string()),
        ("FMX_CHECKPOINT_DIR", dir.to_string_lossy().into_owned()),
    ];
    let o = launch(2, "walk", &env);
    assert_eq!(o.code, 0, "{}", dump(&o));
    assert_eq!(world_sizes(&o), [2, 5, 1, 3, 3, 6]);
    assert_eq!(lines(&o, "OK walk iter=6 size=6 reconfigs=5").count(), 6, "{}", dump(&o));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "checkpoint files left: {left:?}");
    std::fs::remove_dir(&dir).unwrap();
    assert_clean(&o);
}

#[test]
fn a_rank_dying_during_redistribution_fails_the_job() {
    // World 1 (4 ranks) moves to 2; its rank 2 exits before sending the large array.
    let env = [("FMX_ITEST_SIZES", "4,2".to_string()), ("FMX_ITEST_DIE", "1:2".to_string())];
    let o = launch(3, "walk", &env);
    // Usually the dead rank's code 3; under load a peer's own failure (code 1)
    // may reach fmxrun first.
    assert!(o.code == 3 || o.code == 1, "the job fails:\n{}", dump(&o));
    assert!(o.lines.iter().any(|(_, e, l)| *e && l.contains("dying on purpose")), "{}", dump(&o));
    assert_eq!(lines(&o, "OK").count(), 0, "nobody may finish:\n{}", dump(&o));
    assert_eq!(world_sizes(&o), [3, 4, 2], "{}", dump(&o));
    // The new world noticed by itself (within the grace period), not by being killed.
    let failed = o.lines.iter().filter(|(_, e, l)| *e && l.starts_with("FAIL walk")).count();
    assert!(failed >= 2, "the other ranks report the failure:\n{}", dump(&o));
    assert!(o.lines.iter().any(|(_, e, l)| *e && l.contains("is gone")), "a receiver names the dead rank:\n{}", dump(&o));
    assert_clean(&o);
}

#[test]
fn step_policy_grows_to_max_then_shrinks() {
    let env = [("FMX_ITEST_POLICY", "step:2:1:5".to_string()), ("FMX_ITEST_MAX_GEN", "5".to_string())];
    let o = launch(1, "walk", &env);
    assert_eq!(o.code, 0, "{}", dump(&o));
    assert_eq!(world_sizes(&o), [1, 3, 5, 3, 1, 3]);
    assert_eq!(lines(&o, "OK walk iter=6 size=3 reconfigs=5").count(), 3, "{}", dump(&o));
}

#[test]
fn fmxrun_relays_sigusr1_as_a_request_for_one_more_rank() {
    let env = [("FMX_ITEST_POLICY", "external".to_string()), ("FMX_ITEST_SIGNAL", "1".to_string())];
    let o = launch(2, "walk", &env);
    assert_eq!(o.code, 0, "{}", dump(&o));
    assert_eq!(world_sizes(&o), [2, 3], "{}", dump(&o));
    assert_eq!(lines(&o, "OK walk iter=2 size=3 reconfigs=1").count(), 3, "{}", dump(&o));
    assert_clean(&o);
}

#[test]
fn a_bad_external_request_is_an_error_that_names_it() {
    let file = std::env::temp_dir().join(format!("fmx-bad-request-{}", std::process::id()));
    std::fs::write(&file, "-5\n").unwrap();
    let env = [("FMX_ITEST_POLICY", "external".to_string()), ("FMX_RECONFIG_REQUEST", file.to_string_lossy().into_owned())];
    // FMX_RECONFIG_REQUEST from the test overrides fmxrun's own file.
    let o = launch(2, "walk", &env);
    assert_ne!(o.code, 0, "{}", dump(&o));
    let errs: Vec<_> = o.lines.iter().filter(|(_, e, l)| *e && l.contains("FAIL walk")).collect();
    assert_eq!(errs.len(), 2, "every rank reports it:\n{}", dump(&o));
    assert!(errs.iter().any(|(_, _, l)| l.contains("\"-5\"") && l.contains("no ranks")), "{}", dump(&o));
    assert!(!file.exists(), "the request was taken");
}

#[test]
fn intercomm_create_between_two_halves_of_a_world() {
    let o = launch(5, "intercomm", &[]);
    assert_eq!(o.code, 0, "{}", dump(&o));
    assert_eq!(lines(&o, "OK intercomm").count(), 5, "{}", dump(&o));
}

#[test]
fn spawn_world_connects_both_worlds() {
    let o = launch(2, "spawn", &[]);
    assert_eq!(o.code, 0, "{}", dump(&o));
    assert_eq!(lines(&o, "OK spawn old").count(), 2, "{}", dump(&o));
    assert_eq!(lines(&o, "OK spawn new").count(), 3, "{}", dump(&o));
}
