//! The verbs endpoint: one RC queue pair per peer, eager messages as SENDs
//! into receive slots pre-posted on a shared receive queue (credits = slots,
//! FM's send rule), credit returns as 8-byte RDMA WRITEs into the peer's
//! mailbox, and rendezvous as RDMA READ/WRITE between user buffers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fmx_transport::credit::{Class, CreditConfig, PeerCredits};
use fmx_transport::liveness::PeerLife;
use fmx_transport::peers::Peer;
use fmx_transport::pool::{HugePages, Lease, Pool, PoolConfig, RegistrationHook};
use fmx_transport::rdma::{
    anonymous,
    sealed::{Core, Sealed},
    setup_error, Access as MemAccess, EagerConfig, Local, Memory, Posted, RdmaDevice, RdmaState,
};
use fmx_transport::settings::env_number as env_num;
use fmx_transport::settings::ConnectMode;
use fmx_transport::{Arrival, MsgHeader, MsgKind, PeerId, SendOutcome, TransportError, HEADER_BYTES};
use memmap2::MmapMut;

use crate::address::Address;
use crate::channel::{self, Channel, UdPeer};
use crate::device::{choose, Chosen};
use crate::slots::RecvRegions;
use crate::sys::{ffi, Access, Cq, Mr, Pd, PeerPath, Qp, QpTiming, SendOp, SendWr, Srq};
use crate::wireup::Wireup;
use compact::{Imm, RecvDict, SendDict};
use on_demand::OnDemand;

mod compact;
mod on_demand;
use fmx_transport::liveness::host_identity;

pub use fmx_transport::rdma::{CTRL_SLOTS, DEFAULT_NEWCOMER_CREDITS, DEFAULT_POOL_SLOTS, DEFAULT_SLOT_BYTES};
/// Plain slices up to this size go through pre-registered bounce buffers
/// (a copy) instead of a registration per operation; see the README for the measurement.
pub const DEFAULT_BOUNCE_MAX: usize = fmx_transport::rdma::DEFAULT_BOUNCE_BYTES;
/// Send work requests per queue pair.
const SQ_DEPTH: u32 = 128;
/// One signaled send in this many lets the send queue drain (selective signaling).
const SIGNAL_EVERY: u32 = 16;
/// Largest RDMA READ/WRITE posted as one work request.
const MAX_PIECE: usize = 1 << 20;
/// Largest inline message built on the stack.
const INLINE_BUF: usize = 256;
/// Send buffers (slot-sized) per endpoint: chunks of 64, at most 4.
const SEND_BUFS: usize = 256;
/// Completions polled per call.
const CQ_BATCH: usize = 16;
/// Transport retries: the most that is finite everywhere (rxe retries for ever at 7).
const DEFAULT_RETRY_CNT: u8 = 6;

/// How to build the endpoint.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// The eager pool, as on every RDMA device.
    pub eager: EagerConfig,
    /// Use a shared receive queue when the device has one.
    pub srq: bool,
    /// Inline data to ask the device for (bytes).
    pub inline: u32,
    /// Largest plain slice copied through a bounce buffer.
    pub bounce_max: usize,
    /// Local ACK timeout exponent (4.096 us × 2^t per try) and retries: bound
    /// how long a dead peer on another host takes to notice.
    pub timeout: u8,
    /// Transport retries before a send fails with "retry exceeded" (default 6:
    /// rxe treats 7 as "retry for ever", so a dead peer would never be reported).
    pub retry_cnt: u8,
}

impl VerbsConfig {
    /// Defaults, overridden by the eager pool's variables ([`EagerConfig::from_env`]),
    /// `FMX_VERBS_SRQ` (0: off), `FMX_VERBS_INLINE_BYTES`, `FMX_VERBS_BOUNCE_BYTES`,
    /// `FMX_VERBS_ACK_TIMEOUT_EXP` and `FMX_VERBS_RETRY_COUNT`.
    pub fn from_env(rank: u32, size: u32) -> Result<Self, TransportError> {
        let mut eager = EagerConfig::from_env(rank, size)?;
        eager.connect.get_or_insert(ConnectMode::Lazy);
        Ok(Self {
            eager,
            srq: env_num("FMX_VERBS_SRQ")?.is_none_or(|n| n != 0),
            inline: env_num("FMX_VERBS_INLINE_BYTES")?.map_or(INLINE_BUF as u32, |n| n as u32),
            bounce_max: env_num("FMX_VERBS_BOUNCE_BYTES")?.unwrap_or(DEFAULT_BOUNCE_MAX),
            timeout: env_num("FMX_VERBS_ACK_TIMEOUT_EXP")?.map_or(14, |n| n.min(31) as u8),
            retry_cnt: env_num("FMX_VERBS_RETRY_COUNT")?.map_or(DEFAULT_RETRY_CNT, |n| n.min(7) as u8),
        })
    }
}

/// Registers pool chunks with `ibv_reg_mr`.
pub struct VerbsHook {
    pd: Arc<Pd>,
    access: Access,
    count: Arc<AtomicU64>,
}

