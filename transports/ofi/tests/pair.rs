//! Two endpoints in one process (one thread each) over libfabric providers
//! this host has: eager messages with credits, one-sided reads and writes,
//! and the errors a user sees for a wrong provider or mismatched ranks.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use fmx_ofi::{OfiConfig, OfiEndpoint, OfiSetup};
use fmx_transport::{Endpoint, MsgHeader, OpStatus, SendOutcome, TransportError};

fn config(rank: u32, provider: &str) -> OfiConfig {
    let mut c = OfiConfig::from_env(rank, 2).expect("defaults");
    c.rma = !provider.ends_with("+tagged");
    let provider = provider.trim_end_matches("+tagged");
    c.provider = Some(provider.into());
    // tcp over loopback only: never the machine's outside interface.
    c.domain = (provider == "tcp;ofi_rxm").then(|| "lo".into());
    c
}

/// Runs `body` on two connected endpoints, one per thread.
fn pair<F>(provider: &'static str, body: F)
where
    F: Fn(u32, &mut OfiEndpoint) + Send + Sync + Copy + 'static,
{
    let (tx0, rx1) = mpsc::channel::<Vec<u8>>();
    let (tx1, rx0) = mpsc::channel::<Vec<u8>>();
    let run = move |rank: u32, tx: mpsc::Sender<Vec<u8>>, rx: mpsc::Receiver<Vec<u8>>| {
        move || {
            let setup = OfiSetup::create(config(rank, provider)).expect("create");
            let mine = setup.address().expect("address");
            tx.send(mine.clone()).unwrap();
            let theirs = rx.recv().unwrap();
            let addrs = if rank == 0 { vec![mine, theirs] } else { vec![theirs, mine] };
            let mut ep = setup.connect(&addrs).expect("connect");
            assert_eq!(ep.uses_rma(), !provider.ends_with("+tagged"));
            ep.reallocate_credits().unwrap();
            body(rank, &mut ep);
            ep.finalize().unwrap();
        }
    };
    let a = std::thread::spawn(run(0, tx0, rx0));
    let b = std::thread::spawn(run(1, tx1, rx1));
    a.join().expect("rank 0");
    b.join().expect("rank 1");
}

fn recv_one(ep: &mut OfiEndpoint) -> (MsgHeader, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut got = None;
        ep.poll(1, |_, h, d| got = Some((*h, d.to_vec()))).unwrap();
        if let Some(g) = got {
            return g;
        }
        assert!(Instant::now() < deadline, "no message within 30 s");
        std::thread::yield_now();
    }
}

fn send(ep: &mut OfiEndpoint, peer: u32, h: &MsgHeader, payload: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match ep.try_send(peer, h, payload).unwrap() {
            SendOutcome::Sent => return,
            _ => {
                ep.poll(0, |_, _, _| {}).unwrap();
                assert!(Instant::now() < deadline, "no credit within 30 s");
                std::thread::yield_now();
            }
        }
    }
}

fn wait_op(ep: &mut OfiEndpoint, s: OpStatus) -> Result<(), TransportError> {
    let OpStatus::Pending(id) = s else { return Ok(()) };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut r = None;
        ep.poll_ops(|done, res| {
            if done == id {
                r = Some(res);
            }
        })
        .unwrap();
        if let Some(r) = r {
            return r;
        }
        ep.poll(0, |_, _, _| {}).unwrap();
        assert!(Instant::now() < deadline, "operation {id} not done within 30 s");
    }
}

