//! The libfabric endpoint: one FI_EP_RDM endpoint per process. Eager
//! messages are tagged sends (tag = sender's rank) into receive slots
//! pre-posted from any source (credits = slots, FM's send rule); credit
//! returns are `fi_write`s of a cumulative word into the peer's mailbox;
//! rendezvous is `fi_read`/`fi_write` between registered user buffers.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fmx_transport::credit::{mailbox, Class, PeerCredits};
use fmx_transport::liveness::{host_identity, PeerLife};
use fmx_transport::peers::Peer;
use fmx_transport::pool::{HugePages, Lease, Pool, PoolConfig, RegistrationHook};
use fmx_transport::rdma::{
    anonymous,
    connect::mode_mismatch,
    sealed::{Core, Sealed},
    Access, EagerConfig, Local, Memory, Posted, RdmaDevice, RdmaState, DEFAULT_BOUNCE_BYTES,
};
use fmx_transport::settings::{env_number, env_positive, ConnectMode};
use fmx_transport::{Arrival, PeerId, RemoteKey, SendOutcome, TransportError, HEADER_BYTES};
use memmap2::MmapMut;

use crate::address::Address;
use crate::fabric::{strerror, Fabric, Info, Mr};

mod tagged;

pub use fmx_transport::rdma::{CTRL_SLOTS, DEFAULT_NEWCOMER_CREDITS, DEFAULT_POOL_SLOTS, DEFAULT_SLOT_BYTES};
/// Default largest RDMA piece: a long transfer is split so that no single
/// operation outlives a slow link's timeouts (rxe under emulation).
pub const DEFAULT_PIECE: usize = 4 << 20;
/// Transmit contexts: operations in flight at once.
const TX_CONTEXTS: usize = 256;
/// Send buffers (slot-sized): chunks of 64.
const SEND_BUFS: usize = 256;
/// Completions read per call.
const CQ_BATCH: usize = 16;
/// Default of [`OfiConfig::peer_timeout`], in seconds.
pub const DEFAULT_PEER_TIMEOUT_SECS: u64 = 5;
/// Providers whose traffic to a peer is one byte stream (a socket): a read
/// and a write between two processes do not proceed in parallel there.
const STREAM_PROVIDERS: &[&str] = &["tcp", "sockets", "net", "udp"];
/// How long connecting to every peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Lazily: receive slots posted at init for first messages from ranks not
/// yet connected (each connection's own slots are posted at first contact;
/// what finds no posted slot waits in the provider's unexpected queue).
const FIRST_CONTACT_SLOTS: usize = 8;
/// Tags: the low 32 bits carry the sender's rank.
const RANK_BITS: u64 = 0xffff_ffff;

/// How to build the endpoint.
#[derive(Clone, Debug)]
pub struct OfiConfig {
    /// The eager pool, as on every RDMA device.
    pub eager: EagerConfig,
    /// The provider by name (`tcp;ofi_rxm`, `shm`, `verbs;ofi_rxm`); `None`: libfabric's best.
    pub provider: Option<String>,
    /// The domain by name (`lo`, `eth0`, `mlx5_0`, `rxe0`); `None`: the provider's first.
    /// From `FMX_OFI_DOMAIN`, a name or a comma-separated list taken by rank.
    pub domain: Option<String>,
    /// Largest RMA operation posted at once.
    pub piece: usize,
    /// Use FI_RMA when the provider has it (`FMX_OFI_RMA=0`: tagged messages instead).
    pub rma: bool,
    /// Control receives posted when RMA is not used (`FMX_OFI_CTRL_SLOTS`; default 4 per peer + 64).
    pub ctrl_slots: Option<usize>,
    /// How long the provider may refuse every probe of a peer on another host,
    /// with nothing else in flight toward it, before the peer counts as dead
    /// (`FMX_OFI_PEER_TIMEOUT`, seconds; default 5).
    pub peer_timeout: Duration,
    /// The job's id (`[A-Za-z0-9_.]`). Where the provider keeps endpoints in
    /// files (shm), the endpoint is named after job and rank, so a killed
    /// process's file cannot collide with ours and [`crate::cleanup_job`]
    /// finds it. `None`: the provider's own name (shm: the pid).
    pub job: Option<String>,
}

impl OfiConfig {
    /// Defaults, overridden by `FMX_OFI_PROVIDER`, `FMX_OFI_DOMAIN`, `FMX_OFI_PIECE_BYTES`, `FMX_OFI_RMA`,
    /// `FMX_OFI_CTRL_SLOTS`, and the eager pool's variables ([`EagerConfig::from_env`]).
    pub fn from_env(rank: u32, size: u32) -> Result<Self, TransportError> {
        let mut eager = EagerConfig::from_env(rank, size)?;
        eager.connect.get_or_insert(ConnectMode::Lazy);
        Ok(Self {
            eager,
            provider: fmx_transport::settings::var("FMX_OFI_PROVIDER"),
            // A comma-separated list is taken by rank (rank r uses entry r mod len).
            domain: fmx_transport::settings::var("FMX_OFI_DOMAIN").and_then(|d| {
                let names: Vec<&str> = d.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
                (!names.is_empty()).then(|| names[rank as usize % names.len()].to_owned())
            }),
            piece: env_number("FMX_OFI_PIECE_BYTES")?.unwrap_or(DEFAULT_PIECE).max(4096),
            rma: env_number("FMX_OFI_RMA")?.is_none_or(|n| n != 0),
            ctrl_slots: env_positive("FMX_OFI_CTRL_SLOTS")?,
            peer_timeout: Duration::from_secs(env_positive("FMX_OFI_PEER_TIMEOUT")?.map_or(DEFAULT_PEER_TIMEOUT_SECS, |n| n as u64)),
            job: None,
        })
    }
}

/// Registers pool chunks with `fi_mr_reg` where the provider wants local descriptors.
struct OfiHook {
    fabric: Arc<Fabric>,
    count: Arc<AtomicU64>,
}

