//! Mismatched and erroneous calls (issue 15, items 7-13): no silent wrong
//! answer, no hang; in the checking mode (`FMX_CHECK=collectives`) an error
//! on every rank naming which ranks disagree and how. The rank program is
//! `fmx-itest-misuse`.

use std::time::Duration;

use fmx_itest::dump;
use fmx_launcher::{Launch, Outcome};

const CHECK: (&str, &str) = ("FMX_CHECK", "collectives");
/// What a rank's untouched receive slot holds (a value sent data never has).
const SENTINEL: &str = "18446744073709551615";

fn run(np: u32, scenario: &str, env: &[(&str, &str)]) -> Outcome {
    let mut l = Launch::new(np, env!("CARGO_BIN_EXE_fmx-itest-misuse"));
    l.args = vec![scenario.into()];
    l.env = env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    l.transport = std::env::var("FMX_ITEST_TRANSPORT").ok().filter(|t| !t.is_empty());
    l.capture = true;
    // A hang is a failure: well within this, every rank must have answered.
    l.timeout = Some(Duration::from_secs(60));
    l.run().expect("launch")
}

/// Every rank's answer line (`OKV ...` or `ERR ...`), by rank.
fn answers(o: &Outcome) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = o
        .lines
        .iter()
        .filter(|(_, e, l)| !e && (l.starts_with("OKV ") || l.starts_with("ERR ")))
        .map(|(r, _, l)| (*r, l.clone()))
        .collect();
    v.sort();
    v
}

fn run_ok(np: u32, scenario: &str) {
    let o = run(np, scenario, &[]);
    assert_eq!(o.code, 0, "{scenario} on {np} ranks:\n{}", dump(&o));
    let oks = o.lines.iter().filter(|(_, e, l)| !e && *l == format!("OK {scenario}")).count();
    assert_eq!(oks, np as usize, "{scenario} on {np} ranks:\n{}", dump(&o));
}

/// Without the checking mode: the job ends (no hang), every rank answered,
/// and no rank returned Ok with data it did not get (the sentinel).
fn no_silent_wrong_answer(np: u32, scenario: &str) {
    let o = run(np, scenario, &[]);
    assert!(!o.timed_out, "{scenario}: a rank hung:\n{}", dump(&o));
    let a = answers(&o);
    assert_eq!(a.len(), np as usize, "{scenario}: every rank answers:\n{}", dump(&o));
    for (r, l) in &a {
        assert!(!(l.starts_with("OKV") && l.contains(SENTINEL)), "{scenario}: rank {r} returned Ok with data it never got: {l}");
        assert!(!l.contains("value=(400000, false)") && !l.contains("value=(400001, false)"), "{scenario}: rank {r}: {l}");
    }
    assert!(a.iter().any(|(_, l)| l.starts_with("ERR")), "{scenario}: the mismatch went unnoticed:\n{}", dump(&o));
}

/// With `FMX_CHECK=collectives`: every rank fails with a CollectiveMismatch
/// whose message names each group of ranks and what it called.
fn every_rank_names_the_disagreement(np: u32, scenario: &str, expect: &[&str]) {
    let o = run(np, scenario, &[CHECK]);
    assert!(!o.timed_out, "{scenario}: a rank hung:\n{}", dump(&o));
    let a = answers(&o);
    assert_eq!(a.len(), np as usize, "{scenario}:\n{}", dump(&o));
    for (r, l) in &a {
        assert!(l.starts_with("ERR") && l.contains("kind=CollectiveMismatch"), "{scenario}: rank {r}: {l}");
        for e in expect {
            assert!(l.contains(e), "{scenario}: rank {r} does not say {e:?}: {l}");
        }
    }
}

#[test]
fn item07_bcast_with_different_roots_is_an_error_on_every_rank_in_the_checking_mode() {
    every_rank_names_the_disagreement(
        4,
        "bcast-roots",
        &["ranks 0, 2 called bcast (root 0, 2 elements", "ranks 1, 3 called bcast (root 1, 2 elements"],
    );
}

