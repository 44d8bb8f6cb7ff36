//! Two endpoints of a 2-rank job in one process, on a real RDMA device.
//! They need one: on hosts without it they are ignored (never passed), and
//! `hw-tests/rxe-vm/run` runs them with `--include-ignored` in the Soft-RoCE
//! VM (rank 0 on rxe0, rank 1 on rxe1: traffic crosses the veth pair).

use std::time::{Duration, Instant};

use fmx_transport::rdma::EagerConfig;
use fmx_transport::settings::ConnectMode;
use fmx_transport::{Endpoint, MsgHeader, MsgKind, OpStatus, PeerState, RemoteKey, SendOutcome, TransportError};
use fmx_verbs::{VerbsConfig, VerbsEndpoint, VerbsSetup};

const NEEDS: &str = "needs an RDMA device: run by hw-tests/rxe-vm/run";

/// Connected at creation (`FMX_CONNECT=eager`): the credit rule's exact outcomes.
fn cfg(rank: u32, pool: u32, srq: bool) -> VerbsConfig {
    let base = VerbsConfig::from_env(rank, 2).unwrap();
    let eager =
        EagerConfig { pool, newcomer: 1, threshold: Some(1), slot_bytes: 256, connect: Some(ConnectMode::Eager), ..base.eager.clone() };
    VerbsConfig { eager, srq, ..base }
}

/// Connected on demand (the default).
fn lazy_cfg(rank: u32, srq: bool) -> VerbsConfig {
    let c = cfg(rank, 16, srq);
    VerbsConfig { eager: EagerConfig { connect: Some(ConnectMode::Lazy), ..c.eager }, ..c }
}

fn pair_with(a: VerbsConfig, b: VerbsConfig) -> (VerbsEndpoint, VerbsEndpoint) {
    let a = VerbsSetup::create(a).unwrap();
    let b = VerbsSetup::create(b).unwrap();
    let addrs = vec![a.address(), b.address()];
    (a.connect(&addrs).unwrap(), b.connect(&addrs).unwrap())
}

fn pair(pool: u32, srq: bool) -> (VerbsEndpoint, VerbsEndpoint) {
    pair_with(cfg(0, pool, srq), cfg(1, pool, srq))
}

/// Polls `ep` until it has handed `n` messages (bounded: 10 s).
fn drain(ep: &mut VerbsEndpoint, n: usize) -> Vec<(u32, u64, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} messages arrived", got.len());
        ep.poll(usize::MAX, |p, h, d| got.push((p, h.match_bits, d.to_vec()))).unwrap();
    }
    got
}

/// Polls both until `f` holds (bounded: 60 s, for emulated devices).
fn until(a: &mut VerbsEndpoint, b: &mut VerbsEndpoint, mut f: impl FnMut(&mut VerbsEndpoint, &mut VerbsEndpoint) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f(a, b) {
        assert!(Instant::now() < deadline, "condition not reached within 60 s");
        a.poll(usize::MAX, |_, _, _| {}).unwrap();
        b.poll(usize::MAX, |_, _, _| {}).unwrap();
    }
}

fn eager(bits: u64, data: &[u8]) -> MsgHeader {
    MsgHeader::eager(bits, data.len(), 0)
}