impl RegistrationHook for VerbsHook {
    type Handle = Mr;
    fn register(&mut self, chunk: &mut [u8]) -> Result<Mr, TransportError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        Mr::register(&self.pd, chunk.as_ptr(), chunk.len(), self.access)
            .map_err(|e| TransportError::Setup { what: "register a pool chunk".into(), source: e })
    }
    fn deregister(&mut self, handle: Mr) {
        drop(handle);
    }
}

/// What completes when a signaled work request toward a peer completes.
enum Inflight {
    /// A send buffer to give back.
    Slot(Lease),
    /// One piece of a one-sided operation.
    Op(u64),
    /// Inline sends, credit writes, probes.
    Nothing,
}

/// One-sided operations: pieces carry the lkey of their local memory.
type Operations = fmx_transport::ops::Operations<Local<Mr>, u32>;
type Piece<D> = fmx_transport::ops::Piece<D>;

/// How the verbs endpoint reaches a peer: its queue pair and the work requests in flight on it.
pub struct Link {
    /// Lazily `None` until the first operation toward the peer (or its request) makes it.
    qp: Option<Qp>,
    /// The first PSN of our queue pair toward the peer.
    psn: u32,
    /// Next work-request sequence number; unsignaled requests complete with the next signaled one.
    seq: u64,
    inflight: VecDeque<(u64, Inflight)>,
    unsignaled: u32,
    /// The path MTU in bytes: eager messages the header would push into
    /// one more packet carry it in immediate data instead.
    mtu: usize,
    /// Match bits the peer has filed for our compacted headers.
    sent_headers: SendDict,
    /// Match bits the peer taught us for its compacted headers.
    heard_headers: RecvDict,
}

/// Our queue pairs exist; they are not connected yet. Publish
/// [`VerbsSetup::address`] through the bootstrap, then [`VerbsSetup::connect`].
pub struct VerbsSetup {
    cfg: VerbsConfig,
    credit: CreditConfig,
    chosen: Chosen,
    pd: Arc<Pd>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    srq: Option<Arc<Srq>>,
    /// Eagerly our queue pair toward every peer; lazily empty.
    qps: Vec<Option<Qp>>,
    psns: Vec<u32>,
    recv: MmapMut,
    regions: RecvRegions,
    /// Lazily: the UD queue pair that takes connection requests.
    channel: Option<Channel>,
    /// The inline data our RC queue pairs take.
    max_inline: u32,
    shape: QpShape,
    mailbox: MmapMut,
    mailbox_mr: Mr,
    outbox: MmapMut,
    outbox_mr: Mr,
    registrations: Arc<AtomicU64>,
}

fn anon(bytes: usize) -> Result<MmapMut, TransportError> {
    anonymous(bytes, 1, "map verbs buffers")
}

impl VerbsSetup {
    /// Opens the device and creates our queues, receive slots and mailbox.
    pub fn create(cfg: VerbsConfig) -> Result<Self, TransportError> {
        let credit = cfg.eager.credits()?;
        let chosen = choose(cfg.eager.rank)?;
        let ctx = chosen.ctx.clone();
        let pd = Pd::alloc(&ctx).map_err(setup_error("allocate a protection domain"))?;
        let peers = cfg.eager.size.saturating_sub(1);
        let recv_slots = cfg.eager.receive_slots();
        let use_srq = cfg.srq && chosen.attr.max_srq > 0 && recv_slots as i32 <= chosen.attr.max_srq_wr;
        let srq =
            if use_srq { Some(Srq::create(&pd, recv_slots as u32).map_err(setup_error("create the shared receive queue"))?) } else { None };
        let wireup_recvs = if cfg.eager.lazy() { channel::RECVS as i32 } else { 0 };
        let cq_entries = (recv_slots as i32 + 64 + wireup_recvs).min(chosen.attr.max_cqe);
        let recv_cq = Cq::create(&ctx, cq_entries).map_err(setup_error("create the receive completion queue"))?;
        let send_cq = Cq::create(&ctx, ((SQ_DEPTH * peers.max(1)) as i32 + 64).min(chosen.attr.max_cqe))
            .map_err(setup_error("create the send completion queue"))?;
        let shape =
            QpShape { sq: SQ_DEPTH.min(chosen.attr.max_qp_wr as u32), recv: (credit.slice + CTRL_SLOTS).max(1), inline: cfg.inline };
        let lazy = cfg.eager.lazy();
        let mut qps = Vec::with_capacity(cfg.eager.size as usize);
        let mut psns = Vec::with_capacity(cfg.eager.size as usize);
        for r in (0..cfg.eager.size).filter(|_| !lazy) {
            if r == cfg.eager.rank {
                qps.push(None);
                psns.push(0);
                continue;
            }
            qps.push(Some(shape.create(&pd, &send_cq, &recv_cq, srq.as_ref()).map_err(setup_error("create an RC queue pair"))?));
            psns.push(first_psn(r));
        }
        // Lazily no queue pair exists yet: one made and dropped says what inline data they take.
        let max_inline = match qps.iter().flatten().map(|q| q.max_inline).min() {
            Some(n) => n,
            None => shape.create(&pd, &send_cq, &recv_cq, srq.as_ref()).map_err(setup_error("create an RC queue pair"))?.max_inline,
        };
        let channel = if lazy {
            let c = &chosen;
            Some(Channel::open(&pd, &c.ctx, &recv_cq, c.port, c.gid_index, cfg.eager.size)?)
        } else {
            None
        };
        let registrations = Arc::new(AtomicU64::new(0));
        let recv = anon(recv_slots * cfg.eager.slot_bytes)?;
        let mut regions = RecvRegions::new(recv.as_ptr(), cfg.eager.slot_bytes);
        if !lazy {
            regions.register(&pd, cfg.eager.rank, 0..recv_slots)?;
        }
        let mailbox = anon(8 * cfg.eager.size as usize)?;
        let mailbox_mr =
            Mr::register(&pd, mailbox.as_ptr(), mailbox.len(), Access::RemoteWrite).map_err(setup_error("register the credit mailbox"))?;
        let outbox = anon(8 * cfg.eager.size as usize)?;
        let outbox_mr =
            Mr::register(&pd, outbox.as_ptr(), outbox.len(), Access::Local).map_err(setup_error("register the credit outbox"))?;
        registrations.fetch_add(2 + regions.count() as u64, Ordering::Relaxed);
        let me = Self {
            cfg,
            credit,
            chosen,
            pd,
            send_cq,
            recv_cq,
            srq,
            qps,
            psns,
            recv,
            regions,
            channel,
            max_inline,
            shape,
            mailbox,
            mailbox_mr,
            outbox,
            outbox_mr,
            registrations,
        };
        if me.srq.is_some() && !lazy {
            me.post_all_receives(&me.qps)?;
        }
        Ok(me)
    }

