//! The clients against scripted servers: the exchanges real process managers
//! are tested with in core/itest (Hydra) and scripts/slurm-test (Slurm); here
//! the broken ones.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

use super::{Client, EnvHints, Version};

/// A server thread that answers each request line (PMI-1) with `answer(line)`;
/// `None` closes the connection.
fn v1_server(answer: impl Fn(&str) -> Option<String> + Send + 'static) -> UnixStream {
    let (ours, theirs) = UnixStream::pair().unwrap();
    thread::spawn(move || {
        let mut r = BufReader::new(theirs.try_clone().unwrap());
        let mut w = theirs;
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            match answer(line.trim_end()) {
                Some(reply) => w.write_all(reply.as_bytes()).unwrap(),
                None => return,
            }
            line.clear();
        }
    });
    ours
}

fn hints(rank: u32, size: u32) -> EnvHints {
    EnvHints { rank: Some(rank), size: Some(size), jobid: None, slurm: false, spawned: false }
}

fn hydra_like(size: u32, close_on: &'static str) -> impl Fn(&str) -> Option<String> {
    move |line| {
        let cmd = line.split(' ').next().unwrap_or("");
        if cmd == format!("cmd={close_on}") {
            return None;
        }
        Some(match cmd {
            "cmd=init" => "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n".to_string(),
            "cmd=get_maxes" => "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n".into(),
            "cmd=get_my_kvsname" => "cmd=my_kvsname kvsname=kvs_7_0 rc=0\n".into(),
            "cmd=get" => format!("cmd=get_result rc=0 msg=success value=(vector,(0,1,{size}))\n"),
            "cmd=barrier_in" => "cmd=barrier_out rc=0\n".into(),
            _ => "cmd=unknown rc=-1\n".into(),
        })
    }
}

fn connect(s: UnixStream, v: Version, h: &EnvHints) -> crate::Result<Client> {
    Client::connect(s, v, Duration::from_secs(5), h)
}

#[test]
fn pmi1_handshake_learns_job_and_nodes() {
    let c = connect(v1_server(hydra_like(3, "none")), Version::V1, &hints(1, 3)).unwrap();
    assert_eq!((c.rank, c.size, c.job.as_str(), c.nodes.as_slice()), (1, 3, "kvs_7_0", &[0, 0, 0][..]));
}

#[test]
fn a_closed_connection_names_the_request() {
    let e = connect(v1_server(hydra_like(2, "get_my_kvsname")), Version::V1, &hints(0, 2)).err().unwrap().to_string();
    assert!(e.contains("get_my_kvsname") && e.contains("closed the PMI connection"), "{e}");
}

#[test]
fn a_mapping_for_another_size_is_a_mismatch() {
    // The manager maps 8 ranks on 2 nodes of 4; PMI_SIZE says 5.
    let server = v1_server(|line| {
        if line.starts_with("cmd=get ") {
            Some("cmd=get_result rc=0 value=(vector,(0,2,4))\n".into())
        } else {
            hydra_like(5, "none")(line)
        }
    });
    let e = connect(server, Version::V1, &hints(0, 5)).err().unwrap().to_string();
    assert!(e.contains("mismatched sizes") && e.contains("5 ranks"), "{e}");
}

#[test]
fn pmi1_without_pmi_rank_is_a_clear_error() {
    let e = connect(v1_server(hydra_like(2, "none")), Version::V1, &EnvHints::default()).err().unwrap().to_string();
    assert!(e.contains("PMI_RANK is not set"), "{e}");
}

#[test]
fn a_silent_manager_times_out() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let e = Client::connect(ours, Version::V1, Duration::from_millis(200), &hints(0, 2)).err().unwrap().to_string();
    drop(theirs);
    assert!(e.contains("no answer to init") && e.contains("FMX_PMI_TIMEOUT"), "{e}");
}