fn credit_rule_with_one_slot(srq: bool) {
    let (mut a, mut b) = pair(1, srq);
    assert_eq!(a.uses_srq(), srq);
    let max = a.max_eager();
    assert_eq!(max, 256 - 32);
    assert_eq!(a.try_send(1, &eager(9, &[9]), &[9]).unwrap(), SendOutcome::NotAllowed, "rank 0 waits for rank 1's first message");
    assert_eq!(b.try_send(0, &eager(0, &[0; 3]), &[0; 3]).unwrap(), SendOutcome::Sent);
    assert_eq!(b.try_send(0, &eager(1, &[1]), &[1]).unwrap(), SendOutcome::Backpressure, "one slot: never a second write");
    assert!(matches!(b.try_send(0, &eager(9, &vec![0; max + 1]), &vec![0; max + 1]), Err(TransportError::EagerTooLarge { .. })));
    assert_eq!(drain(&mut a, 1), vec![(1, 0, vec![0; 3])]);
    // Rank 0's release went back by RDMA WRITE into rank 1's mailbox.
    until(&mut a, &mut b, |_, b| b.credit(0) == SendOutcome::Sent);
    assert_eq!(a.try_send(1, &eager(5, &[5; 7]), &[5; 7]).unwrap(), SendOutcome::Sent, "the first message brought c0");
    assert_eq!(drain(&mut b, 1), vec![(0, 5, vec![5; 7])]);
    a.reallocate_credits().unwrap();
    b.reallocate_credits().unwrap();
    // 1000 messages through one slot each way, in order, payloads of every size class.
    let sizes = [0usize, 1, 8, 96, 150, max];
    let (mut sent, mut got) = (0u64, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < 1000 {
        assert!(Instant::now() < deadline, "1000 messages through one slot took over 60 s ({} arrived)", got.len());
        if sent < 1000 {
            let len = sizes[sent as usize % sizes.len()];
            let data: Vec<u8> = (0..len).map(|i| (i as u64 + sent) as u8).collect();
            if a.try_send(1, &eager(sent, &data), &data).unwrap() == SendOutcome::Sent {
                sent += 1;
            }
        }
        b.poll(usize::MAX, |p, h, d| got.push((p, h.match_bits, d.to_vec()))).unwrap();
        a.poll(usize::MAX, |_, _, _| {}).unwrap();
    }
    for (i, (p, bits, d)) in got.iter().enumerate() {
        assert_eq!((*p, *bits), (0, i as u64), "in order");
        let len = sizes[i % sizes.len()];
        assert_eq!(d.len(), len);
        assert!(d.iter().enumerate().all(|(j, &x)| x == (j as u64 + i as u64) as u8), "message {i} content");
    }
    // Messages to ourselves never touch the device.
    assert_eq!(b.try_send(1, &eager(7, &[1, 2]), &[1, 2]).unwrap(), SendOutcome::Sent);
    assert_eq!(drain(&mut b, 1), vec![(1, 7, vec![1, 2])]);
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn one_slot_credits_on_a_shared_receive_queue() {
    let _ = NEEDS;
    credit_rule_with_one_slot(true);
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn one_slot_credits_on_per_qp_receive_queues() {
    credit_rule_with_one_slot(false);
}

fn complete(a: &mut VerbsEndpoint, b: &mut VerbsEndpoint, st: OpStatus) {
    let OpStatus::Pending(id) = st else { return };
    let mut done = None;
    until(a, b, |a, _| {
        a.poll_ops(|i, r| {
            if i == id {
                done = Some(r.map_err(|e| e.to_string()));
            }
        })
        .unwrap();
        done.is_some()
    });
    done.unwrap().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn rdma_read_and_write_move_user_buffers_bounced_registered_or_owned() {
    let (mut a, mut b) = pair(8, true);
    // 1 KiB and 64 KiB go through bounce buffers, 1 MiB and 20 MiB (pieces
    // above the device's message size on rxe) are registered per operation.
    for len in [1usize << 10, 64 << 10, 1 << 20, 20 << 20] {
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let key = unsafe { b.expose(&src) }.unwrap();
        let mut dst = vec![0u8; len];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let st = unsafe { a.read(1, &key, &mut dst) }.unwrap();
        complete(&mut a, &mut b, st);
        b.revoke(&key);
        assert!(dst == src, "RDMA READ of {len} bytes");
        let mut target = vec![0u8; len];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let tkey = unsafe { b.expose_mut(&mut target) }.unwrap();
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let st = unsafe { a.write(1, &src, &tkey) }.unwrap();
        complete(&mut a, &mut b, st);
        b.revoke(&tkey);
        assert!(target == src, "RDMA WRITE of {len} bytes");
    }
    let s = a.registration_stats();
    assert_eq!((s.bounced, s.per_operation), (4, 4), "{s:?}");
    // One buffer exposed by several sends at once (a window): each key stays
    // valid until its own revoke.
    let src: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8).collect();
    // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
    let keys: Vec<RemoteKey> = (0..4).map(|_| unsafe { b.expose(&src) }.unwrap()).collect();
    for (i, key) in keys.iter().enumerate().rev() {
        let mut dst = vec![0u8; src.len()];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let st = unsafe { a.read(1, key, &mut dst) }.unwrap();
        complete(&mut a, &mut b, st);
        assert!(dst == src, "read through key {i} of 4 on one buffer");
        b.revoke(key);
    }
    // An owned buffer: registered once, then every operation finds it.
    let owned = vec![3u8; 300_000];
    b.register_owned(&owned).unwrap();
    let before = b.registration_stats();
    for _ in 0..10 {
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let key = unsafe { b.expose(&owned[1000..200_000]) }.unwrap();
        let mut dst = vec![0u8; 199_000];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let st = unsafe { a.read(1, &key, &mut dst) }.unwrap();
        complete(&mut a, &mut b, st);
        b.revoke(&key);
        assert!(dst.iter().all(|&x| x == 3));
    }
    let after = b.registration_stats();
    assert_eq!(after.registrations, before.registrations, "no registration per operation");
    assert_eq!(after.owned_hits - before.owned_hits, 10);
    b.deregister_owned(&owned);
    // Out of bounds is refused before anything is posted.
    // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
    let key = unsafe { b.expose(&owned[..10]) }.unwrap();
    let mut big = vec![0u8; 11];
    // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
    assert!(matches!(unsafe { a.read(1, &key, &mut big) }, Err(TransportError::RemoteBounds { len: 11, region: 10, .. })));
    // A forged key is the device's remote access error, naming the peer.
    let forged = RemoteKey { key: key.key ^ 0x5555, ..key };
    let mut small = vec![0u8; 10];
    // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
    let st = unsafe { a.read(1, &forged, &mut small) }.unwrap();
    let OpStatus::Pending(id) = st else { panic!("a forged read cannot complete inline") };
    let mut err = None;
    until(&mut a, &mut b, |a, _| {
        a.poll_ops(|i, r| {
            if i == id {
                err = Some(r.unwrap_err().to_string());
            }
        })
        .unwrap();
        err.is_some()
    });
    let err = err.unwrap();
    assert!(err.contains("peer 1") && err.contains("remote access"), "{err}");
    assert_eq!(a.peer_state(1), PeerState::Dead, "the QP is in error after a failed completion");
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn a_vanished_peer_is_an_error_naming_it_within_bounded_time() {
    let fast = |r| VerbsConfig { timeout: 10, retry_cnt: 2, ..cfg(r, 4, true) };
    let (a, mut b) = pair_with(fast(0), fast(1));
    b.reallocate_credits().unwrap();
    drop(a); // its queue pair is destroyed: nothing answers rank 1 any more
    let start = Instant::now();
    let h = MsgHeader::control(MsgKind::Fin, 0, 0, 0, 0);
    let err = loop {
        assert!(start.elapsed() < Duration::from_secs(30), "no error after 30 s");
        // Rank 1 may always send to rank 0 (a smaller ID): only the device can stop it.
        match b.try_send(0, &h, &[]) {
            Err(e) => break e.to_string(),
            Ok(_) => {
                let _ = b.poll(usize::MAX, |_, _, _| {});
            }
        }
    };
    assert!(err.contains("peer 0"), "{err}");
    assert_eq!(b.peer_state(0), PeerState::Dead);
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn finalize_is_seen_by_the_peer() {
    let (mut a, mut b) = pair(4, true);
    assert_eq!(a.peer_state(1), PeerState::Alive);
    b.finalize().unwrap();
    until(&mut a, &mut b, |a, _| a.peer_state(1) == PeerState::Finalized);
}

/// On demand, nothing is connected or granted at creation; the first send
/// makes the queue pairs (the UD handshake), is told "not now" until they
/// are, then goes; each side then holds one connection and one grant.
fn first_send_connects(srq: bool) {
    let (mut a, mut b) = pair_with(lazy_cfg(0, srq), lazy_cfg(1, srq));
    assert!(a.connections().is_empty() && b.connections().is_empty());
    assert_eq!((a.receive_memory().eager_pool, b.receive_memory().eager_pool), (0, 0), "no grant before a connection");
    let data = [3u8; 5];
    assert_eq!(b.try_send(0, &eager(3, &data), &data).unwrap(), SendOutcome::Backpressure, "connecting");
    until(&mut a, &mut b, |_, b| b.try_send(0, &eager(3, &data), &data).unwrap() == SendOutcome::Sent);
    assert_eq!(drain(&mut a, 1), vec![(1, 3, data.to_vec())]);
    // And back, over the same queue pairs (rank 0 may answer: rank 1 spoke).
    until(&mut a, &mut b, |a, _| a.try_send(1, &eager(4, &data), &data).unwrap() == SendOutcome::Sent);
    assert_eq!(drain(&mut b, 1), vec![(0, 4, data.to_vec())]);
    for (ep, peer) in [(&a, 1), (&b, 0)] {
        let conns = ep.connections();
        assert_eq!(conns.iter().map(|c| c.peer).collect::<Vec<_>>(), vec![peer]);
        let m = ep.receive_memory();
        assert!(m.eager_pool > 0 && m.eager_pool <= m.per_peer, "one connection's grant: {m:?}");
    }
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn on_demand_the_first_send_connects_on_a_shared_receive_queue() {
    first_send_connects(true);
}

#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn on_demand_the_first_send_connects_on_per_qp_receive_queues() {
    first_send_connects(false);
}

/// Eager messages that the header would push into one more packet go with
/// their header in immediate data: 600 each way at once, sizes on both
/// sides of the packet boundaries of every MTU, 4 tags, then 11 cycling
/// through the 8-entry dictionary (replacements), then 4 again; 4 slots
/// (credits return on compacted messages too): every message arrives
/// whole, in order, with its tag.
#[test]
#[ignore = "needs an RDMA device: run by hw-tests/rxe-vm/run"]
fn headers_ride_in_immediate_data_when_they_would_cost_a_packet() {
    let big = |r| {
        let c = cfg(r, 4, true);
        VerbsConfig { eager: EagerConfig { slot_bytes: 8192 + 32, ..c.eager }, ..c }
    };
    let (mut a, mut b) = pair_with(big(0), big(1));
    a.reallocate_credits().unwrap();
    b.reallocate_credits().unwrap();
    let sizes = [8usize, 1000, 1014, 1024, 2048, 3000, 4090, 4096, 0, 8192];
    let tag = |i: u64| if (200..400).contains(&i) { i % 11 } else { i % 4 };
    let content = |i: u64, len: usize| (0..len).map(|j| (j as u64 * 31 + i) as u8).collect::<Vec<u8>>();
    const N: u64 = 600;
    let (mut sent, mut got) = ([0u64; 2], [Vec::new(), Vec::new()]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while got[0].len() < N as usize || got[1].len() < N as usize {
        assert!(Instant::now() < deadline, "{} and {} of {N} arrived in 120 s", got[0].len(), got[1].len());
        for (side, ep) in [&mut a, &mut b].into_iter().enumerate() {
            let i = sent[side];
            if i < N {
                let data = content(i, sizes[i as usize % sizes.len()]);
                if ep.try_send(1 - side as u32, &eager(tag(i), &data), &data).unwrap() == SendOutcome::Sent {
                    sent[side] += 1;
                }
            }
            ep.poll(usize::MAX, |_, h, d| got[side].push((h.match_bits, d.to_vec()))).unwrap();
        }
    }
    for side in &got {
        for (i, (bits, d)) in side.iter().enumerate() {
            let i = i as u64;
            assert_eq!(*bits, tag(i), "message {i}: its own tag");
            assert!(*d == content(i, sizes[i as usize % sizes.len()]), "message {i} content ({} bytes)", d.len());
        }
    }
    // 7 sizes in 10 save a packet at MTU 1024 (this veth), 3 at 4096; the
    // dictionaries' rule gives 335 and 154 compacted of 600 (the rest teach
    // or are not worth it).
    for ep in [&a, &b] {
        let n = ep.headers_in_immediate();
        assert!(n >= 150, "{n} of {N} messages carried their header in immediate data");
    }
}