/// 500 eager messages, far more than the pool's slots, in order with content,
/// then a one-sided read and write of 3 MiB (pieces) and an out-of-bounds read.
fn traffic(rank: u32, ep: &mut OfiEndpoint) {
    let peer = 1 - rank;
    let n = 500u64;
    let max = ep.max_eager();
    // FM's send rule: the larger ID speaks first, opening the way back.
    if rank == 1 {
        send(ep, peer, &MsgHeader::eager(u64::MAX, 0, 0), &[]);
    } else {
        assert_eq!(recv_one(ep).0.match_bits, u64::MAX);
    }
    if rank == 0 {
        for i in 0..n {
            let len = (i as usize * 37) % max;
            let payload: Vec<u8> = (0..len).map(|j| (i as usize + j) as u8).collect();
            send(ep, peer, &MsgHeader::eager(i, len, i), &payload);
        }
    } else {
        for i in 0..n {
            let (h, d) = recv_one(ep);
            assert_eq!(h.match_bits, i, "messages from one sender arrive in order");
            assert_eq!(d.len(), (i as usize * 37) % max);
            assert!(d.iter().enumerate().all(|(j, &b)| b == (i as usize + j) as u8), "message {i} content");
        }
    }
    // Rank 1 exposes one buffer for reading and one for writing; rank 0 reads
    // the first and writes a pattern into the second half of the second.
    let len = 3 << 20;
    if rank == 1 {
        let src: Vec<u8> = (0..len).map(|j| (j % 251) as u8).collect();
        let mut dst = vec![7u8; len];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let rkey = unsafe { ep.expose(&src) }.unwrap();
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let wkey = unsafe { ep.expose_mut(&mut dst) }.unwrap();
        let mut keys = rkey.encode().to_vec();
        keys.extend_from_slice(&wkey.encode());
        send(ep, peer, &MsgHeader::eager(1000, keys.len(), 0), &keys);
        let (h, _) = recv_one(ep); // rank 0 is done
        assert_eq!(h.match_bits, 1001);
        ep.revoke(&rkey);
        ep.revoke(&wkey);
        assert!(dst[..len / 2].iter().all(|&b| b == 7), "first half untouched");
        assert!(dst[len / 2..].iter().all(|&b| b == 0xa5), "second half written by the peer");
    } else {
        let (h, d) = recv_one(ep);
        assert_eq!(h.match_bits, 1000);
        let rkey = fmx_transport::RemoteKey::decode(&d).unwrap();
        let wkey = fmx_transport::RemoteKey::decode(&d[24..]).unwrap();
        let mut got = vec![0u8; len];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let s = unsafe { ep.read(peer, &rkey, &mut got) }.unwrap();
        wait_op(ep, s).unwrap();
        assert!(got.iter().enumerate().all(|(j, &b)| b == (j % 251) as u8), "read content");
        let pattern = vec![0xa5u8; len / 2];
        let half = wkey.slice(peer, (len / 2) as u64, (len / 2) as u64).unwrap();
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let s = unsafe { ep.write(peer, &pattern, &half) }.unwrap();
        wait_op(ep, s).unwrap();
        let mut one_more = vec![0u8; 1];
        assert!(matches!(
            // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
            rkey.slice(peer, len as u64, 1).and_then(|k| unsafe { ep.read(peer, &k, &mut one_more) }),
            Err(TransportError::RemoteBounds { peer: 1, .. })
        ));
        send(ep, peer, &MsgHeader::eager(1001, 0, 0), &[]);
    }
}

// Not over shm: libfabric 1.17's shm provider crashes (a spin lock in its
// address map) with two endpoints of one process talking to each other; the
// multi-process suite runs over shm instead (scripts/ofi-test).

#[test]
fn eager_credits_and_rma_over_tcp_on_loopback() {
    pair("tcp;ofi_rxm", traffic);
}

/// The same traffic with one-sided operations and credit returns carried by
/// tagged messages, as on a provider without FI_RMA (`FMX_OFI_RMA=0`).
#[test]
fn eager_credits_and_emulated_reads_and_writes_over_tcp() {
    pair("tcp;ofi_rxm+tagged", traffic);
}

#[test]
fn an_unknown_provider_is_named_in_the_error() {
    let e = OfiSetup::create(config(0, "no-such-provider")).err().expect("no such provider").to_string();
    assert!(e.contains("\"no-such-provider\"") && e.contains("fi_info"), "{e}");
}

#[test]
fn ranks_on_different_providers_are_refused_at_connect() {
    // Two endpoints of one process, never connected: fine even on shm.
    let a = OfiSetup::create(config(0, "shm")).unwrap();
    let b = OfiSetup::create(config(1, "tcp;ofi_rxm")).unwrap();
    let addrs = vec![a.address().unwrap(), b.address().unwrap()];
    let e = a.connect(&addrs).err().expect("mismatch").to_string();
    assert!(e.contains("rank 1 chose libfabric provider \"tcp;ofi_rxm\"") && e.contains("rank 0 chose \"shm\""), "{e}");
}

/// The shm files in /dev/shm whose names start with `prefix`.
fn shm_files(prefix: &str) -> Vec<String> {
    let d = std::fs::read_dir("/dev/shm").expect("/dev/shm");
    d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(prefix)).collect()
}

#[test]
fn shm_endpoints_are_named_after_the_job_and_a_killed_jobs_files_are_swept() {
    // libfabric's default shm name is the pid: a file a killed process left
    // makes fi_enable fail with EBUSY for the next process given that pid.
    let job = format!("pairtest{}", std::process::id());
    let prefix = format!("fmxofi-{job}-");
    let named = |rank| OfiConfig { job: Some(job.clone()), ..config(rank, "shm") };
    let a = OfiSetup::create(named(0)).unwrap();
    let b = OfiSetup::create(named(0)).unwrap();
    let files = shm_files(&prefix);
    assert_eq!(files.len(), 2, "the same job and rank opened twice gets two names: {files:?}");
    assert!(files.iter().all(|f| f.starts_with(&format!("{prefix}0."))), "{files:?}");
    drop(a);
    assert_eq!(shm_files(&prefix).len(), 1, "closing an endpoint removes its file");
    // A process that is killed cannot close: its file stays until the launcher sweeps the job.
    std::mem::forget(b);
    assert_eq!(fmx_ofi::cleanup_job(&job), 1);
    assert!(shm_files(&prefix).is_empty());
    // Other providers ignore the job (tcp names by socket address).
    let t = OfiSetup::create(OfiConfig { job: Some(job.clone()), ..config(1, "tcp;ofi_rxm") }).unwrap();
    assert!(shm_files(&prefix).is_empty());
    drop(t);
}