#[test]
fn item08_collectives_with_different_lengths_never_return_data_they_did_not_get() {
    for scenario in ["bcast-lengths", "alltoall-lengths", "gather-lengths"] {
        no_silent_wrong_answer(4, scenario);
    }
    every_rank_names_the_disagreement(
        4,
        "bcast-lengths",
        &["ranks 0, 2 called bcast (root 0, 4 elements", "ranks 1, 3 called bcast (root 0, 5 elements"],
    );
    every_rank_names_the_disagreement(
        4,
        "alltoall-lengths",
        &["ranks 0, 2 called alltoall (8 elements", "ranks 1, 3 called alltoall (12 elements"],
    );
    every_rank_names_the_disagreement(
        4,
        "gather-lengths",
        &["ranks 0, 2 called gather (root 0, 2 elements", "ranks 1, 3 called gather (root 0, 3 elements"],
    );
}

#[test]
fn item08_a_short_collective_message_is_named_by_collective_not_by_tag() {
    let o = run(4, "bcast-lengths", &[]);
    let errs: Vec<_> = answers(&o).into_iter().filter(|(_, l)| l.starts_with("ERR")).collect();
    assert!(!errs.is_empty(), "{}", dump(&o));
    for (r, l) in errs {
        assert!(
            l.contains("collective bcast: rank ") && l.contains(" sent 32 bytes where this rank expects 40 bytes") && !l.contains("tag"),
            "rank {r}: {l}"
        );
    }
}

#[test]
fn item09_allreduce_with_different_lengths_fails_without_a_hang() {
    no_silent_wrong_answer(4, "allreduce-lengths");
    every_rank_names_the_disagreement(4, "allreduce-lengths", &["called allreduce (400000 elements", "called allreduce (400001 elements"]);
}

#[test]
fn item10_a_collective_against_a_barrier_and_reduce_with_different_roots_are_errors() {
    // Without the checking mode, a rank waiting in allreduce for a peer
    // whose barrier message is already there names the disagreement. (Reduce
    // with different roots is a wait cycle with no message at all: only the
    // checking mode can see it.)
    let o = run(4, "coll-vs-barrier", &[]);
    assert!(!o.timed_out, "a rank hung:\n{}", dump(&o));
    let a = answers(&o);
    assert_eq!(a.len(), 4, "{}", dump(&o));
    assert!(
        a.iter().any(|(_, l)| l.contains("kind=CollectiveMismatch") && l.contains("sent a message of barrier while this rank waits")),
        "{}",
        dump(&o)
    );
    every_rank_names_the_disagreement(4, "reduce-roots", &["ranks 0, 2 called reduce (root 0", "ranks 1, 3 called reduce (root 1"]);
    every_rank_names_the_disagreement(
        4,
        "coll-vs-barrier",
        &["rank 0 called barrier", "ranks 1, 2, 3 called allreduce (1 elements of 8 bytes"],
    );
}

#[test]
fn item11_a_truncated_irecv_completed_by_its_scope_is_an_error() {
    run_ok(2, "irecv-truncate");
}

#[test]
fn item12_allgatherv_takes_a_zero_block_at_a_shared_displacement() {
    run_ok(2, "allgatherv-zero");
    run_ok(4, "allgatherv-zero");
}

#[test]
fn item12_v_collectives_match_a_reference_for_random_counts() {
    for np in [3u32, 4] {
        let o = run(np, "vprop", &[]);
        assert_eq!(o.code, 0, "{}", dump(&o));
        assert_eq!(o.lines.iter().filter(|(_, _, l)| l == "VPROP rounds=200").count(), np as usize, "{}", dump(&o));
    }
}

#[test]
fn item13_dup_of_a_graph_communicator_keeps_its_topology() {
    run_ok(3, "graph-dup");
}

#[test]
fn the_checking_mode_must_be_set_alike_on_every_rank() {
    let mut l = Launch::new(2, env!("CARGO_BIN_EXE_fmx-itest-misuse"));
    l.args = vec!["graph-dup".into()];
    l.capture = true;
    l.timeout = Some(Duration::from_secs(60));
    // Rank 1 alone runs with checking: a wrapper that sets it for one rank only.
    l.program = "sh".into();
    l.args = vec![
        "-c".into(),
        format!("[ \"$FMX_RANK\" = 1 ] && export FMX_CHECK=collectives; exec {} graph-dup", env!("CARGO_BIN_EXE_fmx-itest-misuse")).into(),
    ];
    let o = l.run().expect("launch");
    assert_ne!(o.code, 0);
    let errs: Vec<_> = o.lines.iter().filter(|(_, e, l)| *e && l.contains("FAIL init")).collect();
    assert_eq!(errs.len(), 2, "{}", dump(&o));
    assert!(errs.iter().all(|(_, _, l)| l.contains("rank 0 runs without checking and rank 1 with")), "{}", dump(&o));
}