    /// Receive slot `i` goes to the SRQ, or to the QP of the peer that owns it
    /// (a QP takes receives once it is out of RESET: after connecting).
    fn post_all_receives(&self, qps: &[Option<Qp>]) -> Result<(), TransportError> {
        let per_peer = (self.credit.slice + CTRL_SLOTS) as usize;
        let slots = self.recv.len() / self.cfg.eager.slot_bytes;
        let peers: Vec<usize> = (0..self.cfg.eager.size as usize).filter(|&r| r != self.cfg.eager.rank as usize).collect();
        for i in 0..slots {
            let (addr, lkey) = self.regions.slot(i).expect("eagerly the whole region is registered");
            let res = match &self.srq {
                // SAFETY: slot i lies in the receive region registered above,
                // owned by the endpoint until its queues are destroyed.
                Some(srq) => unsafe { srq.post_recv(i as u64, addr, self.cfg.eager.slot_bytes as u32, lkey) },
                None => match peers.get(i / per_peer.max(1)) {
                    // SAFETY: as above, on the owning peer's QP.
                    Some(&r) => unsafe {
                        qps[r].as_ref().expect("a peer's QP").post_recv(i as u64, addr, self.cfg.eager.slot_bytes as u32, lkey)
                    },
                    None => Ok(()), // more slots than peers × share: spare
                },
            };
            res.map_err(setup_error("post a receive slot"))?;
        }
        Ok(())
    }

    /// The device this process uses.
    pub fn chosen(&self) -> &Chosen {
        &self.chosen
    }

    /// What peers need to reach us.
    pub fn address(&self) -> Vec<u8> {
        Address {
            pid: std::process::id(),
            host: host_identity(),
            lid: self.chosen.port_attr.lid,
            global: self.chosen.global,
            mtu: self.chosen.port_attr.active_mtu,
            gid: self.chosen.gid,
            mailbox_addr: self.mailbox_mr.addr,
            mailbox_rkey: self.mailbox_mr.rkey(),
            ud_qpn: self.channel.as_ref().map_or(0, Channel::qpn),
            lazy: self.cfg.eager.lazy(),
            qp: self.qps.iter().zip(&self.psns).map(|(q, &psn)| (q.as_ref().map_or(0, Qp::qpn), psn)).collect(),
        }
        .encode()
    }