/// Item 17 of issue 15: a server that answers one byte per 300 ms meets
/// the timeout for the whole reply (1 s), not per byte (the reply has 60 bytes).
#[test]
fn item17_a_trickling_manager_times_out_for_the_whole_reply() {
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let t = thread::spawn(move || {
        let mut line = String::new();
        BufReader::new(theirs.try_clone().unwrap()).read_line(&mut line).unwrap();
        for b in b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n" {
            if theirs.write_all(&[*b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(300));
        }
    });
    let started = std::time::Instant::now();
    let e = Client::connect(ours, Version::V1, Duration::from_secs(1), &hints(0, 2)).err().unwrap().to_string();
    let took = started.elapsed();
    assert!(e.contains("no answer to init") && e.contains("FMX_PMI_TIMEOUT"), "{e}");
    assert!(took < Duration::from_secs(3), "took {took:?} for a 1 s timeout");
    t.join().unwrap();
}

/// A PMI-2 server: the init line, then framed requests answered by `answer`.
fn v2_server(answer: impl Fn(&str) -> String + Send + 'static) -> UnixStream {
    let (ours, theirs) = UnixStream::pair().unwrap();
    thread::spawn(move || {
        let mut r = BufReader::new(theirs.try_clone().unwrap());
        let mut w = theirs;
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("cmd=init pmi_version=2"), "{line}");
        w.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n").unwrap();
        loop {
            let mut len = [0u8; 6];
            if r.read_exact(&mut len).is_err() {
                return;
            }
            let n: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
            let mut body = vec![0u8; n];
            r.read_exact(&mut body).unwrap();
            let reply = answer(std::str::from_utf8(&body).unwrap());
            w.write_all(format!("{:6}{reply}", reply.len()).as_bytes()).unwrap();
        }
    });
    ours
}

fn slurm_like(size: u32) -> impl Fn(&str) -> String {
    move |body| {
        let cmd = body.split(';').next().unwrap_or("");
        match cmd {
            "cmd=fullinit" => format!("cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=2;size={size};appnum=0;"),
            "cmd=job-getid" => "cmd=job-getid-response;rc=0;jobid=5.0;".into(),
            "cmd=info-getjobattr" => "cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,2,2));".into(),
            "cmd=kvs-put" => "cmd=kvs-put-response;rc=0;".into(),
            "cmd=kvs-fence" => "cmd=kvs-fence-response;rc=0;".into(),
            "cmd=kvs-get" => "cmd=kvs-get-response;rc=0;found=FALSE;".into(),
            _ => "cmd=error;rc=-1;errmsg=unknown;".into(),
        }
    }
}

#[test]
fn pmi2_fullinit_gives_rank_size_and_nodes() {
    let c = connect(v2_server(slurm_like(4)), Version::V2, &hints(2, 4)).unwrap();
    assert_eq!((c.rank, c.size, c.job.as_str(), c.nodes.as_slice()), (2, 4, "5.0", &[0, 0, 1, 1][..]));
}

#[test]
fn pmi2_size_disagreeing_with_pmi_size_is_a_mismatch() {
    let e = connect(v2_server(slurm_like(4)), Version::V2, &hints(2, 6)).err().unwrap().to_string();
    assert!(e.contains("mismatched sizes: PMI_SIZE=6") && e.contains("size=4"), "{e}");
}

#[test]
fn a_key_missing_after_the_fence_names_rank_and_key() {
    let mut c = connect(v2_server(slurm_like(4)), Version::V2, &hints(2, 4)).unwrap();
    let e = c.allgather(b"addr").unwrap_err().to_string();
    assert!(e.contains("key fmx-0-0-0 of rank 0 is missing"), "{e}");
}

#[test]
fn a_failed_request_reports_the_managers_message() {
    let server = v2_server(|body| {
        if body.starts_with("cmd=kvs-put") {
            "cmd=kvs-put-response;rc=1;errmsg=duplicate_key;".into()
        } else {
            slurm_like(4)(body)
        }
    });
    let mut c = connect(server, Version::V2, &hints(2, 4)).unwrap();
    let e = c.allgather(b"addr").unwrap_err().to_string();
    assert!(e.contains("kvs-put failed on the process manager: rc=1 (duplicate_key)"), "{e}");
}