impl RegistrationHook for OfiHook {
    type Handle = Option<Mr>;
    fn register(&mut self, chunk: &mut [u8]) -> Result<Option<Mr>, TransportError> {
        if !self.fabric.mr_mode.local {
            return Ok(None);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.fabric.register(chunk.as_ptr(), chunk.len(), u64::from(sys::FI_SEND)).map(Some)
    }
    fn deregister(&mut self, handle: Option<Mr>) {
        drop(handle);
    }
}

/// Registers bounce-buffer chunks for every access.
pub struct BounceHook(Arc<Fabric>, Arc<AtomicU64>);

impl RegistrationHook for BounceHook {
    type Handle = Mr;
    fn register(&mut self, chunk: &mut [u8]) -> Result<Mr, TransportError> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.register(chunk.as_ptr(), chunk.len(), ALL_ACCESS)
    }
    fn deregister(&mut self, handle: Mr) {
        drop(handle);
    }
}

/// Every access a buffer registered for its lifetime may serve.
const ALL_ACCESS: u64 = (sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE) as u64;

/// A context handed to libfabric with each operation (FI_CONTEXT2 mode:
/// the provider may use it until the completion).
#[repr(C)]
struct Ctx {
    fi: sys::fi_context2,
}

/// What a transmit context stands for until its completion.
enum Tx {
    Free,
    /// An eager send out of a pooled buffer.
    Slot(PeerId, Lease),
    /// One piece of a one-sided operation.
    Piece(PeerId, u64),
    /// A credit mailbox write.
    Mailbox(PeerId),
    /// A liveness probe.
    Probe(PeerId),
    /// Data we send for a peer's emulated read (no RMA).
    Serve(PeerId),
    /// A receive into an exposed buffer for a peer's emulated write, by exposure key.
    Sink(PeerId, u64),
}

impl Tx {
    /// The peer the operation is toward.
    fn peer(&self) -> Option<PeerId> {
        match *self {
            Self::Free => None,
            Self::Slot(p, _) | Self::Piece(p, _) | Self::Mailbox(p) | Self::Probe(p) | Self::Serve(p) | Self::Sink(p, _) => Some(p),
        }
    }
}

/// One RMA piece not yet accepted by the provider; `desc` describes its local memory.
pub(crate) type Piece = fmx_transport::ops::Piece<*mut c_void>;

/// RMA operations: the local side is registered for the operation on
/// FI_MR_LOCAL providers (dropped at completion).
type Operations = fmx_transport::ops::Operations<Local<Mr>, *mut c_void>;

/// How the libfabric endpoint reaches a peer.
pub struct Link {
    /// Its address in our address vector.
    addr: sys::fi_addr_t,
    /// A mailbox write toward the peer is in flight: its source word must not change.
    mailbox_busy: bool,
}

/// rxm sizes the completion queue of its connections as (receive + transmit
/// depth) × `FI_UNIVERSE_SIZE` (default 256): over verbs that is more than
/// rxe's (and many HCAs') largest CQ, and `fi_enable` fails with EINVAL. A job
/// never connects more peers than it has, so unless the user set it, the
/// universe is the job size. libfabric reads it once, at its first call.
fn size_universe(size: u32) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("FI_UNIVERSE_SIZE").is_none() {
            // Before any libfabric call of this process, and once: no thread reads the
            // environment through libfabric yet.
            std::env::set_var("FI_UNIVERSE_SIZE", size.max(2).to_string());
        }
    });
}

/// Our endpoint exists and its receive slots are posted; publish
/// [`OfiSetup::address`] through the bootstrap, then [`OfiSetup::connect`].
pub struct OfiSetup {
    cfg: OfiConfig,
    ep: OfiEndpoint,
}

fn anon(bytes: usize) -> Result<MmapMut, TransportError> {
    anonymous(bytes, 8, "map libfabric buffers")
}