    /// Connects our queue pair toward every peer (lazily: learns where each
    /// peer is; queue pairs come on demand). `addresses[r]` is rank r's [`VerbsSetup::address`].
    pub fn connect(self, addresses: &[Vec<u8>]) -> Result<VerbsEndpoint, TransportError> {
        let cfg = &self.cfg;
        if addresses.len() != cfg.eager.size as usize {
            return Err(TransportError::Setup {
                what: format!("verbs connect got {} addresses for a job of {}", addresses.len(), cfg.eager.size),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let (me, lazy) = (cfg.eager.rank, cfg.eager.lazy());
        let mine = host_identity();
        let timing = QpTiming {
            port: self.chosen.port,
            gid_index: self.chosen.gid_index,
            timeout: cfg.timeout,
            retry_cnt: cfg.retry_cnt,
            rnr_retry: 6, // credits keep slots posted; an RNR means a bug, reported after retries
            rd_atomic: self.chosen.attr.max_qp_rd_atom.clamp(1, 16) as u8,
        };
        let decoded = addresses
            .iter()
            .enumerate()
            .map(|(r, bytes)| Address::decode(r as u32, me, cfg.eager.size, lazy, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let local_mtu = self.chosen.port_attr.active_mtu;
        let path_to = |a: &Address, (qpn, psn): (u32, u32)| PeerPath {
            qpn,
            psn,
            lid: a.lid,
            gid: a.gid,
            global: a.global,
            mtu: a.mtu.min(local_mtu),
        };
        for (r, a) in decoded.iter().enumerate() {
            let Some(qp) = self.qps.get(r).and_then(Option::as_ref) else { continue };
            let path = path_to(a, a.qp[me as usize]);
            connect_with_retry(|| qp.connect(timing, self.psns[r], &path)).map_err(|e| TransportError::Setup {
                what: format!("connect the queue pair to rank {r} (device {}, port {})", self.chosen.ctx.name, self.chosen.port),
                source: e,
            })?;
            tracing::debug!(
                rank = me,
                "queue pair to rank {r} connected: device {} port {}, remote QPN {:#x}, MTU {}, GID {}",
                self.chosen.ctx.name,
                self.chosen.port,
                path.qpn,
                128u32 << path.mtu,
                std::net::Ipv6Addr::from(path.gid)
            );
        }
        if self.srq.is_none() && !lazy {
            self.post_all_receives(&self.qps)?;
        }
        let mut qps = self.qps;
        let mut peers = Vec::with_capacity(cfg.eager.size as usize);
        let mut qpn_to_peer = Vec::new();
        for (r, a) in decoded.iter().enumerate() {
            let r = r as u32;
            if r == me {
                peers.push(None);
                continue;
            }
            let qp = qps.get_mut(r as usize).and_then(Option::take);
            if let Some(q) = &qp {
                qpn_to_peer.push((q.qpn(), r));
            }
            peers.push(Some(Peer {
                credits: PeerCredits::new(&self.credit, r < me),
                life: PeerLife::new(a.pid, &a.host, &mine),
                mailbox_addr: a.mailbox_addr + 8 * u64::from(me),
                mailbox_key: u64::from(a.mailbox_rkey),
                link: Link {
                    qp,
                    psn: first_psn(r),
                    seq: 0,
                    inflight: VecDeque::new(),
                    unsignaled: 0,
                    mtu: 128 << a.mtu.min(local_mtu),
                    sent_headers: SendDict::default(),
                    heard_headers: RecvDict::default(),
                },
            }));
        }
        qpn_to_peer.sort_unstable();
        let on_demand = self.channel.map(|channel| {
            Box::new(OnDemand {
                wire: Wireup::new(me, cfg.eager.size),
                channel,
                ud: decoded.iter().map(|a| UdPeer { qpn: a.ud_qpn, lid: a.lid, gid: a.gid, global: a.global }).collect(),
                paths: decoded.iter().map(|a| path_to(a, (0, 0))).collect(),
                timing,
                shape: self.shape,
            })
        });
        let hook = |access| VerbsHook { pd: self.pd.clone(), access, count: self.registrations.clone() };
        let send_pool = Pool::new(
            PoolConfig { buf_size: cfg.eager.slot_bytes, bufs_per_chunk: 64, max_chunks: SEND_BUFS / 64, huge_pages: HugePages::Never },
            hook(Access::Local),
        );
        let memory = Memory::new(hook(Access::Remote), cfg.bounce_max, true);
        let mut st = RdmaState::new(&cfg.eager, self.credit, self.registrations, self.mailbox, self.recv).with_peers(peers);
        // Eagerly every slot is posted already (above, or at create), in the grants' order.
        drop(st.take_posts());
        Ok(VerbsEndpoint {
            on_demand,
            st,
            max_inline: self.max_inline as usize,
            // Pieces of at most 1 MiB: a long READ response on a slow link
            // (rxe under emulation) must not outlive the ACK timeout.
            max_msg: (self.chosen.port_attr.max_msg_sz as usize).clamp(1 << 16, MAX_PIECE),
            device: self.chosen.ctx.name.clone(),
            headers_in_immediate: 0,
            qpn_to_peer,
            ops: Operations::default(),
            memory,
            send_pool,
            regions: self.regions,
            _mailbox_mr: self.mailbox_mr,
            outbox: self.outbox,
            outbox_mr: self.outbox_mr,
            srq: self.srq,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            pd: self.pd,
            _chosen: self.chosen,
        })
    }
}

/// The first PSN of our queue pair toward rank `r` (24 bits, different per
/// process and peer, so a stale packet of an earlier job is not taken for ours).
fn first_psn(r: u32) -> u32 {
    (std::process::id().wrapping_mul(2_654_435_761) ^ r.wrapping_mul(0x9e37_79b9)) & 0x00ff_ffff
}

/// How our RC queue pairs are made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpShape {
    sq: u32,
    /// Receive work requests (without a shared receive queue): a connection's slots.
    recv: u32,
    inline: u32,
}

impl QpShape {
    fn create(&self, pd: &Arc<Pd>, send_cq: &Arc<Cq>, recv_cq: &Arc<Cq>, srq: Option<&Arc<Srq>>) -> std::io::Result<Qp> {
        Qp::create_rc(pd, send_cq, recv_cq, srq, self.sq, self.recv, self.inline)
            // Some devices refuse inline data; fall back to none.
            .or_else(|_| Qp::create_rc(pd, send_cq, recv_cq, srq, self.sq, self.recv, 0))
    }
}

/// Moves a QP to RTS (`to_rts`), retrying while the kernel cannot resolve the peer's
/// address yet (ETIMEDOUT: e.g. an IPv6 address still in duplicate address
/// detection right after the interface came up). Bounded: 10 tries, 5 s.
pub(crate) fn connect_with_retry(to_rts: impl Fn() -> std::io::Result<()>) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        match to_rts() {
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut && tries < 10 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            r => return r,
        }
    }
}

/// The verbs endpoint.
///
/// Field order is drop order: the queue pairs go first (`Drop` destroys them),
/// then the registrations, then the memory they cover, then the queues and
/// the domain, and the shared state last.
pub struct VerbsEndpoint {
    /// Lazily: the handshakes that make queue pairs on demand.
    on_demand: Option<Box<OnDemand>>,
    max_inline: usize,
    max_msg: usize,
    device: String,
    /// Eager messages sent with their header in immediate data.
    headers_in_immediate: u64,
    qpn_to_peer: Vec<(u32, PeerId)>,
    ops: Operations,
    /// Owned registrations, exposures, bounce buffers.
    memory: Memory<VerbsHook>,
    send_pool: Pool<VerbsHook>,
    regions: RecvRegions,
    /// Registered for peers' credit writes; never read through.
    _mailbox_mr: Mr,
    outbox_mr: Mr,
    outbox: MmapMut,
    srq: Option<Arc<Srq>>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    pd: Arc<Pd>,
    _chosen: Chosen,
    /// What every RDMA endpoint keeps alike. Its queue pairs are destroyed
    /// first, by `Drop`; its mailbox memory is freed last.
    st: RdmaState<Link>,
}

// SAFETY: the raw pointers (bounce destinations) point into buffers the core
// lends to the endpoint until the operation completes; the endpoint is driven
// by one thread at a time, and every verbs object is thread-safe.
unsafe impl Send for VerbsEndpoint {}

fn status_name(status: u32) -> String {
    use ffi::ibv_wc_status as S;
    let name = match status {
        S::IBV_WC_RETRY_EXC_ERR => "transport retry counter exceeded (peer unreachable or dead)",
        S::IBV_WC_RNR_RETRY_EXC_ERR => "receiver-not-ready retry counter exceeded (no receive posted)",
        S::IBV_WC_REM_ACCESS_ERR => "remote access error (bad rkey, bounds or permissions)",
        S::IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
        S::IBV_WC_REM_OP_ERR => "remote operation error",
        S::IBV_WC_LOC_LEN_ERR => "local length error",
        S::IBV_WC_LOC_PROT_ERR => "local protection error",
        S::IBV_WC_WR_FLUSH_ERR => {
            "flushed: the queue pair is in the error state (after a failure of ours, or as the responder to a bad request from the peer)"
        }
        _ => "",
    };
    if name.is_empty() {
        format!("completion status {status}")
    } else {
        name.to_owned()
    }
}

const PEER_SHIFT: u32 = 40;

impl VerbsEndpoint {
    /// The device this endpoint uses.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The largest message sent inline (no send buffer, no DMA read of it).
    pub fn max_inline(&self) -> usize {
        self.max_inline
    }

    /// Whether receive slots sit on a shared receive queue.
    pub fn uses_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// Eager messages sent so far with their header in immediate data (a
    /// payload the 32-byte header would push into one more packet).
    pub fn headers_in_immediate(&self) -> u64 {
        self.headers_in_immediate
    }

    /// The credit state toward `peer` (for tests and reports).
    pub fn credits(&self, peer: PeerId) -> Option<&PeerCredits> {
        self.st.peers.get(peer as usize).and_then(Option::as_ref).map(|p| &p.credits)
    }

    /// Posts one work request toward `peer`, signaling it when due.
    fn post(
        &mut self,
        peer: PeerId,
        op: SendOp,
        local: (u64, u32, u32),
        inline: bool,
        what: Inflight,
        force_signal: bool,
    ) -> Result<(), TransportError> {
        let low_slots = self.send_pool.leased() * 4 >= 3 * SEND_BUFS;
        let p = self.st.peers.alive(peer)?;
        let Some(qp) = p.link.qp.as_ref() else {
            let source = std::io::Error::new(std::io::ErrorKind::NotConnected, "no queue pair toward the peer yet");
            return Err(TransportError::Io { op: "ibv_post_send", peer, source });
        };
        let seq = p.link.seq;
        let signaled = force_signal || low_slots || p.link.unsignaled + 1 >= SIGNAL_EVERY;
        let wr = SendWr { wr_id: (u64::from(peer) << PEER_SHIFT) | seq, opcode: op, local, signaled, inline };
        // SAFETY: `local` lies in memory registered with its lkey that the endpoint
        // (send slots, bounce buffers, per-operation registrations) or the
        // core (lent buffers, until poll_ops reports the op) keeps alive until
        // this request completes; inline data is copied during the call.
        unsafe { qp.post_send(&wr) }.map_err(|source| TransportError::Io { op: "ibv_post_send", peer, source })?;
        p.link.seq += 1;
        p.link.unsignaled = if signaled { 0 } else { p.link.unsignaled + 1 };
        p.link.inflight.push_back((seq, what));
        Ok(())
    }

    /// Room for one more request toward `peer` (reaping completions if needed).
    fn sq_room(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        let full = |me: &Self| me.st.peers[peer as usize].as_ref().is_some_and(|p| p.link.inflight.len() as u32 + 2 >= SQ_DEPTH);
        if full(self) {
            self.reap_sends()?;
            if full(self) {
                // Everything outstanding may be unsignaled: ask for a completion.
                if let Some(p) = self.st.peers[peer as usize].as_mut() {
                    p.link.unsignaled = SIGNAL_EVERY;
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Handles send-side completions: frees send slots, advances one-sided ops,
    /// records failures against the peer.
    /// Polled even while no signaled request is outstanding: a failed
    /// unsignaled request completes (with its error) all the same, and a
    /// sender out of credits toward a dead peer posts nothing that would be
    /// signaled (the device test of a vanished peer found this).
    fn reap_sends(&mut self) -> Result<usize, TransportError> {
        let mut wcs = [std::mem::MaybeUninit::uninit(); CQ_BATCH];
        let mut total = 0;
        loop {
            let done = self.send_cq.poll(&mut wcs).map_err(setup_error("poll the send completion queue"))?;
            let n = done.len();
            for wc in done {
                let peer = (wc.wr_id() >> PEER_SHIFT) as PeerId;
                let seq = wc.wr_id() & ((1 << PEER_SHIFT) - 1);
                let failure = wc.error().map(|(status, vendor)| {
                    let rank = self.st.rank;
                    tracing::debug!(rank, "send completion toward peer {peer} seq {seq}: {} (vendor {vendor:#x})", status_name(status));
                    status_name(status)
                });
                self.complete_through(peer, seq, failure);
            }
            total += n;
            if n < CQ_BATCH {
                return Ok(total);
            }
        }
    }

    /// A registered send buffer, reaping completions once if none is free.
    fn send_buf(&mut self) -> Result<Option<Lease>, TransportError> {
        if let Some(l) = self.send_pool.lease()? {
            return Ok(Some(l));
        }
        self.reap_sends()?;
        self.send_pool.lease()
    }

    /// An eager message with its header in immediate data (see `compact`):
    /// the payload alone if the peer knows the match bits, else the whole
    /// message with the index to file them under.
    fn send_compacted(&mut self, peer: PeerId, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<SendOutcome, TransportError> {
        let h = MsgHeader::decode(header).map_err(|_| TransportError::Malformed { peer, what: "an eager header fmx did not encode" })?;
        let bits = h.match_bits;
        let (imm, teach) = match self.st.peers.alive(peer)?.link.sent_headers.lookup(bits) {
            Ok(index) => (Imm::Compact { index, credits: h.credits, ctrl_credits: h.ctrl_credits }, None),
            Err(index) => (Imm::Learn { index }, Some(index)),
        };
        let Some(lease) = self.send_buf()? else { return Ok(SendOutcome::Backpressure) };
        let b = self.send_pool.buf_mut(&lease);
        let start = if teach.is_some() { HEADER_BYTES } else { 0 };
        b[..start].copy_from_slice(&header[..start]);
        b[start..start + payload.len()].copy_from_slice(payload);
        let local = (b.as_ptr() as u64, (start + payload.len()) as u32, self.send_pool.handle(&lease).lkey());
        self.post(peer, SendOp::SendImm(imm.encode()), local, false, Inflight::Slot(lease), false)?;
        // Only a message that went out teaches: the peer files what it receives.
        match teach {
            Some(index) => self.st.peers.alive(peer)?.link.sent_headers.taught(index, bits),
            None => self.headers_in_immediate += 1,
        }
        Ok(SendOutcome::Sent)
    }

    /// What a receive completion's immediate value says about the slot: the
    /// length with the header (rebuilt in the slot for a compacted message)
    /// and the index a learn message files its match bits under.
    fn headerless(&mut self, peer: PeerId, slot: u64, wc: &ffi::ibv_wc) -> Result<(usize, Option<u8>), TransportError> {
        let Some(raw) = wc.imm_data() else { return Ok((wc.len(), None)) };
        let len = wc.len();
        match Imm::decode(u32::from_be(raw)) {
            None => Err(TransportError::Malformed { peer, what: "an immediate value fmx does not send" }),
            Some(Imm::Learn { index }) => Ok((len, Some(index))),
            Some(Imm::Compact { index, credits, ctrl_credits }) => {
                // Not `alive`: what a peer sent before it died or finalized still counts.
                let known = match self.st.peers.get_mut(peer as usize) {
                    Some(Some(p)) => p.link.heard_headers.get(index),
                    _ => None,
                };
                let Some(match_bits) = known else {
                    return Err(TransportError::Malformed { peer, what: "a compacted header naming an entry its sender never taught" });
                };
                let header = MsgHeader {
                    kind: MsgKind::Eager,
                    credits,
                    ctrl_credits,
                    payload_len: len as u32,
                    match_bits,
                    len: len as u64,
                    cookie: 0,
                };
                Ok((self.st.restore_header(peer, slot, len, &header)?, None))
            }
        }
    }

    fn complete_through(&mut self, peer: PeerId, seq: u64, failure: Option<String>) {
        let Some(Some(p)) = self.st.peers.get_mut(peer as usize) else { return };
        if let Some(reason) = &failure {
            // Keep the first real cause; flushes only follow one.
            p.life.mark_dead(format!("device {} reported: {reason}", self.device), reason.starts_with("flushed"));
        }
        while p.link.inflight.front().is_some_and(|(s, _)| *s <= seq) {
            let (_, what) = p.link.inflight.pop_front().expect("front exists");
            match what {
                Inflight::Slot(lease) => self.send_pool.release(lease),
                Inflight::Op(id) => {
                    let error = failure.as_ref().map(|reason| TransportError::Completion {
                        op: "RDMA operation",
                        peer,
                        device: self.device.clone(),
                        status: reason.clone(),
                    });
                    self.ops.piece_done(id, error);
                }
                Inflight::Nothing => {}
            }
        }
        if failure.is_none() {
            p.life.probe_answered();
        }
    }
}

impl Sealed for VerbsEndpoint {}

impl RdmaDevice for VerbsEndpoint {
    type Link = Link;
    type Desc = u32;
    type Mr = Mr;
    type Hook = VerbsHook;

    fn operations(&mut self, _: Core) -> &mut Operations {
        &mut self.ops
    }

    fn memory(&mut self, _: Core) -> &mut Memory<VerbsHook> {
        &mut self.memory
    }

    fn register(&mut self, _: Core, peer: PeerId, ptr: *const u8, len: usize, access: MemAccess) -> Result<Mr, TransportError> {
        let access = match access {
            MemAccess::ReadInto => Access::Local,
            MemAccess::WriteFrom => Access::LocalRead,
            MemAccess::PeerReads => Access::RemoteRead,
            MemAccess::PeerWrites => Access::RemoteWrite,
            MemAccess::Any => Access::Remote,
        };
        Mr::register(&self.pd, ptr, len, access).map_err(|source| TransportError::Io { op: "ibv_reg_mr", peer, source })
    }

    fn max_piece(&self) -> usize {
        self.max_msg
    }

    fn post_piece(&mut self, _: Core, pc: &Piece<u32>) -> Result<Posted, TransportError> {
        if !self.ready(pc.peer)? || !self.sq_room(pc.peer)? {
            return Ok(Posted::Again);
        }
        let (remote_addr, rkey) = (pc.remote_addr, pc.key as u32);
        let op = if pc.read { SendOp::Read { remote_addr, rkey } } else { SendOp::Write { remote_addr, rkey } };
        self.post(pc.peer, op, (pc.local, pc.len as u32, pc.desc), false, Inflight::Op(pc.op), true)?;
        Ok(Posted::Yes)
    }

    fn state_mut(&mut self, _: Core) -> &mut RdmaState<Link> {
        &mut self.st
    }

    fn state(&self) -> &RdmaState<Link> {
        &self.st
    }

    /// A SEND of header and payload into the slot the peer posted: inline
    /// when small, else from a registered send buffer. Resources first: a
    /// full send queue or no free buffer is backpressure.
    fn send_eager(&mut self, _: Core, peer: PeerId, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<SendOutcome, TransportError> {
        let len = HEADER_BYTES + payload.len();
        // Lazily, until the queue pair is connected: "connecting".
        if !self.ready(peer)? || !self.sq_room(peer)? {
            return Ok(SendOutcome::Backpressure);
        }
        if MsgHeader::is_plain_eager(header) && compact::saves_a_packet(payload.len(), self.st.peers.alive(peer)?.link.mtu) {
            return self.send_compacted(peer, header, payload);
        }
        if len <= self.max_inline.min(INLINE_BUF) {
            let mut buf = [0u8; INLINE_BUF];
            buf[..HEADER_BYTES].copy_from_slice(header);
            buf[HEADER_BYTES..len].copy_from_slice(payload);
            self.post(peer, SendOp::Send, (buf.as_ptr() as u64, len as u32, 0), true, Inflight::Nothing, false)?;
            return Ok(SendOutcome::Sent);
        }
        let Some(lease) = self.send_buf()? else { return Ok(SendOutcome::Backpressure) };
        let b = self.send_pool.buf_mut(&lease);
        b[..HEADER_BYTES].copy_from_slice(header);
        b[HEADER_BYTES..len].copy_from_slice(payload);
        let local = (b.as_ptr() as u64, len as u32, self.send_pool.handle(&lease).lkey());
        self.post(peer, SendOp::Send, local, false, Inflight::Slot(lease), false)?;
        Ok(SendOutcome::Sent)
    }

    fn receive(&mut self, core: Core, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        let mut n = 0;
        let mut wcs = [std::mem::MaybeUninit::uninit(); CQ_BATCH];
        while n < max {
            let want = CQ_BATCH.min(max - n);
            let done = self.recv_cq.poll(&mut wcs[..want]).map_err(setup_error("poll the receive completion queue"))?;
            let got = done.len();
            for wc in done {
                if self.on_demand.as_ref().is_some_and(|od| od.channel.qpn() == wc.qp_num) {
                    self.on_datagram(wc);
                    continue;
                }
                let slot = wc.wr_id() as usize;
                let peer = match self.qpn_to_peer.binary_search_by_key(&wc.qp_num, |&(q, _)| q) {
                    Ok(i) => self.qpn_to_peer[i].1,
                    Err(_) => {
                        return Err(TransportError::Malformed { peer: u32::MAX, what: "receive completion for an unknown queue pair" })
                    }
                };
                if let Some((status, vendor)) = wc.error() {
                    tracing::debug!(
                        rank = self.st.rank,
                        "receive completion from peer {peer}: {} (vendor {vendor:#x})",
                        status_name(status)
                    );
                    let reason = status_name(status);
                    let flushed = reason.starts_with("flushed");
                    self.st.mark_dead(peer, format!("device {} reported on receive: {reason}", self.device), flushed);
                    continue; // the QP is in error: its slot is not reposted
                }
                if let Some(od) = self.on_demand.as_deref_mut() {
                    od.wire.on_arrival(peer);
                }
                let (len, learned) = self.headerless(peer, slot as u64, wc)?;
                let a = self.st.arrive(peer, slot as u64, len, "undecodable header in a verbs receive slot")?;
                if let (Some(index), Some(Some(p))) = (learned, self.st.peers.get_mut(peer as usize)) {
                    p.link.heard_headers.learn(index, a.header.match_bits);
                }
                if RdmaState::<Link>::for_core(&a) {
                    out.push(a);
                    n += 1;
                } else {
                    self.release_slot(core, a)?;
                }
            }
            if got < want {
                break;
            }
        }
        self.tick_wireup();
        self.reap_sends()?;
        Ok(n)
    }

    /// Reposts the slot before returning its credit: the slot is free again only once posted.
    fn release_slot(&mut self, _: Core, arrival: Arrival) -> Result<(), TransportError> {
        self.st.unhold(&arrival)?;
        self.post_slot(arrival.slot as usize, arrival.peer)?;
        self.st.released(arrival.peer, Class::of(arrival.header.kind));
        Ok(())
    }

    fn post_slots(&mut self, _: Core, peer: PeerId, slots: std::ops::Range<usize>) -> Result<(), TransportError> {
        self.post_granted(peer, slots)
    }

    fn large_path(&self) -> String {
        format!("RDMA READ of the sender's buffer (device {})", self.device)
    }

    fn progress(&mut self, _: Core) -> Result<(), TransportError> {
        self.tick_wireup();
        self.reap_sends().map(drop)
    }

    /// An inline 8-byte RDMA WRITE of the word into the peer's mailbox, needing no credit.
    fn return_credits(&mut self, _: Core, all: bool) -> Result<(), TransportError> {
        self.st.explicit_due = false;
        for peer in self.st.owed_returns(all) {
            match self.ready(peer) {
                Ok(true) if self.sq_room(peer)? => {}
                Ok(_) => {
                    self.st.explicit_due = true;
                    continue;
                }
                Err(_) => continue, // dead: nothing to return
            }
            let word = self.st.return_word(peer);
            let p = self.st.peers[peer as usize].as_ref().expect("a peer");
            let (addr, rkey) = (p.mailbox_addr, p.mailbox_key as u32);
            // The source word stays in registered memory (devices without
            // inline data read it by DMA); a newer total may overwrite it
            // before the device reads it, which is as good.
            let src = &mut self.outbox[8 * peer as usize..][..8];
            src.copy_from_slice(&word.to_le_bytes());
            let local = (src.as_ptr() as u64, 8, self.outbox_mr.lkey());
            let (inline, finalized) = (self.max_inline >= 8, self.st.finalized);
            self.post(peer, SendOp::Write { remote_addr: addr, rkey }, local, inline, Inflight::Nothing, finalized)?;
        }
        Ok(())
    }

    fn probe(&mut self, _: Core, peer: PeerId) {
        // A probe never makes a connection of its own.
        if !self.is_connected(peer) {
            return;
        }
        let Some(Some(p)) = self.st.peers.get(peer as usize) else { return };
        if !p.life.probe_due() {
            return;
        }
        let (addr, rkey) = (p.mailbox_addr, p.mailbox_key as u32);
        if self.sq_room(peer).unwrap_or(false)
            && self.post(peer, SendOp::Write { remote_addr: addr, rkey }, (0, 0, 0), false, Inflight::Nothing, true).is_ok()
        {
            self.st.peers[peer as usize].as_mut().expect("a peer").life.probe_posted();
        }
    }

    fn words_in_flight(&mut self, _: Core) -> bool {
        self.st.peers.iter().flatten().any(|p| p.life.failure().is_none() && !p.link.inflight.is_empty())
    }
}

impl Drop for VerbsEndpoint {
    fn drop(&mut self) {
        // Stop the device from touching memory we are about to free.
        for qp in self.st.peers.iter().flatten().filter_map(|p| p.link.qp.as_ref()) {
            qp.set_error();
        }
        if let Some(od) = &self.on_demand {
            od.channel.close();
        }
        self.st.peers.clear();
        self.memory.clear();
    }
}
