//! Multi-process tests: each launches the rank program under the fmx launcher.

use std::time::Duration;

fn launch(np: u32, scenario: &str) -> (fmx::launcher::Outcome, Duration) {
    let mut l = fmx::launcher::Launch::new(np, env!("CARGO_BIN_EXE_fmx-itest-rank"));
    l.args = vec![scenario.into()];
    l.capture = true;
    l.timeout = Some(Duration::from_secs(180));
    let t = std::time::Instant::now();
    let o = l.run().expect("launch");
    (o, t.elapsed())
}

fn dump(o: &fmx::launcher::Outcome) -> String {
    o.lines.iter().map(|(r, e, l)| format!("[{r}{}] {l}\n", if *e { " err" } else { "" })).collect()
}

/// Runs `scenario` on `np` ranks and requires every rank to report OK.
fn run_ok(np: u32, scenario: &str) -> fmx::launcher::Outcome {
    let (o, _) = launch(np, scenario);
    assert_eq!(o.code, 0, "{scenario} on {np} ranks failed:\n{}", dump(&o));
    let oks = o.lines.iter().filter(|(_, e, l)| !e && *l == format!("OK {scenario}")).count();
    assert_eq!(oks, np as usize, "{scenario} on {np} ranks: {oks} ranks said OK:\n{}", dump(&o));
    assert_no_files(&o.job);
    o
}

fn assert_no_files(job: &str) {
    let prefix = format!("fmx-{job}-");
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&prefix)).collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "shared-memory files left behind: {left:?}");
}

#[test]
fn matching_order_wildcards_probe_and_test() {
    for np in [2, 3, 5] {
        run_ok(np, "p2p-order");
    }
}

#[test]
fn zero_byte_messages() {
    run_ok(2, "zero");
}

#[test]
fn truncation_is_an_error_naming_sender_and_sizes() {
    run_ok(2, "truncate");
}

#[test]
fn messages_of_1_byte_to_64_mib_arrive_intact() {
    run_ok(2, "sizes");
}

#[test]
fn collectives_match_a_sequential_reference() {
    for np in [1, 2, 3, 4, 5, 7, 8] {
        run_ok(np, "coll");
    }
}

#[test]
fn bad_input_gets_typed_errors() {
    run_ok(3, "bad-input");
}

#[test]
fn dup_and_split_isolate_tag_spaces() {
    for np in [2, 4, 5] {
        run_ok(np, "dup-split");
    }
}

#[test]
fn use_after_finalize_is_an_error() {
    run_ok(2, "finalize-use");
}

#[test]
fn oversubscribed_ring_makes_progress() {
    // 8 ranks on this machine's 2 cores: correctness under oversubscription.
    let o = run_ok(8, "ring");
    assert_eq!(o.lines.iter().filter(|(_, _, l)| l.starts_with("RING n=8")).count(), 8);
}

#[test]
fn a_dead_rank_is_named_by_the_others_within_10_s() {
    let (o, took) = launch(3, "early-exit");
    assert_eq!(o.code, 3, "the job's code is rank 1's:\n{}", dump(&o));
    assert_eq!(o.failed_rank, Some(1));
    assert!(took < Duration::from_secs(10), "took {took:?}");
    for r in [0u32, 2] {
        assert!(
            o.lines.iter().any(|(rank, _, l)| *rank == r && l.starts_with("PEER-GONE rank 1")),
            "rank {r} did not report rank 1 gone:\n{}",
            dump(&o)
        );
    }
    assert_no_files(&o.job);
}