impl OfiSetup {
    /// Chooses the provider, opens the endpoint, and posts the receive slots.
    pub fn create(cfg: OfiConfig) -> Result<Self, TransportError> {
        let credit = cfg.eager.credits()?;
        size_universe(cfg.eager.size);
        // RMA when asked for and offered; else tagged messages carry one-sided operations.
        let (info, rma) = match cfg.rma.then(|| Info::query(cfg.provider.as_deref(), cfg.domain.as_deref(), true)) {
            Some(Ok(i)) => (i, true),
            _ => (Info::query(cfg.provider.as_deref(), cfg.domain.as_deref(), false)?, false),
        };
        let provider = info.provider();
        let peers = cfg.eager.size.saturating_sub(1);
        // Lazily a first message from a rank not yet connected lands in any
        // posted slot: a few are set apart for those (the grants of the
        // connections follow at first contact).
        let first_contacts = if cfg.eager.lazy() { FIRST_CONTACT_SLOTS } else { 0 };
        let recv_slots = cfg.eager.receive_slots() + first_contacts;
        let (rx_size, _) = info.queue_sizes();
        if recv_slots > rx_size {
            return Err(TransportError::Setup {
                what: format!(
                    "{recv_slots} receive slots ({} eager + {CTRL_SLOTS} control per peer) exceed provider {provider}'s receive \
                     queue of {rx_size}: lower FMX_POOL_SLOTS",
                    cfg.eager.pool
                ),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        {
            let (fabric, domain) = info.fabric_and_domain();
            tracing::info!(
                rank = cfg.eager.rank,
                "provider {provider}, fabric {fabric}, domain {domain}, rma {rma}, mr_mode {:?}",
                info.mr_mode()
            );
        }
        let inject = info.inject_size();
        let max_msg = info.max_msg_size();
        if cfg.eager.slot_bytes > max_msg {
            return Err(TransportError::Setup {
                what: format!("FMX_SLOT_BYTES={} exceeds provider {provider}'s largest message ({max_msg} bytes)", cfg.eager.slot_bytes),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        if !rma && inject < tagged::CTRL_BYTES {
            return Err(TransportError::Setup {
                what: format!(
                    "provider {provider} has neither RMA nor an inject size of {} bytes for control messages",
                    tagged::CTRL_BYTES
                ),
                source: std::io::Error::from(std::io::ErrorKind::Unsupported),
            });
        }
        // Control receives without RMA: generous, since a message arriving with none
        // posted waits in the provider's unexpected queue (which shm 1.17 mishandles).
        let ctrl_slots =
            if rma { 0 } else { cfg.ctrl_slots.unwrap_or(4 * peers as usize + 64).min(rx_size.saturating_sub(recv_slots)).max(1) };
        let provider_name = provider.clone();
        let name = cfg
            .job
            .as_deref()
            .filter(|_| provider == crate::names::FILE_NAMED_PROVIDER)
            .map(|job| crate::names::endpoint_name(job, cfg.eager.rank));
        let fabric = Arc::new(Fabric::open(info, recv_slots + ctrl_slots + TX_CONTEXTS + 64, cfg.eager.size as usize, name.as_deref())?);
        let registrations = Arc::new(AtomicU64::new(0));
        let recv = anon(recv_slots * cfg.eager.slot_bytes)?;
        let recv_mr = if fabric.mr_mode.local {
            registrations.fetch_add(1, Ordering::Relaxed);
            Some(fabric.register(recv.as_ptr(), recv.len(), u64::from(sys::FI_RECV))?)
        } else {
            None
        };
        let mailbox = anon(8 * cfg.eager.size as usize)?;
        let mailbox_mr = fabric.register(mailbox.as_ptr(), mailbox.len(), u64::from(sys::FI_REMOTE_WRITE | sys::FI_REMOTE_READ))?;
        // Our outgoing mailbox words, then one word per peer for probe reads.
        let outbox = anon(16 * cfg.eager.size as usize)?;
        let outbox_mr = fabric.register(outbox.as_ptr(), outbox.len(), u64::from(sys::FI_WRITE | sys::FI_READ))?;
        registrations.fetch_add(2, Ordering::Relaxed);
        let hook = OfiHook { fabric: fabric.clone(), count: registrations.clone() };
        let send_pool = Pool::new(
            PoolConfig { buf_size: cfg.eager.slot_bytes, bufs_per_chunk: 64, max_chunks: SEND_BUFS / 64, huge_pages: HugePages::Never },
            hook,
        );
        let ctrl_recv = anon(ctrl_slots * tagged::CTRL_BYTES)?;
        let ctrl_mr = if fabric.mr_mode.local && ctrl_slots > 0 {
            registrations.fetch_add(1, Ordering::Relaxed);
            Some(fabric.register(ctrl_recv.as_ptr(), ctrl_recv.len(), u64::from(sys::FI_RECV))?)
        } else {
            None
        };
        let ctx: Box<[Ctx]> = (0..recv_slots + ctrl_slots + TX_CONTEXTS).map(|_| Ctx { fi: sys::fi_context2::default() }).collect();
        let ep = OfiEndpoint {
            piece: cfg.piece.min(max_msg),
            inject: inject.min(256),
            provider,
            arrived: VecDeque::new(),
            unposted: VecDeque::new(),
            ops: Operations::default(),
            // A provider that wants local descriptors registers with a
            // device (verbs;ofi_rxm: ibv_reg_mr), so small plain slices are
            // copied as verbs does; tcp and shm register in software.
            memory: Memory::new(
                BounceHook(fabric.clone(), registrations.clone()),
                if fabric.mr_mode.local { DEFAULT_BOUNCE_BYTES } else { 0 },
                fabric.mr_mode.local,
            ),
            peer_timeout: cfg.peer_timeout,
            recv_slots,
            ctrl_slots,
            rma,
            split: rma && !STREAM_PROVIDERS.iter().any(|p| provider_name.starts_with(p)),
            emulated: HashMap::new(),
            emulated_ids: HashMap::new(),
            deferred: VecDeque::new(),
            next_tag: 1,
            ctrl_recv,
            ctrl_mr,
            tx: (0..TX_CONTEXTS).map(|_| Tx::Free).collect(),
            tx_free: (0..TX_CONTEXTS).rev().collect(),
            send_pool,
            recv_mr,
            mailbox_mr,
            outbox_mr,
            outbox,
            ctx,
            fabric,
            st: RdmaState::new(&cfg.eager, credit, registrations, mailbox, recv),
        };
        let mut ep = ep;
        let reserve = ep.st.grants.reserve(first_contacts);
        ep.post_fresh(u32::MAX, reserve)?;
        for i in 0..ctrl_slots {
            ep.post_ctrl_recv(i).map_err(|rc| crate::fabric::fail("post a control receive (fi_trecv)", &ep.provider, rc))?;
        }
        Ok(Self { cfg, ep })
    }

    /// The provider this process chose.
    pub fn provider(&self) -> &str {
        &self.ep.provider
    }

    /// What peers need to reach us.
    pub fn address(&self) -> Result<Vec<u8>, TransportError> {
        Ok(Address {
            pid: std::process::id(),
            host: host_identity(),
            mailbox_addr: self.ep.mailbox_mr.remote_addr(self.ep.mailbox_mr.base),
            mailbox_key: self.ep.mailbox_mr.key,
            provider: self.ep.provider.clone(),
            lazy: self.ep.st.conns.lazy(),
            name: self.ep.fabric.name()?,
        }
        .encode())
    }

    /// Inserts every peer into the address vector. `addresses[r]` is rank r's [`OfiSetup::address`].
    pub fn connect(self, addresses: &[Vec<u8>]) -> Result<OfiEndpoint, TransportError> {
        let cfg = &self.cfg;
        let mut ep = self.ep;
        if addresses.len() != cfg.eager.size as usize {
            return Err(TransportError::Setup {
                what: format!("libfabric connect got {} addresses for a job of {}", addresses.len(), cfg.eager.size),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let decoded = addresses.iter().enumerate().map(|(r, b)| Address::decode(r as u32, b)).collect::<Result<Vec<_>, _>>()?;
        if let Some((r, a)) = decoded.iter().enumerate().find(|(_, a)| a.provider != ep.provider) {
            return Err(TransportError::Setup {
                what: format!(
                    "rank {r} chose libfabric provider {:?} but rank {} chose {:?}: every rank must use the same one \
                     (set FMX_OFI_PROVIDER or FI_PROVIDER for the whole job)",
                    a.provider, cfg.eager.rank, ep.provider
                ),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let lazy = ep.st.conns.lazy();
        if let Some((r, _)) = decoded.iter().enumerate().find(|(_, a)| a.lazy != lazy) {
            return Err(mode_mismatch(r as PeerId, cfg.eager.rank, lazy));
        }
        let names: Vec<&[u8]> = decoded.iter().map(|a| a.name.as_slice()).collect();
        let fi_addrs = ep.fabric.insert(&names)?;
        let mine = host_identity();
        ep.st.set_peers(
            decoded
                .iter()
                .zip(fi_addrs)
                .enumerate()
                .map(|(r, (a, addr))| {
                    let r = r as u32;
                    (r != cfg.eager.rank).then(|| Peer {
                        credits: PeerCredits::new(&ep.st.credit, r < cfg.eager.rank),
                        life: PeerLife::new(a.pid, &a.host, &mine),
                        mailbox_addr: a.mailbox_addr + 8 * u64::from(cfg.eager.rank),
                        mailbox_key: a.mailbox_key,
                        link: Link { addr, mailbox_busy: false },
                    })
                })
                .collect(),
        );
        for (peer, slots) in ep.st.take_posts() {
            ep.post_fresh(peer, slots)?;
        }
        if !ep.st.conns.lazy() {
            ep.connect_all(CONNECT_TIMEOUT)?;
            // Usable only now: every peer has answered.
            ep.st.connected_now();
        }
        Ok(ep)
    }
}

/// The libfabric endpoint.
///
/// Field order is drop order: regions go before the memory they cover, and
/// the fabric objects (endpoint, queues, domain) close last, once every
/// region that holds them is gone.
pub struct OfiEndpoint {
    piece: usize,
    inject: usize,
    provider: String,
    /// Receive completions read but not yet handed to a sink: (slot, bytes, sender).
    arrived: VecDeque<(usize, usize, PeerId)>,
    /// Slots consumed whose repost the provider refused for now: (slot, sender, class).
    unposted: VecDeque<(usize, PeerId, Class)>,
    ops: Operations,
    /// Owned registrations, exposures, bounce buffers.
    memory: Memory<BounceHook>,
    /// See [`OfiConfig::peer_timeout`].
    peer_timeout: Duration,
    recv_slots: usize,
    /// Control receives (credits, GET, PUT) when the provider has no RMA; 0 with RMA.
    ctrl_slots: usize,
    rma: bool,
    /// Move large messages in two halves at once (see `split_rendezvous`).
    split: bool,
    /// Buffers exposed without RMA, by key.
    emulated: HashMap<u64, tagged::Exposure>,
    /// Emulated pieces in flight: id -> op.
    emulated_ids: HashMap<u64, u64>,
    /// Serves and sinks waiting for room in the provider.
    deferred: VecDeque<tagged::Deferred>,
    /// Ids of emulated pieces and keys of emulated exposures.
    next_tag: u64,
    ctrl_recv: MmapMut,
    ctrl_mr: Option<Mr>,
    tx: Vec<Tx>,
    tx_free: Vec<usize>,
    send_pool: Pool<OfiHook>,
    recv_mr: Option<Mr>,
    mailbox_mr: Mr,
    outbox_mr: Mr,
    outbox: MmapMut,
    /// Contexts of posted operations: receive slots, control receives, then transmit contexts.
    /// What every RDMA endpoint keeps alike. Its memory (receive slots,
    /// mailbox) is unmapped after the regions covering it are closed and
    /// before the domain is: libfabric's registration cache watches munmap
    /// and must not be called into once its domain is gone.
    st: RdmaState<Link>,
    ctx: Box<[Ctx]>,
    fabric: Arc<Fabric>,
}

// SAFETY: the raw pointers (pending pieces) point into buffers the core lends
// to the endpoint until the operation completes; the endpoint is driven by
// one thread at a time.
unsafe impl Send for OfiEndpoint {}

fn posted(rc: isize) -> Result<Posted, i64> {
    match rc {
        0 => Ok(Posted::Yes),
        rc if rc == -(sys::FI_EAGAIN as isize) => Ok(Posted::Again),
        rc => Err(rc as i64),
    }
}

impl OfiEndpoint {
    /// The provider in use (e.g. `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Whether one-sided operations use FI_RMA (else tagged messages carry them).
    pub fn uses_rma(&self) -> bool {
        self.rma
    }

    /// The credit state toward `peer` (for tests and reports).
    pub fn credits(&self, peer: PeerId) -> Option<&PeerCredits> {
        self.st.peers.get(peer as usize).and_then(Option::as_ref).map(|p| &p.credits)
    }

    fn ctx_ptr(&self, i: usize) -> *mut c_void {
        ptr::from_ref(&self.ctx[i]).cast_mut().cast()
    }

    fn ctx_index(&self, p: *mut c_void) -> Option<usize> {
        let base = self.ctx.as_ptr() as usize;
        let off = (p as usize).checked_sub(base)?;
        let i = off / std::mem::size_of::<Ctx>();
        (off % std::mem::size_of::<Ctx>() == 0 && i < self.ctx.len()).then_some(i)
    }

    fn post_recv(&self, slot: usize) -> Result<Posted, i64> {
        let buf = self.st.recv[slot * self.st.slot_bytes..].as_ptr();
        let desc = self.recv_mr.as_ref().map_or(ptr::null_mut(), |m| m.desc);
        // SAFETY: the slot lies in the receive region the endpoint owns (and
        // registered where the provider needs it); its context lives in `ctx`
        // until the endpoint closes.
        let rc = unsafe {
            sys::fmx_fi_trecv(
                self.fabric.ep(),
                buf.cast_mut().cast(),
                self.st.slot_bytes,
                desc,
                sys::FI_ADDR_UNSPEC,
                0,
                RANK_BITS,
                self.ctx_ptr(slot),
            )
        };
        posted(rc)
    }

    /// Posts receive slots for the first time (granted to `peer`).
    fn post_fresh(&self, peer: PeerId, slots: std::ops::Range<usize>) -> Result<(), TransportError> {
        for slot in slots {
            match self.post_recv(slot) {
                Ok(Posted::Yes) => {}
                Ok(Posted::Again) => {
                    return Err(TransportError::Setup {
                        what: format!(
                            "provider {} refused receive slot {slot} (for rank {peer}): its receive queue is full (lower FMX_POOL_SLOTS)",
                            self.provider
                        ),
                        source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
                    })
                }
                Err(rc) => return Err(crate::fabric::fail("post a receive slot (fi_trecv)", &self.provider, rc)),
            }
        }
        Ok(())
    }

    fn mailbox_word(&self, peer: PeerId) -> u64 {
        mailbox::load(&self.st.mailbox, peer as usize)
    }

    fn take_tx(&mut self, what: Tx) -> Option<usize> {
        let i = self.tx_free.pop()?;
        self.tx[i] = what;
        Some(self.tx_base() + i)
    }

    fn tx_base(&self) -> usize {
        self.recv_slots + self.ctrl_slots
    }

    fn give_tx(&mut self, ctx: usize) -> Tx {
        let i = ctx - self.tx_base();
        self.tx_free.push(i);
        std::mem::replace(&mut self.tx[i], Tx::Free)
    }

    fn mark_dead(&mut self, peer: PeerId, reason: String) {
        self.st.mark_dead(peer, reason, false);
    }

    /// Reads every completion the queue holds: arrivals are kept for `poll`,
    /// transmit completions free their resources, failures mark the peer dead.
    fn drain_cq(&mut self) -> Result<(), TransportError> {
        let mut entries = [sys::fi_cq_tagged_entry::default(); CQ_BATCH];
        loop {
            // SAFETY: `entries` has room for CQ_BATCH entries of the queue's (tagged) format.
            let n = unsafe { sys::fmx_fi_cq_read(self.fabric.cq(), entries.as_mut_ptr().cast(), CQ_BATCH) };
            if n == -(sys::FI_EAGAIN as isize) {
                return Ok(());
            }
            if n == -(sys::FI_EAVAIL as isize) {
                self.read_error()?;
                continue;
            }
            if n < 0 {
                return Err(crate::fabric::fail("fi_cq_read", &self.provider, n as i64));
            }
            let mut failed = None;
            for e in &entries[..n as usize] {
                let Some(i) = self.ctx_index(e.op_context) else {
                    return Err(TransportError::Malformed { peer: u32::MAX, what: "completion with an unknown libfabric context" });
                };
                if i < self.recv_slots {
                    self.arrived.push_back((i, e.len, (e.tag & RANK_BITS) as PeerId));
                } else if i < self.tx_base() {
                    // Finish the batch first: its other completions are read only once.
                    if let Err(err) = self.on_ctrl(i - self.recv_slots, (e.tag & RANK_BITS) as PeerId) {
                        failed.get_or_insert(err);
                    }
                } else {
                    self.complete_tx(i, None);
                }
            }
            if let Some(err) = failed {
                return Err(err);
            }
            if (n as usize) < CQ_BATCH {
                return Ok(());
            }
        }
    }

    fn read_error(&mut self) -> Result<(), TransportError> {
        let mut err = sys::fi_cq_err_entry::default();
        // SAFETY: one error entry; the provider fills it (err_data stays owned by the provider).
        let rc = unsafe { sys::fmx_fi_cq_readerr(self.fabric.cq(), &raw mut err, 0) };
        if rc != 1 {
            return Ok(()); // raced with nothing: the next read reports it
        }
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: `buf` has 256 bytes; fi_cq_strerror returns a NUL-terminated string (ours or the provider's).
        let prov = unsafe {
            let s = sys::fmx_fi_cq_strerror(self.fabric.cq(), err.prov_errno, err.err_data, buf.as_mut_ptr(), buf.len());
            if s.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        let status = format!("{} (provider error {}: {prov})", strerror(i64::from(err.err)), err.prov_errno);
        let Some(i) = self.ctx_index(err.op_context) else {
            // No context of ours: an inject (which has none) failed. Its peer is
            // unknown here; the next operation toward it reports the failure.
            tracing::debug!(rank = self.st.rank, "failure without a context ({:?}): {status}", err.op_context);
            return Ok(());
        };
        if i < self.tx_base() {
            // A receive failed (canceled at close, or truncated): the sender is in the tag.
            let peer = (err.tag & RANK_BITS) as PeerId;
            tracing::debug!(rank = self.st.rank, "receive from peer {peer} failed: {status}");
            if err.err == sys::FI_ECANCELED as i32 {
                return Ok(());
            }
            return Err(TransportError::Completion { op: "receive", peer, device: self.provider.clone(), status });
        }
        self.complete_tx(i, Some(status));
        Ok(())
    }

    fn complete_tx(&mut self, ctx: usize, failure: Option<String>) {
        let what = self.give_tx(ctx);
        let peer = match &what {
            Tx::Free => return,
            Tx::Slot(p, _) | Tx::Piece(p, _) | Tx::Mailbox(p) | Tx::Probe(p) | Tx::Serve(p) | Tx::Sink(p, _) => *p,
        };
        if let Some(status) = &failure {
            tracing::debug!(rank = self.st.rank, "operation toward peer {peer} failed: {status}");
            self.mark_dead(peer, format!("libfabric provider {} reported: {status}", self.provider));
        }
        match what {
            Tx::Free => {}
            Tx::Slot(_, lease) => self.send_pool.release(lease),
            Tx::Piece(_, id) => {
                let error =
                    failure.map(|status| TransportError::Completion { op: "RMA operation", peer, device: self.provider.clone(), status });
                self.ops.piece_done(id, error);
            }
            Tx::Mailbox(_) => {
                if let Some(Some(p)) = self.st.peers.get_mut(peer as usize) {
                    p.link.mailbox_busy = false;
                }
            }
            Tx::Probe(_) => {
                if let Some(Some(p)) = self.st.peers.get_mut(peer as usize) {
                    p.life.probe_answered();
                }
            }
            Tx::Serve(_) => {}
            Tx::Sink(_, key) => self.sink_done(key),
        }
    }

    /// Puts `word` into `peer`'s mailbox: an `fi_write` (one in flight per
    /// peer, so the source word never changes under the provider), or without
    /// RMA a control message the peer stores there. `Again`: no room now.
    fn send_mailbox_word(&mut self, peer: PeerId, word: u64) -> Result<Posted, String> {
        if !self.rma {
            return self.send_credit_word(peer, word).map_err(|e| e.to_string());
        }
        let Some(ctx) = self.take_tx(Tx::Mailbox(peer)) else { return Ok(Posted::Again) };
        let p = self.st.peers[peer as usize].as_ref().expect("a peer");
        let (addr, key, dest) = (p.mailbox_addr, p.mailbox_key, p.link.addr);
        let src = &mut self.outbox[8 * peer as usize..][..8];
        src.copy_from_slice(&word.to_le_bytes());
        // SAFETY: the source word lies in the registered outbox, left
        // unchanged until this write completes (mailbox_busy); the context
        // lives in `ctx` until its completion.
        let rc =
            unsafe { sys::fmx_fi_write(self.fabric.ep(), src.as_ptr().cast(), 8, self.outbox_mr.desc, dest, addr, key, self.ctx_ptr(ctx)) };
        match posted(rc) {
            Ok(Posted::Yes) => {
                self.st.peers[peer as usize].as_mut().expect("a peer").link.mailbox_busy = true;
                Ok(Posted::Yes)
            }
            Ok(Posted::Again) => {
                self.give_tx(ctx);
                Ok(Posted::Again)
            }
            Err(rc) => {
                self.give_tx(ctx);
                Err(format!("fi_write of credits failed: {}", strerror(rc)))
            }
        }
    }

    /// Reads completions only (emulated operations waiting for room).
    fn progress_only(&mut self) -> Result<(), TransportError> {
        self.drain_cq()
    }

    /// A local descriptor for `[addr, addr+len)`: a registered buffer of the
    /// core, nothing where the provider needs none, else a registration for
    /// this operation.
    fn register_per_op(&mut self, peer: PeerId, addr: *const u8, len: usize, access: u64) -> Result<Mr, TransportError> {
        self.st.count_per_operation();
        self.fabric.register(addr, len, access).map_err(|e| TransportError::Io {
            op: "fi_mr_reg",
            peer,
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// Writes our first mailbox word (the totals so far) to every peer and
    /// makes progress until every peer's word has arrived: connection-based
    /// providers (rxm) connect now, while every rank is making progress in
    /// setup. Later, a first send to a peer busy elsewhere would wait for its
    /// progress to accept the connection. Each rank leaves once it has heard
    /// from all, so nobody waits for a rank that already left.
    fn connect_all(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let deadline = Instant::now() + timeout;
        let mut todo: Vec<PeerId> = (0..self.st.size).filter(|&r| r != self.st.rank).collect();
        loop {
            todo.retain(|&peer| {
                let (d, k) = self.st.peers[peer as usize].as_ref().expect("a peer").credits.totals();
                match self.send_mailbox_word(peer, mailbox::encode(d, k, false)) {
                    Ok(Posted::Yes) => false,
                    Ok(Posted::Again) => true,
                    Err(reason) => {
                        self.mark_dead(peer, format!("connecting failed: {reason}"));
                        false
                    }
                }
            });
            self.drain_cq()?;
            if let Some((r, why)) =
                self.st.peers.iter().enumerate().find_map(|(r, p)| p.as_ref()?.life.failure().map(|d| (r, d.to_owned())))
            {
                return Err(TransportError::PeerGone { peer: r as PeerId, reason: format!("while connecting: {why}") });
            }
            let silent: Vec<PeerId> =
                (0..self.st.size).filter(|&r| r != self.st.rank && mailbox::decode(self.mailbox_word(r)).is_none()).collect();
            if todo.is_empty() && silent.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TransportError::Setup {
                    what: format!(
                        "connecting over libfabric provider {}: after {timeout:?} ranks {silent:?} had not reached us{}",
                        self.provider,
                        if todo.is_empty() { String::new() } else { format!(" and we could not start toward ranks {todo:?}") }
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                });
            }
            std::thread::yield_now();
        }
    }

    /// Retries receive slots whose repost was refused, then returns their credits.
    fn repost_unposted(&mut self) -> Result<(), TransportError> {
        while let Some(&(slot, peer, class)) = self.unposted.front() {
            match self.post_recv(slot) {
                Ok(Posted::Yes) => {
                    self.unposted.pop_front();
                    self.st.released(peer, class);
                }
                Ok(Posted::Again) => return Ok(()),
                Err(rc) => {
                    return Err(TransportError::Io {
                        op: "repost a receive slot (fi_trecv)",
                        peer,
                        source: std::io::Error::other(strerror(rc)),
                    })
                }
            }
        }
        Ok(())
    }

    /// Sends the encoded header `hb` and `payload`: injected when small, else from a pooled buffer.
    fn post_eager(&mut self, peer: PeerId, hb: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<SendOutcome, TransportError> {
        let len = HEADER_BYTES + payload.len();
        let dest = self.st.peers.alive(peer)?.link.addr;
        let tag = u64::from(self.st.rank);
        if len <= self.inject {
            let mut buf = [0u8; 256];
            buf[..HEADER_BYTES].copy_from_slice(hb);
            buf[HEADER_BYTES..len].copy_from_slice(payload);
            // SAFETY: fi_tinject copies the `len` bytes of `buf` before it returns.
            let rc = unsafe { sys::fmx_fi_tinject(self.fabric.ep(), buf.as_ptr().cast(), len, dest, tag) };
            // rxm refuses injects while it connects to the peer, but queues sends: fall through to one.
            if rc != -(sys::FI_EAGAIN as isize) {
                return self.after_send(peer, rc);
            }
        }
        let lease = match self.send_pool.lease()? {
            Some(l) => l,
            None => return Ok(SendOutcome::Backpressure),
        };
        let Some(ctx) = self.take_tx(Tx::Free) else {
            self.send_pool.release(lease);
            return Ok(SendOutcome::Backpressure);
        };
        let b = self.send_pool.buf_mut(&lease);
        b[..HEADER_BYTES].copy_from_slice(hb);
        b[HEADER_BYTES..len].copy_from_slice(payload);
        let src = b.as_ptr();
        let desc = self.send_pool.handle(&lease).as_ref().map_or(ptr::null_mut(), |m| m.desc);
        // SAFETY: the pooled buffer stays leased (and registered where needed)
        // until this send completes; the context lives until then.
        let rc = unsafe { sys::fmx_fi_tsend(self.fabric.ep(), src.cast(), len, desc, dest, tag, self.ctx_ptr(ctx)) };
        let out = self.after_send(peer, rc);
        if matches!(out, Ok(SendOutcome::Sent)) {
            let base = self.tx_base();
            self.tx[ctx - base] = Tx::Slot(peer, lease);
        } else {
            self.give_tx(ctx);
            self.send_pool.release(lease);
        }
        out
    }

    fn after_send(&mut self, peer: PeerId, rc: isize) -> Result<SendOutcome, TransportError> {
        match posted(rc) {
            Ok(Posted::Yes) => Ok(SendOutcome::Sent),
            Ok(Posted::Again) => Ok(SendOutcome::Backpressure),
            Err(rc) => {
                let reason = format!("libfabric provider {} refused a send: {}", self.provider, strerror(rc));
                self.mark_dead(peer, reason.clone());
                Err(TransportError::PeerGone { peer, reason })
            }
        }
    }
}

impl Sealed for OfiEndpoint {}

impl RdmaDevice for OfiEndpoint {
    type Link = Link;
    type Desc = *mut c_void;
    type Mr = Mr;
    type Hook = BounceHook;

    fn operations(&mut self, _: Core) -> &mut Operations {
        &mut self.ops
    }

    fn memory(&mut self, _: Core) -> &mut Memory<BounceHook> {
        &mut self.memory
    }

    fn register(&mut self, _: Core, peer: PeerId, ptr: *const u8, len: usize, access: Access) -> Result<Mr, TransportError> {
        let access = match access {
            Access::ReadInto => sys::FI_READ,
            Access::WriteFrom => sys::FI_WRITE,
            Access::PeerReads => sys::FI_REMOTE_READ,
            Access::PeerWrites => sys::FI_REMOTE_WRITE,
            Access::Any => return self.fabric.register(ptr, len, ALL_ACCESS),
        };
        self.fabric.register(ptr, len, u64::from(access)).map_err(|e| TransportError::Io {
            op: "fi_mr_reg",
            peer,
            source: std::io::Error::other(e.to_string()),
        })
    }

    fn max_piece(&self) -> usize {
        self.piece
    }

    /// An `fi_read`/`fi_write`, or its emulation by tagged messages without RMA.
    fn post_piece(&mut self, _: Core, pc: &Piece) -> Result<Posted, TransportError> {
        let dest = self.st.peers.alive(pc.peer)?.link.addr;
        let Some(ctx) = self.take_tx(Tx::Piece(pc.peer, pc.op)) else { return Ok(Posted::Again) };
        let outcome = if self.rma {
            let (ep, local, context) = (self.fabric.ep(), pc.local as *mut c_void, self.ctx_ptr(ctx));
            // SAFETY: `local` is the caller's buffer (lent until poll_ops
            // reports the op), described by `desc` where the provider needs
            // it; the remote range was checked against the peer's key; the
            // context lives until the completion.
            let rc = unsafe {
                if pc.read {
                    sys::fmx_fi_read(ep, local, pc.len, pc.desc, dest, pc.remote_addr, pc.key, context)
                } else {
                    sys::fmx_fi_write(ep, local, pc.len, pc.desc, dest, pc.remote_addr, pc.key, context)
                }
            };
            posted(rc).map_err(|rc| format!("posting an RMA operation failed: {}", strerror(rc)))
        } else {
            self.post_emulated(pc, dest, ctx).map_err(|e| e.to_string())
        };
        if !matches!(outcome, Ok(Posted::Yes)) {
            self.give_tx(ctx);
        }
        outcome.map_err(|reason| {
            self.mark_dead(pc.peer, reason.clone());
            TransportError::PeerGone { peer: pc.peer, reason }
        })
    }

    fn operation_ended(&mut self, _: Core, id: u64) {
        if !self.rma {
            self.emulated_ids.retain(|_, o| *o != id);
        }
    }

    fn before_posting(&mut self, _: Core) -> Result<(), TransportError> {
        if self.rma {
            return Ok(());
        }
        self.retry_emulated()
    }

    fn state_mut(&mut self, _: Core) -> &mut RdmaState<Link> {
        &mut self.st
    }

    fn state(&self) -> &RdmaState<Link> {
        &self.st
    }

    fn send_eager(&mut self, _: Core, peer: PeerId, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<SendOutcome, TransportError> {
        let out = self.post_eager(peer, header, payload);
        if matches!(out, Ok(SendOutcome::Backpressure)) {
            self.drain_cq()?; // make progress for the retry
        }
        out
    }

    fn receive(&mut self, core: Core, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        let mut n = 0;
        self.drain_cq()?;
        while n < max {
            let Some((slot, len, peer)) = self.arrived.pop_front() else { break };
            let a = self.st.arrive(peer, slot as u64, len, "undecodable header in a libfabric receive slot")?;
            if RdmaState::<Link>::for_core(&a) {
                out.push(a);
                n += 1;
            } else {
                self.release_slot(core, a)?;
            }
        }
        self.repost_unposted()?;
        Ok(n)
    }

    fn post_slots(&mut self, _: Core, peer: PeerId, slots: std::ops::Range<usize>) -> Result<(), TransportError> {
        self.post_fresh(peer, slots)
    }

    /// The slot is free again only once reposted: its credit goes back after that.
    fn release_slot(&mut self, _: Core, arrival: Arrival) -> Result<(), TransportError> {
        self.st.unhold(&arrival)?;
        self.unposted.push_back((arrival.slot as usize, arrival.peer, Class::of(arrival.header.kind)));
        self.repost_unposted()
    }

    fn expose_without_rma(&mut self, _: Core, ptr: *mut u8, len: usize, writable: bool) -> Option<Result<RemoteKey, TransportError>> {
        (!self.rma).then(|| self.expose_emulated(ptr, len, writable))
    }

    fn end_exposure_without_rma(&mut self, _: Core, key: &RemoteKey) -> bool {
        if !self.rma {
            self.revoke_emulated(key);
        }
        !self.rma
    }

    /// Closes the endpoint: libfabric then touches none of the buffers its
    /// operations point into, and every operation still in flight reports
    /// failed. Whatever is posted later answers `FI_ECANCELED` (the shim
    /// refuses a closed endpoint). Used when the job is failing: the shm
    /// provider never completes a read from a killed peer.
    fn abandon_operations(&mut self, _: Core, why: &str) -> bool {
        self.fabric.close_endpoint();
        let device = &self.provider;
        self.ops.abandon_all(|peer| TransportError::Completion {
            op: "RMA operation",
            peer,
            device: device.clone(),
            status: format!("abandoned: the endpoint was closed ({why})"),
        });
        true
    }

    /// Halves in parallel where the provider moves a read and a write at once
    /// (verbs;ofi_rxm on rxe: a 1 MiB ping-pong took 9.3 ms split, 19.2 ms
    /// whole), one read where both queue on one byte stream (tcp: 185 us split,
    /// 158 us whole) and without RMA (each half costs control messages).
    fn splits_rendezvous(&self) -> bool {
        self.split
    }

    fn large_path(&self) -> String {
        if self.rma {
            format!("fi_read of the sender's buffer (libfabric {})", self.provider)
        } else {
            format!("GET requests and tagged messages (libfabric {} without FI_RMA)", self.provider)
        }
    }

    fn progress(&mut self, _: Core) -> Result<(), TransportError> {
        self.drain_cq()
    }

    /// An 8-byte `fi_write` of the word into the peer's mailbox (one in
    /// flight per peer), needing no credit.
    fn return_credits(&mut self, _: Core, all: bool) -> Result<(), TransportError> {
        self.st.explicit_due = false;
        for peer in self.st.owed_returns(all) {
            if self.st.peers[peer as usize].as_ref().is_some_and(|p| p.link.mailbox_busy) {
                self.st.explicit_due = true; // the newer total goes once the last one has left
                continue;
            }
            let saved = self.st.peers[peer as usize].as_ref().expect("a peer").credits.clone();
            let word = self.st.return_word(peer);
            match self.send_mailbox_word(peer, word) {
                Ok(Posted::Yes) => {}
                Ok(Posted::Again) => {
                    self.st.peers[peer as usize].as_mut().expect("a peer").credits = saved;
                    self.st.explicit_due = true;
                }
                Err(reason) => self.mark_dead(peer, reason),
            }
        }
        Ok(())
    }

    fn probe(&mut self, _: Core, peer: PeerId) {
        let Some(Some(p)) = self.st.peers.get(peer as usize) else { return };
        // Without RMA there is nothing to read: send failures report a dead peer elsewhere.
        if !self.rma || !p.life.probe_due() {
            return;
        }
        let (addr, key, dest) = (p.mailbox_addr, p.mailbox_key, p.link.addr);
        let Some(ctx) = self.take_tx(Tx::Probe(peer)) else { return };
        let dst = self.outbox[8 * (self.st.size + peer) as usize..].as_mut_ptr();
        // SAFETY: the destination word lies in the registered outbox (second
        // half: probe words), used only by this probe until it completes.
        let rc = unsafe { sys::fmx_fi_read(self.fabric.ep(), dst.cast(), 8, self.outbox_mr.desc, dest, addr, key, self.ctx_ptr(ctx)) };
        let outcome = posted(rc);
        if matches!(outcome, Ok(Posted::Yes)) {
            self.st.peers[peer as usize].as_mut().expect("a peer").life.probe_posted();
            return;
        }
        self.give_tx(ctx);
        match outcome {
            Err(rc) => self.mark_dead(peer, format!("probe read could not be posted: {}", strerror(rc))),
            // rxm answers EAGAIN for ever once a peer's connection is gone and
            // reconnecting fails; with nothing of ours in flight toward the
            // peer that is not our own backlog.
            _ if !self.tx.iter().any(|t| t.peer() == Some(peer)) => {
                let refused = self.st.peers[peer as usize].as_mut().expect("a peer").life.probe_refused();
                if refused >= self.peer_timeout {
                    let why = format!(
                        "unreachable: provider {} refused every operation toward it for {} s (FMX_OFI_PEER_TIMEOUT) with nothing in flight",
                        self.provider,
                        refused.as_secs()
                    );
                    self.mark_dead(peer, why);
                }
            }
            _ => {}
        }
    }

    fn words_in_flight(&mut self, _: Core) -> bool {
        self.st.peers.iter().flatten().any(|p| p.life.failure().is_none() && p.link.mailbox_busy)
    }
}

/// At close, how long completions are read at most, and how long none may
/// come before the endpoint closes (see `Drop for OfiEndpoint`).
const CLOSE_DRAIN_MAX: Duration = Duration::from_millis(200);
const CLOSE_DRAIN_QUIET: Duration = Duration::from_millis(30);

impl Drop for OfiEndpoint {
    fn drop(&mut self) {
        // libfabric 1.17's rxm, closing a connection, reposts its own
        // receive buffers into a message endpoint it may have closed already
        // (a crash in fi_close, as ofiwg/libfabric#11828): over verbs;ofi_rxm
        // with connections made on demand it took 7 of 25 two-rank jobs at
        // exit. Reading completions until the peers' last traffic has landed
        // leaves it nothing to repost.
        if self.provider.contains("rxm") {
            let (start, mut quiet) = (Instant::now(), Instant::now());
            while start.elapsed() < CLOSE_DRAIN_MAX && quiet.elapsed() < CLOSE_DRAIN_QUIET {
                let before = (self.arrived.len(), self.tx_free.len());
                if self.drain_cq().is_err() {
                    break;
                }
                if (self.arrived.len(), self.tx_free.len()) != before {
                    quiet = Instant::now();
                }
                std::thread::yield_now();
            }
        }
        // The endpoint first: closing it cancels what is still posted into
        // our slots and contexts; regions and the domain close after.
        self.fabric.close_endpoint();
        self.memory.clear();
        self.emulated.clear();
        self.ops.clear();
    }
}