#[test]
fn spawn_under_slurm_is_refused_with_the_reason() {
    let h = EnvHints { slurm: true, ..hints(2, 4) };
    let mut c = connect(v2_server(slurm_like(4)), Version::V2, &h).unwrap();
    let req = super::SpawnRequest { program: "/bin/true".into(), args: vec![], nprocs: 1, values: vec![] };
    let e = c.spawn(&req).unwrap_err().to_string();
    assert!(e.contains("not supported under Slurm's PMI-2") && e.contains("Hydra"), "{e}");
}

#[test]
fn spawn_arguments_pmi_cannot_carry_are_rejected() {
    let mut c = connect(v1_server(hydra_like(2, "none")), Version::V1, &hints(0, 2)).unwrap();
    let req = super::SpawnRequest { program: "/bin/true".into(), args: vec!["two words".into()], nprocs: 1, values: vec![] };
    let e = c.spawn(&req).unwrap_err().to_string();
    assert!(e.contains("\"two words\"") && e.contains("space"), "{e}");
}

/// Hydra answering `barrier_in` only once the slowest rank arrives (after `late`).
fn late_barrier(late: Duration) -> impl Fn(&str) -> Option<String> {
    move |line| match line {
        "cmd=barrier_in" => {
            thread::sleep(late);
            Some("cmd=barrier_out rc=0\n".into())
        }
        "cmd=finalize" => Some("cmd=finalize_ack rc=0\n".into()),
        _ => hydra_like(2, "none")(line),
    }
}

fn connect_with_timeout(s: UnixStream, timeout: Duration) -> Client {
    Client::connect(s, Version::V1, timeout, &hints(0, 2)).unwrap()
}

/// Ranks that finish minutes apart: the finalize barrier waits for the last
/// one past FMX_PMI_TIMEOUT (here 200 ms against a rank 1.5 s late), asking
/// its watch meanwhile; an ordinary request still times out.
#[test]
fn the_finalize_barrier_waits_for_a_late_rank_past_the_timeout() {
    let mut plain = connect_with_timeout(v1_server(late_barrier(Duration::from_millis(1500))), Duration::from_millis(200));
    let e = plain.finalize().err().unwrap().to_string();
    assert!(e.contains("no answer to barrier_in"), "{e}");

    let mut c = connect_with_timeout(v1_server(late_barrier(Duration::from_millis(1500))), Duration::from_millis(200));
    let asked = std::rc::Rc::new(std::cell::Cell::new(0));
    let seen = asked.clone();
    c.finalize_watching(Box::new(move || {
        seen.set(seen.get() + 1);
        None
    }))
    .unwrap();
    assert!(asked.get() >= 1, "the watch was never asked while the barrier waited");
}

/// A peer that dies while the others wait in the finalize barrier ends the
/// wait with the watch's error, not never (Slurm without --kill-on-bad-exit
/// keeps the step running).
#[test]
fn a_dead_peer_ends_the_finalize_barrier() {
    let mut c = connect_with_timeout(v1_server(late_barrier(Duration::from_secs(60))), Duration::from_millis(200));
    let mut calls = 0;
    let started = std::time::Instant::now();
    let e = c
        .finalize_watching(Box::new(move || {
            calls += 1;
            (calls == 2).then(|| crate::error::Error::PeerGone {
                rank: 1,
                world_rank: 1,
                during: "finalizing".into(),
                reason: "its process exited or was killed".into(),
                pending: false,
            })
        }))
        .err()
        .unwrap();
    assert!(matches!(e, crate::error::Error::PeerGone { world_rank: 1, .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(30), "the watch's error came after {:?}", started.elapsed());
}
