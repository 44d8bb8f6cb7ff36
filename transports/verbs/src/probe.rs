//! The capability probe: what a device really does, found by trying each
//! operation on a pair of RC queue pairs connected to each other, plus the
//! cost of registering memory against copying it (which sets the bounce
//! threshold). `fmx-verbs-probe` prints the result as a Markdown table.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::device::choose;
use crate::endpoint::connect_with_retry;
use crate::sys::{can_create_qp, ffi, Access, Cq, Mr, Pd, PeerPath, Qp, QpTiming, SendOp, SendWr, Srq};

/// One row: capability, what the device answered, what fmx uses of it.
pub struct Row {
    /// The capability.
    pub what: &'static str,
    /// The measured answer.
    pub result: String,
    /// What fmx does with it.
    pub fmx: &'static str,
}

fn wait(cq: &Cq, what: &str) -> Result<ffi::ibv_wc, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut wc = [std::mem::MaybeUninit::uninit(); 1];
    loop {
        match cq.poll(&mut wc).map(|done| done.first().copied()) {
            Ok(Some(wc)) => {
                return match wc.error() {
                    None => Ok(wc),
                    Some((status, _)) => Err(format!("{what}: completion status {status}")),
                }
            }
            Ok(_) if Instant::now() < deadline => std::thread::yield_now(),
            Ok(_) => return Err(format!("{what}: no completion within 5 s")),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

fn yes_no(r: Result<(), String>) -> String {
    match r {
        Ok(()) => "yes (ran)".into(),
        Err(e) => format!("no ({e})"),
    }
}

fn median_us(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..21)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Probes the device rank 0 would use (`FMX_VERBS_DEVICE` and friends apply).
pub fn run() -> Result<(String, Vec<Row>), String> {
    let c = choose(0).map_err(|e| e.to_string())?;
    let a = c.attr;
    let pd = Pd::alloc(&c.ctx).map_err(|e| e.to_string())?;
    let cq = Cq::create(&c.ctx, 64).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let mut row = |what, result: String, fmx| rows.push(Row { what, result, fmx });

    // The largest inline size the device accepts, asked from large to small.
    let mut inline = 0;
    for want in [1024u32, 512, 256, 220, 128, 64, 32, 0] {
        if let Ok(q) = Qp::create_rc(&pd, &cq, &cq, None, 16, 16, want) {
            inline = q.max_inline;
            break;
        }
    }
    let mk = || Qp::create_rc(&pd, &cq, &cq, None, 16, 16, inline).map_err(|e| e.to_string());
    let (qa, qb) = (mk()?, mk()?);
    let timing = QpTiming {
        port: c.port,
        gid_index: c.gid_index,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        rd_atomic: a.max_qp_rd_atom.clamp(1, 16) as u8,
    };
    let path = |q: &Qp| PeerPath { qpn: q.qpn(), psn: 0, lid: c.port_attr.lid, gid: c.gid, global: c.global, mtu: c.port_attr.active_mtu };
    connect_with_retry(|| qa.connect(timing, 0, &path(&qb))).map_err(|e| e.to_string())?;
    connect_with_retry(|| qb.connect(timing, 0, &path(&qa))).map_err(|e| e.to_string())?;

    let mut mem = MmapMut::map_anon(1 << 16).map_err(|e| e.to_string())?;
    let base = mem.as_mut_ptr();
    let mr = Mr::register(&pd, base, mem.len(), Access::Atomic).map_err(|e| e.to_string())?;
    let at = |off: usize| mr.addr + off as u64;
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let post = |q: &Qp, op, local, inline| {
        // SAFETY: every local range lies in `mem`, registered as `mr`, which
        // outlives the probe's queue pairs' use of it (we wait for each completion).
        unsafe { q.post_send(&SendWr { wr_id: 1, opcode: op, local, signaled: true, inline }) }.map_err(|e| e.to_string())
    };
    mem[..64].fill(0xab);
    let send = (|| {
        // SAFETY: the receive lands in `mem[4096..8192]`, registered above.
        unsafe { qb.post_recv(2, at(4096), 4096, lkey) }.map_err(|e| e.to_string())?;
        post(&qa, SendOp::Send, (at(0), 64, lkey), false)?;
        wait(&cq, "send")?;
        wait(&cq, "receive")?;
        if mem[4096..4160].iter().all(|&b| b == 0xab) {
            Ok(())
        } else {
            Err("received bytes differ".into())
        }
    })();
    row("RC send/receive", yes_no(send), "eager messages into pre-posted slots");
    mem[..64].fill(0x5a);
    let write = (|| {
        post(&qa, SendOp::Write { remote_addr: at(8192), rkey }, (at(0), 64, lkey), false)?;
        wait(&cq, "write")?;
        if mem[8192..8256].iter().all(|&b| b == 0x5a) {
            Ok(())
        } else {
            Err("written bytes differ".into())
        }
    })();
    row("RC RDMA WRITE", yes_no(write), "credit returns (8-byte mailbox words), rendezvous halves");
    mem[12288..12352].fill(0x3c);
    let read = (|| {
        post(&qa, SendOp::Read { remote_addr: at(12288), rkey }, (at(16384), 64, lkey), false)?;
        wait(&cq, "read")?;
        if mem[16384..16448].iter().all(|&b| b == 0x3c) {
            Ok(())
        } else {
            Err("read bytes differ".into())
        }
    })();
    row("RC RDMA READ", yes_no(read), "rendezvous: the receiver reads the sender's buffer");
    mem[20480..20488].copy_from_slice(&40u64.to_le_bytes());
    let atomic = (|| {
        post(&qa, SendOp::FetchAdd { remote_addr: at(20480), rkey, add: 2 }, (at(24576), 8, lkey), false)?;
        wait(&cq, "fetch-and-add")?;
        let old = u64::from_le_bytes(mem[24576..24584].try_into().expect("8 bytes"));
        let new = u64::from_le_bytes(mem[20480..20488].try_into().expect("8 bytes"));
        if (old, new) == (40, 42) {
            Ok(())
        } else {
            Err(format!("fetched {old}, left {new}"))
        }
    })();
    row("RC atomics (fetch-and-add)", format!("{}; atomic_cap={}", yes_no(atomic), a.atomic_cap), "not used");
    let inl = (|| {
        if inline < 32 {
            return Err(format!("max_inline_data={inline}"));
        }
        mem[..inline as usize].fill(0x77);
        // SAFETY: as above.
        unsafe { qb.post_recv(3, at(28672), 4096, lkey) }.map_err(|e| e.to_string())?;
        post(&qa, SendOp::Send, (at(0), inline, 0), true)?;
        wait(&cq, "inline send")?;
        wait(&cq, "receive")?;
        if mem[28672..28672 + inline as usize].iter().all(|&b| b == 0x77) {
            Ok(())
        } else {
            Err("inline bytes differ".into())
        }
    })();
    row("Inline data", format!("max_inline_data={inline}: {}", yes_no(inl)), "header + payload up to this size sent inline");
    let srq = Srq::create(&pd, 16).map(drop).map_err(|e| e.to_string());
    row(
        "Shared receive queue",
        format!("{}; max_srq={} max_srq_wr={}", yes_no(srq), a.max_srq, a.max_srq_wr),
        "one pool of eager slots for all peers",
    );
    row(
        "Path MTU",
        format!("active {} B, max {} B", 128u32 << c.port_attr.active_mtu, 128u32 << c.port_attr.max_mtu),
        "the smaller of both sides' active MTU",
    );
    row("Max message size", format!("{} B", c.port_attr.max_msg_sz), "larger RDMA operations are posted in pieces");
    let ud = can_create_qp(&pd, &cq, ffi::ibv_qp_type::IBV_QPT_UD);
    row("UD queue pairs", if ud { "yes (created; no traffic sent)".into() } else { "no (ibv_create_qp failed)".into() }, "not used");
    let xrc = a.device_cap_flags & ffi::IBV_DEVICE_XRC != 0;
    row("XRC", format!("{} (device_cap_flags)", if xrc { "yes" } else { "no" }), "not used");
    row(
        "Extended QP (ibv_wr_*)",
        "see perftest --use_new_send below (ibverbs-sys 0.3 does not bind the static inline ibv_create_qp_ex)".into(),
        "not used: classic ibv_post_send",
    );
    row(
        "Limits",
        format!(
            "max_qp={} max_qp_wr={} max_cqe={} max_mr_size={} max_qp_rd_atom={}",
            a.max_qp, a.max_qp_wr, a.max_cqe, a.max_mr_size, a.max_qp_rd_atom
        ),
        "send queues of 128, completion batches of 16",
    );
    // Registration against copying: why plain slices up to 64 KiB are bounced.
    let mut cost = String::new();
    for len in [4usize << 10, 64 << 10, 1 << 20] {
        let src = vec![1u8; len];
        let mut dst = vec![0u8; len];
        let reg = median_us(|| drop(Mr::register(&pd, src.as_ptr(), len, Access::LocalRead)));
        let copy = median_us(|| dst.copy_from_slice(std::hint::black_box(&src)));
        let _ = write!(cost, "{} KiB: register+deregister {reg:.1} us, copy {copy:.1} us; ", len >> 10);
    }
    row("Registration vs copy", cost.trim_end_matches("; ").to_owned(), "bounce below FMX_VERBS_BOUNCE_BYTES (64 KiB), register above");
    drop((qa, qb));
    drop(mr);
    let title = format!(
        "device {} port {} ({}, GID index {}), firmware {:?}",
        c.device(),
        c.port(),
        c.link_layer(),
        c.gid_index(),
        String::from_utf8_lossy(&a.fw_ver.iter().map(|&b| b as u8).take_while(|&b| b != 0).collect::<Vec<_>>())
    );
    let _ = Arc::strong_count(&pd);
    Ok((title, rows))
}
