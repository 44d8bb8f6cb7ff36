//! The shared-memory endpoint: one segment of our own, the peers' mapped.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use fmx_transport::credit::{Class, CreditConfig, Gate, PeerCredits};
use fmx_transport::{
    Arrival, Endpoint, MsgHeader, MsgKind, OpStatus, PeerId, PeerState, ReceiveMemory, RemoteKey, SendOutcome, TransportError,
};

use crate::cma;
use crate::layout::{state, Layout, CTRL_SLOTS, OWN_SLOTS, RELEASED_WORD, SWITCH_WORD};
use crate::ring::{held_payload, RxRing, TxRing};
use crate::segment::{segment_path, shm_dir, validate_job_id, Segment};
use crate::staged::{self, Staged};
use fmx_transport::liveness::PeerWatch;

/// Default eager pool per process, in slots (`P`), shared by all peers.
pub const DEFAULT_POOL_SLOTS: u32 = 64;
/// Default bytes per slot: eager messages up to this minus 40 bytes of header;
/// larger ones move with `process_vm_readv`.
pub const DEFAULT_SLOT_BYTES: usize = 16 << 10;
/// Default newcomer credits (`c0`): slots of its slice a peer may use before reallocation.
pub const DEFAULT_NEWCOMER_CREDITS: u32 = 2;

/// How to build the endpoint.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Job id (names the segment files).
    pub job: String,
    /// Our index.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
    /// Eager pool slots (`P`), divided evenly among the peers.
    pub pool: u32,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// Newcomer credits (`c0`).
    pub newcomer: u32,
    /// Owed credits that trigger an explicit credit message (`None`: half the slice).
    pub threshold: Option<u32>,
    /// Directory of the segment files.
    pub dir: PathBuf,
    /// Try cross-memory attach for large messages (`FMX_SHM_CMA=0`: never,
    /// copy through the segments as where the kernel refuses it).
    pub cma: bool,
    /// The number in each rank's segment file name, by index: the index
    /// itself, or, when this endpoint serves one node of a larger job, the
    /// rank in that job (so that nodes sharing a `/dev/shm` never collide).
    pub file_ids: Vec<u32>,
}

impl ShmConfig {
    /// Defaults, overridden by `FMX_SHM_POOL_SLOTS`, `FMX_SHM_SLOT_BYTES` (or the
    /// names every transport reads, `FMX_POOL_SLOTS`, `FMX_SLOT_BYTES`),
    /// `FMX_NEWCOMER_CREDITS`, `FMX_CREDIT_THRESHOLD` and `FMX_SHM_DIR`.
    pub fn from_env(job: &str, rank: u32, size: u32) -> Result<Self, TransportError> {
        use fmx_transport::settings::{env_limited as num, limits};
        Ok(Self {
            job: job.to_owned(),
            rank,
            size,
            pool: num("FMX_SHM_POOL_SLOTS", limits::POOL_SLOTS)?
                .or(num("FMX_POOL_SLOTS", limits::POOL_SLOTS)?)
                .map_or(DEFAULT_POOL_SLOTS, |n| n as u32),
            slot_bytes: num("FMX_SHM_SLOT_BYTES", limits::SLOT_BYTES)?
                .or(num("FMX_SLOT_BYTES", limits::SLOT_BYTES)?)
                .unwrap_or(DEFAULT_SLOT_BYTES),
            newcomer: num("FMX_NEWCOMER_CREDITS", limits::NEWCOMER_CREDITS)?.map_or(DEFAULT_NEWCOMER_CREDITS, |n| n as u32),
            threshold: num("FMX_CREDIT_THRESHOLD", limits::CREDIT_THRESHOLD)?.map(|n| n as u32),
            dir: shm_dir(),
            cma: fmx_transport::settings::env_number("FMX_SHM_CMA")?.is_none_or(|v| v != 0),
            file_ids: (0..size).collect(),
        })
    }

    /// The path of index `r`'s segment file.
    pub fn segment_file(&self, r: u32) -> PathBuf {
        segment_path(&self.dir, &self.job, self.file_ids.get(r as usize).copied().unwrap_or(r))
    }

    fn layout(&self) -> Layout {
        Layout::new(self.size, self.pool, self.slot_bytes)
    }

    fn credits(&self) -> Result<CreditConfig, TransportError> {
        CreditConfig::for_transport(self.pool, self.layout().peers(), self.newcomer, self.threshold, CTRL_SLOTS, "FMX_SHM_POOL_SLOTS")
    }
}

/// Our segment exists; the peers' are not mapped yet. Publish [`ShmSetup::address`]
/// through the bootstrap, then [`ShmSetup::connect`] with everyone's.
pub struct ShmSetup {
    cfg: ShmConfig,
    credit: CreditConfig,
    own: Segment,
}

impl ShmSetup {
    /// Creates our segment file, and lets the job's processes attach to ours
    /// for single-copy transfers (Yama's `ptrace_scope=1`).
    pub fn create(cfg: ShmConfig) -> Result<Self, TransportError> {
        validate_job_id(&cfg.job)?;
        cma::allow_peers();
        let credit = cfg.credits()?;
        if cfg.file_ids.len() != cfg.size as usize {
            return Err(TransportError::Setup {
                what: format!("shm got file ids for {} ranks in a world of {}", cfg.file_ids.len(), cfg.size),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let own = Segment::create(cfg.segment_file(cfg.rank), cfg.rank, cfg.layout())?;
        Ok(Self { cfg, credit, own })
    }

    /// What peers need to reach us: our pid (4 bytes, little-endian), and an
    /// address in our memory they may read one byte of, to learn at connect
    /// whether the kernel lets them attach (8 bytes).
    pub fn address(&self) -> Vec<u8> {
        let mut a = std::process::id().to_le_bytes().to_vec();
        a.extend_from_slice(&(self.own.base() as u64).to_le_bytes());
        a
    }

    /// Maps every peer's segment. `addresses[r]` is rank r's [`ShmSetup::address`].
    pub fn connect(self, addresses: &[Vec<u8>]) -> Result<ShmEndpoint, TransportError> {
        let Self { cfg, credit, own } = self;
        if addresses.len() != cfg.size as usize {
            return Err(TransportError::Setup {
                what: format!("shm connect got {} addresses for a job of {}", addresses.len(), cfg.size),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let layout = cfg.layout();
        let me = cfg.rank;
        let mut peers = Vec::with_capacity(cfg.size as usize);
        let mut pids = Vec::with_capacity(cfg.size as usize);
        let mut attach = Vec::with_capacity(cfg.size as usize);
        for (r, addr) in addresses.iter().enumerate() {
            let r = r as u32;
            let (pid, probe) = match (addr.get(..4), addr.get(4..12)) {
                (Some(p), Some(a)) => {
                    (u32::from_le_bytes(p.try_into().expect("4 bytes")), u64::from_le_bytes(a.try_into().expect("8 bytes")))
                }
                _ => return Err(TransportError::Malformed { peer: r, what: "shm address shorter than 12 bytes" }),
            };
            attach.push(r == me || (cfg.cma && cma::may_attach(r, pid, probe)?));
            if r == me {
                peers.push(None);
            } else {
                let seg = Segment::open(cfg.segment_file(r), r, layout)?;
                if seg.owner_pid() != pid {
                    return Err(TransportError::Setup {
                        what: format!("rank {r}'s segment is owned by pid {} but rank {r} announced pid {pid}", seg.owner_pid()),
                        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
                    });
                }
                peers.push(Some(seg));
            }
            pids.push(pid);
        }
        let own_ring = layout.own_ring();
        Ok(ShmEndpoint {
            rank: me,
            size: cfg.size,
            max_eager: layout.max_payload(),
            max_ctrl: layout.ctrl_ring(0).max_payload(),
            layout,
            credit,
            tx_data: (0..cfg.size).map(|r| TxRing::new(if r == me { own_ring } else { layout.data_ring(r, me) })).collect(),
            tx_ctrl: (0..cfg.size).map(|_| TxRing::new(layout.ctrl_ring(me))).collect(),
            rx_data: (0..cfg.size).map(|r| RxRing::new(if r == me { own_ring } else { layout.data_ring(me, r) })).collect(),
            rx_ctrl: (0..cfg.size).map(|r| RxRing::new(layout.ctrl_ring(r))).collect(),
            credits: (0..cfg.size).map(|r| PeerCredits::new(&credit, r < me)).collect(),
            own_credits: OWN_SLOTS,
            explicit_due: false,
            reallocated: false,
            watches: pids.iter().map(|&p| PeerWatch::new(p)).collect(),
            pids,
            peers,
            own,
            poll_from: 0,
            unlinked: false,
            window_in: vec![credit.slice; cfg.size as usize],
            pending_out: vec![None; cfg.size as usize],
            attach,
            staged: Staged::default(),
        })
    }
}

/// The shared-memory endpoint.
pub struct ShmEndpoint {
    rank: u32,
    size: u32,
    max_eager: usize,
    max_ctrl: usize,
    layout: Layout,
    credit: CreditConfig,
    own: Segment,
    peers: Vec<Option<Segment>>,
    tx_data: Vec<TxRing>,
    tx_ctrl: Vec<TxRing>,
    rx_data: Vec<RxRing>,
    rx_ctrl: Vec<RxRing>,
    credits: Vec<PeerCredits>,
    /// Free slots of the ring to ourselves.
    own_credits: u32,
    /// Something arrived since the last look at explicit credit returns.
    explicit_due: bool,
    reallocated: bool,
    pids: Vec<u32>,
    watches: Vec<PeerWatch>,
    poll_from: u32,
    unlinked: bool,
    /// Each sender's window in our pool as it last switched (the slice until then).
    window_in: Vec<u32>,
    /// A window toward a peer that we switch to once the peer released all we sent.
    pending_out: Vec<Option<u32>>,
    /// Toward which peers cross-memory attach works (probed at connect).
    attach: Vec<bool>,
    /// Reads and serves copied through the segments where it does not.
    staged: Staged,
}

impl ShmEndpoint {
    /// Releases the held slot at `offset` of `peer`'s ring of `class` and
    /// returns the credits of the slots that are free again (in ring order;
    /// messages to ourselves: our own credits). False when it held nothing.
    #[inline]
    fn give_back(&mut self, peer: PeerId, class: Class, offset: usize) -> bool {
        let p = peer as usize;
        let ring = if class == Class::Data { &mut self.rx_data[p] } else { &mut self.rx_ctrl[p] };
        let Some(freed) = ring.release(offset) else { return false };
        if freed == 0 {
            return true;
        }
        if peer == self.rank {
            self.own_credits += freed;
            return true;
        }
        if class == Class::Data {
            // What a sender switching its window waits for.
            let released = ring.released();
            self.own.u64_at(self.layout.grant(peer) + RELEASED_WORD).store(released, Ordering::Release);
        }
        for _ in 0..freed {
            self.credits[p].on_release(class);
        }
        // At once, not at the next poll: the receiver may wait elsewhere now.
        self.return_credits_to(peer);
        true
    }

    /// Removes our segment file once every peer has mapped it (the mappings stay
    /// valid): after this no file is left behind, whatever happens to the job.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            let _ = std::fs::remove_file(self.own.path());
            self.unlinked = true;
        }
    }

    /// The credit state toward `peer` (for tests and reports).
    pub fn credits(&self, peer: PeerId) -> Option<&PeerCredits> {
        self.credits.get(peer as usize).filter(|_| peer != self.rank)
    }

    /// The credit sizing of this job.
    pub fn credit_config(&self) -> CreditConfig {
        self.credit
    }

    fn segment_of(&self, peer: PeerId) -> &Segment {
        self.peers[peer as usize].as_ref().unwrap_or(&self.own)
    }

    fn check_peer(&self, peer: PeerId) -> Result<(), TransportError> {
        if peer < self.size {
            Ok(())
        } else {
            Err(TransportError::NoSuchPeer { peer, size: self.size })
        }
    }

    /// Sends an explicit credit message to every peer that is owed enough: the
    /// cumulative totals, stored into our mailbox in its segment (a newer total
    /// overwrites an unread older one, so this needs no credit itself).
    fn return_credits(&mut self) {
        self.explicit_due = false;
        for p in 0..self.size {
            self.return_credits_to(p);
        }
    }

    /// Writes our cumulative returns into `p`'s mailbox when it is owed enough.
    #[inline]
    fn return_credits_to(&mut self, p: PeerId) {
        if p == self.rank || !self.credits[p as usize].wants_explicit(&self.credit) {
            return;
        }
        let (d, k) = self.credits[p as usize].explicit();
        let seg = self.peers[p as usize].as_ref().expect("a peer's segment");
        seg.u64_at(self.layout.mailbox(self.rank)).store(u64::from(d) | (u64::from(k) << 32), Ordering::Release);
    }

    /// Switches our data window toward `peer` if one is pending and the peer
    /// has released every message we sent it; false while it has not.
    fn switch_ready(&mut self, peer: PeerId) -> bool {
        let p = peer as usize;
        let Some(m) = self.pending_out[p] else { return true };
        let seg = self.peers[p].as_ref().expect("a peer's segment");
        let released = seg.u64_at(self.layout.grant(self.rank) + RELEASED_WORD).load(Ordering::Acquire);
        if released != self.tx_data[p].sent() {
            return false;
        }
        let old = self.tx_data[p].window();
        let word = self.tx_data[p].switch_to(m);
        // Published before the first message placed by the new window.
        seg.u64_at(self.layout.mailbox(self.rank) + SWITCH_WORD).store(word, Ordering::Release);
        self.credits[p].resize(old, self.tx_data[p].window());
        self.pending_out[p] = None;
        true
    }

    /// Follows a window switch `peer` published: reads its messages by the new
    /// window, gives the slots beyond it back to the system, returns what we owe.
    fn follow_switch(&mut self, peer: PeerId) {
        let p = peer as usize;
        let word = self.own.u64_at(self.layout.mailbox(peer) + SWITCH_WORD).load(Ordering::Acquire);
        if word == 0 {
            return;
        }
        if let Some(m) = self.rx_data[p].follow(word) {
            self.window_in[p] = m;
            let ring = self.rx_data[p].ring();
            self.own.release_range(ring.base + m as usize * ring.slot_bytes, (ring.slots - m.min(ring.slots)) as usize * ring.slot_bytes);
            // The peer counts on our returns to pay for the window it lost.
            self.credits[p].set_peer_window(m);
            self.credits[p].flush();
            self.explicit_due = true;
        }
    }

    /// Sends into the ring of `class` (the transport's own pieces travel in
    /// data slots though their kind is a control kind).
    fn send_class(&mut self, peer: PeerId, class: Class, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        self.check_peer(peer)?;
        let max = if class == Class::Data || peer == self.rank { self.max_eager } else { self.max_ctrl };
        if payload.len() > max {
            return Err(TransportError::EagerTooLarge { len: payload.len(), max });
        }
        let p = peer as usize;
        if peer == self.rank {
            if self.own_credits == 0 {
                return Ok(SendOutcome::Backpressure);
            }
            self.own_credits -= 1;
            self.tx_data[p].write(&self.own, header, payload);
            return Ok(SendOutcome::Sent);
        }
        if class == Class::Data && !self.switch_ready(peer) {
            self.read_mailbox(peer);
            return Ok(SendOutcome::Backpressure);
        }
        let mut gate = self.credits[p].try_take(class);
        if gate == Gate::Backpressure {
            // Out of credits: look whether the peer returned some explicitly.
            self.read_mailbox(peer);
            gate = self.credits[p].try_take(class);
        }
        match gate {
            Gate::Go => {}
            Gate::Backpressure => return Ok(SendOutcome::Backpressure),
            Gate::NotAllowed => return Ok(SendOutcome::NotAllowed),
        }
        let c = &mut self.credits[p];
        let mut h = *header;
        (h.credits, h.ctrl_credits) = c.piggyback();
        let seg = self.peers[p].as_ref().expect("a peer's segment");
        let tx = if class == Class::Data { &mut self.tx_data[p] } else { &mut self.tx_ctrl[p] };
        tx.write(seg, &h, payload);
        Ok(SendOutcome::Sent)
    }

    /// Sends what staged copies have waiting (requests, refusals, pieces),
    /// as far as credits allow.
    fn pump_staged(&mut self) -> Result<(), TransportError> {
        while let Some(&(peer, get)) = self.staged.gets.front() {
            let h = staged::header(staged::GET, 0, 0, get.len());
            if self.send_class(peer, Class::Ctrl, &h, &get)? != SendOutcome::Sent {
                break;
            }
            self.staged.gets.pop_front();
        }
        while let Some(&(peer, id)) = self.staged.refusals.front() {
            if self.send_class(peer, Class::Ctrl, &staged::header(staged::REFUSED, id, 0, 0), &[])? != SendOutcome::Sent {
                break;
            }
            self.staged.refusals.pop_front();
        }
        // Serves, round robin; a peer out of credit waits for the next pump.
        let mut blocked: Vec<PeerId> = Vec::new();
        let mut left = self.staged.serves.len();
        while left > 0 {
            let Some(mut s) = self.staged.serves.pop_front() else { break };
            if blocked.contains(&s.peer) {
                self.staged.serves.push_back(s);
                left -= 1;
                continue;
            }
            let n = (s.len - s.sent).min(self.max_eager);
            // SAFETY: `addr..addr+len` lies inside a buffer we exposed (checked when
            // the request arrived) and have not revoked (revoke drops its serves):
            // its owner keeps it alive and unmoved until then (Endpoint::expose).
            let piece = unsafe { std::slice::from_raw_parts((s.addr as usize + s.sent) as *const u8, n) };
            let h = staged::header(staged::PIECE, s.id, s.sent as u64, n);
            if self.send_class(s.peer, Class::Data, &h, piece)? == SendOutcome::Sent {
                s.sent += n;
                if s.sent < s.len {
                    self.staged.serves.push_front(s);
                } else {
                    left -= 1;
                }
            } else {
                blocked.push(s.peer);
                self.staged.serves.push_back(s);
                left -= 1;
            }
        }
        Ok(())
    }

    /// Applies the totals that `peer` left in our mailbox for it.
    fn read_mailbox(&mut self, peer: PeerId) {
        let v = self.own.u64_at(self.layout.mailbox(peer)).load(Ordering::Acquire);
        self.credits[peer as usize].on_credit(v as u16, (v >> 32) as u8);
    }
}

impl Drop for ShmEndpoint {
    /// Drops without announcing a finalize: an endpoint dropped without
    /// `finalize` belongs to a failing process (it panicked), and its peers
    /// must see it as gone when it exits (or hear it from the launcher), not
    /// as a peer that finalized: they would fail naming it, and the ranks
    /// waiting on them naming those, instead of the rank that failed first.
    fn drop(&mut self) {
        self.unlink();
    }
}

/// An [`Arrival`]'s slot: the sender, the ring's class and the slot's offset in our segment.
fn held_slot(peer: PeerId, class: Class, offset: usize) -> u64 {
    assert!(offset < 1 << 32 && peer < 1 << 29, "a segment of 4 GiB or a job of 2^29 ranks");
    (u64::from(peer) << 33) | (u64::from(class == Class::Ctrl) << 32) | offset as u64
}

fn from_held_slot(slot: u64) -> (PeerId, Class, usize) {
    let class = if slot >> 32 & 1 == 1 { Class::Ctrl } else { Class::Data };
    (((slot >> 33) & 0x1fff_ffff) as PeerId, class, (slot & 0xffff_ffff) as usize)
}

impl Endpoint for ShmEndpoint {
    fn local_id(&self) -> PeerId {
        self.rank
    }

    fn num_peers(&self) -> u32 {
        self.size
    }

    fn max_eager(&self) -> usize {
        self.max_eager
    }

    #[inline]
    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        self.send_class(peer, Class::of(header.kind), header, payload)
    }

    fn credit(&mut self, peer: PeerId) -> SendOutcome {
        if peer >= self.size {
            return SendOutcome::Backpressure;
        }
        if peer == self.rank {
            return if self.own_credits > 0 { SendOutcome::Sent } else { SendOutcome::Backpressure };
        }
        if !self.switch_ready(peer) {
            return SendOutcome::Backpressure;
        }
        if self.credits[peer as usize].peek(Class::Data) == Gate::Backpressure {
            self.read_mailbox(peer);
        }
        match self.credits[peer as usize].peek(Class::Data) {
            Gate::Go => SendOutcome::Sent,
            Gate::Backpressure => SendOutcome::Backpressure,
            Gate::NotAllowed => SendOutcome::NotAllowed,
        }
    }

    #[inline]
    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        let mut n = 0;
        let mut failed = None;
        let size = self.size;
        for k in 0..size {
            let peer = (self.poll_from + k) % size;
            let p = peer as usize;
            let own_ring = peer == self.rank;
            if !own_ring {
                self.follow_switch(peer);
            }
            for class in [Class::Ctrl, Class::Data] {
                if own_ring && class == Class::Ctrl {
                    continue;
                }
                while n < max {
                    let ring = if class == Class::Data { &mut self.rx_data[p] } else { &mut self.rx_ctrl[p] };
                    let Some(slot) = ring.peek(&self.own) else { break };
                    let (header, offset, len) = (slot.header, slot.offset, slot.payload.len());
                    let h = match header {
                        Ok(h) => h,
                        Err(_) => {
                            ring.advance();
                            self.give_back(peer, class, offset);
                            return Err(TransportError::Malformed { peer, what: "undecodable header in a shared-memory slot" });
                        }
                    };
                    if !own_ring {
                        self.credits[p].on_receive(h.credits, h.ctrl_credits);
                    }
                    match h.kind {
                        MsgKind::Credit | MsgKind::Internal => {
                            if h.kind == MsgKind::Internal {
                                let ring = if class == Class::Data { &self.rx_data[p] } else { &self.rx_ctrl[p] };
                                let payload = held_payload(&self.own, &ring.ring(), offset, len);
                                if let Err(e) = self.staged.on_message(peer, &h, payload) {
                                    failed.get_or_insert(e);
                                }
                            }
                            let ring = if class == Class::Data { &mut self.rx_data[p] } else { &mut self.rx_ctrl[p] };
                            ring.advance();
                            self.give_back(peer, class, offset);
                        }
                        _ => {
                            let ring = if class == Class::Data { &mut self.rx_data[p] } else { &mut self.rx_ctrl[p] };
                            ring.advance();
                            out.push(Arrival { peer, header: h, slot: held_slot(peer, class, offset), len });
                            n += 1;
                        }
                    }
                }
            }
        }
        self.poll_from = (self.poll_from + 1) % size;
        if self.explicit_due {
            self.return_credits();
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if !self.staged.is_idle() {
            self.pump_staged()?;
        }
        Ok(n)
    }

    #[inline]
    fn payload(&self, arrival: &Arrival) -> &[u8] {
        let (peer, class, offset) = from_held_slot(arrival.slot);
        let ring = match (class, self.rx_data.get(peer as usize), self.rx_ctrl.get(peer as usize)) {
            (Class::Data, Some(r), _) | (Class::Ctrl, _, Some(r)) => r,
            _ => return &[],
        };
        if !ring.holds(offset) {
            return &[]; // not a message this endpoint handed out and still holds
        }
        held_payload(&self.own, &ring.ring(), offset, arrival.len)
    }

    #[inline]
    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError> {
        let (peer, class, offset) = from_held_slot(arrival.slot);
        if (peer as usize) < self.rx_data.len() && self.give_back(peer, class, offset) {
            return Ok(());
        }
        Err(TransportError::Unsupported(format!(
            "releasing a message from rank {peer} that this endpoint does not hold (release each arrival once)"
        )))
    }

    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        let key = RemoteKey { addr: buf.as_ptr() as u64, len: buf.len() as u64, key: 0 };
        if self.attach.iter().any(|&a| !a) {
            // Some peer reads it through us: serve only what is exposed.
            self.staged.exposed.push((key.addr, key.len));
        }
        Ok(key)
    }

    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: our caller made expose_mut's promise, which includes expose's.
        unsafe { self.expose(buf) }
    }

    fn revoke(&mut self, key: &RemoteKey) {
        if !self.staged.exposed.is_empty() {
            self.staged.revoke(key.addr, key.len);
        }
    }

    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        self.check_peer(peer)?;
        let r = remote.slice(peer, 0, local.len() as u64)?;
        if !self.attach[peer as usize] {
            // The caller keeps `local` alive and untouched until poll_ops reports (our contract).
            let id = self.staged.start_read(peer, r.addr, local.as_mut_ptr(), local.len());
            self.pump_staged()?;
            return Ok(OpStatus::Pending(id));
        }
        cma::read_from(peer, self.pids[peer as usize], r.addr, local)?;
        Ok(OpStatus::Done)
    }

    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        self.check_peer(peer)?;
        if !self.attach[peer as usize] {
            return Err(TransportError::Unsupported(format!(
                "a one-sided write to peer {peer}: cross-memory attach is refused toward it (split_rendezvous is off then)"
            )));
        }
        let r = remote.slice(peer, 0, local.len() as u64)?;
        cma::write_to(peer, self.pids[peer as usize], local, r.addr)?;
        Ok(OpStatus::Done)
    }

    fn poll_ops<F>(&mut self, mut done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        // Single-copy operations complete inside their call; staged reads here.
        if !self.staged.reads.is_empty() {
            let gone: Vec<PeerId> = self.staged.reads.values().map(|r| r.peer).filter(|&p| self.watches[p as usize].exited()).collect();
            for p in gone {
                self.staged.fail_peer(p, "its process exited during a staged read");
            }
        }
        let finished = std::mem::take(&mut self.staged.done);
        let n = finished.len();
        for (id, r) in finished {
            done(id, r);
        }
        Ok(n)
    }

    fn abandon(&mut self, why: &str) -> bool {
        // Only this process's own polls copy into a staged read's buffer:
        // forgetting the reads is enough.
        let ids: Vec<u64> = self.staged.reads.keys().copied().collect();
        for id in ids {
            if let Some(r) = self.staged.reads.remove(&id) {
                self.staged.done.push((id, Err(TransportError::PeerGone { peer: r.peer, reason: format!("abandoned: {why}") })));
            }
        }
        true
    }

    fn split_rendezvous(&self) -> bool {
        self.attach.iter().all(|&a| a)
    }

    /// How messages above the eager limit move: one copy (cross-memory
    /// attach), or two through the segments toward peers it is refused for.
    fn large_message_path(&self) -> String {
        let refused = (0..self.size).filter(|&p| !self.attach[p as usize]).count();
        if refused == 0 {
            "single copy (process_vm_readv)".into()
        } else {
            format!("two copies through the shared segments (cross-memory attach refused toward {refused} of {} peers)", self.size - 1)
        }
    }

    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        if peer >= self.size {
            return PeerState::Dead;
        }
        if self.segment_of(peer).state().load(Ordering::Acquire) == state::FINALIZED {
            PeerState::Finalized
        } else if peer != self.rank && self.watches[peer as usize].exited() {
            PeerState::Dead
        } else {
            PeerState::Alive
        }
    }

    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        if self.reallocated {
            return Ok(());
        }
        self.reallocated = true;
        for p in (0..self.size).filter(|&p| p != self.rank) {
            self.credits[p as usize].reallocate(&self.credit);
        }
        self.return_credits();
        Ok(())
    }

    fn receive_memory(&self) -> ReceiveMemory {
        let l = self.layout;
        ReceiveMemory {
            eager_pool: l.pool_bytes(),
            per_peer: l.slice() as usize * l.slot_bytes,
            control: l.ctrl_bytes(),
            first_contact: 0,
            own: OWN_SLOTS as usize * l.slot_bytes,
            eager_resident: (0..self.size).filter(|&s| s != self.rank).map(|s| self.window_in[s as usize] as usize * l.slot_bytes).sum(),
        }
    }

    fn publish_receive_shares(&mut self, weights: &[u64]) -> Result<bool, TransportError> {
        if !self.reallocated || weights.len() != self.size as usize {
            return Ok(false);
        }
        let slice = self.credit.slice;
        let heaviest = (0..self.size).filter(|&s| s != self.rank).map(|s| weights[s as usize]).max().unwrap_or(0);
        for s in (0..self.size).filter(|&s| s != self.rank) {
            let w = weights[s as usize];
            // In-neighbours by weight (at least 2 slots, so one can be in flight
            // while the next is written); everyone else a one-slot window.
            let m = if w == 0 || heaviest == 0 {
                1
            } else {
                (u64::from(slice) * w).div_ceil(heaviest).clamp(u64::from(2.min(slice)), u64::from(slice)) as u32
            };
            self.own.u64_at(self.layout.grant(s)).store(u64::from(m), Ordering::Release);
        }
        Ok(true)
    }

    fn settle_receive_shares(&mut self) -> bool {
        let (me, size) = (self.rank, self.size);
        let mut waiting = false;
        for r in (0..size).filter(|&r| r != me) {
            waiting |= !self.switch_ready(r);
        }
        waiting
    }

    fn adopt_receive_shares(&mut self) {
        for r in (0..self.size).filter(|&r| r != self.rank) {
            let seg = self.peers[r as usize].as_ref().expect("a peer's segment");
            let m = seg.u64_at(self.layout.grant(self.rank)).load(Ordering::Acquire) as u32;
            if m > 0 && m != self.tx_data[r as usize].window() {
                self.pending_out[r as usize] = Some(m);
            }
        }
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        self.own.state().store(state::FINALIZED, Ordering::Release);
        self.unlink();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(job: &str, pool: u32, newcomer: u32) -> (ShmEndpoint, ShmEndpoint, PathBuf) {
        pair_with(job, pool, newcomer, true)
    }

    fn pair_with(job: &str, pool: u32, newcomer: u32, cma: bool) -> (ShmEndpoint, ShmEndpoint, PathBuf) {
        let dir = std::env::temp_dir().join(format!("fmx-shm-test-{job}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = |rank| ShmConfig {
            job: job.into(),
            rank,
            size: 2,
            pool,
            slot_bytes: 256,
            newcomer,
            threshold: Some(1),
            dir: dir.clone(),
            cma,
            file_ids: vec![0, 1],
        };
        let a = ShmSetup::create(cfg(0)).unwrap();
        let b = ShmSetup::create(cfg(1)).unwrap();
        let addrs = vec![a.address(), b.address()];
        let mut a = a.connect(&addrs).unwrap();
        let mut b = b.connect(&addrs).unwrap();
        a.unlink();
        b.unlink();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "unlinked after connect");
        (a, b, dir)
    }

    fn drain(ep: &mut ShmEndpoint) -> Vec<(u32, u64, Vec<u8>)> {
        let mut got = Vec::new();
        ep.poll(usize::MAX, |p, h, d| got.push((p, h.match_bits, d.to_vec()))).unwrap();
        got
    }

    fn eager(bits: u64, data: &[u8]) -> MsgHeader {
        MsgHeader::eager(bits, data.len(), 0)
    }

    #[test]
    fn arrivals_stay_in_their_slots_and_credits_come_back_in_ring_order() {
        let (mut a, mut b, dir) = pair("held", 8, 2);
        for i in 0..2u8 {
            assert_eq!(b.try_send(0, &eager(u64::from(i), &[i; 40]), &[i; 40]).unwrap(), SendOutcome::Sent);
        }
        let mut got = Vec::new();
        assert_eq!(a.arrivals(8, &mut got).unwrap(), 2);
        assert_eq!(b.try_send(0, &eager(2, b"x"), b"x").unwrap(), SendOutcome::Backpressure, "both credits are held");
        assert_eq!(a.payload(&got[1]), &[1; 40]);
        let copy = |x: &Arrival| Arrival { peer: x.peer, header: x.header, slot: x.slot, len: x.len };
        let second = got.pop().unwrap();
        let stale = copy(&second);
        a.release(second).unwrap();
        assert!(a.payload(&stale).is_empty() && a.release(stale).is_err(), "released once");
        // The sender reuses slots in ring order: the newer slot's credit waits for the older one.
        assert_eq!(b.try_send(0, &eager(2, b"x"), b"x").unwrap(), SendOutcome::Backpressure);
        let first = got.pop().unwrap();
        assert_eq!(a.payload(&first), &[0; 40], "the older message is intact");
        a.release(first).unwrap();
        assert_eq!(b.try_send(0, &eager(2, b"x"), b"x").unwrap(), SendOutcome::Sent, "both credits came back at release");
        assert_eq!(drain(&mut a), vec![(1, 2, b"x".to_vec())]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_send_rule_credits_and_backpressure() {
        let (mut a, mut b, dir) = pair("rule", 4, 1);
        let max = a.max_eager();
        assert_eq!(max, 256 - 40);
        // Rank 0 may not send to rank 1 before hearing from it; rank 1 may send to 0 (c0 = 1).
        assert_eq!(a.try_send(1, &eager(9, &[9]), &[9]).unwrap(), SendOutcome::NotAllowed);
        assert_eq!(b.try_send(0, &eager(0, &[0; 3]), &[0; 3]).unwrap(), SendOutcome::Sent);
        assert_eq!(b.try_send(0, &eager(1, &[1]), &[1]).unwrap(), SendOutcome::Backpressure, "only c0 before reallocation");
        assert!(matches!(b.try_send(0, &eager(9, &vec![0; max + 1]), &vec![0; max + 1]), Err(TransportError::EagerTooLarge { .. })));
        assert!(matches!(b.try_send(2, &eager(9, &[]), &[]), Err(TransportError::NoSuchPeer { peer: 2, size: 2 })));
        assert_eq!(drain(&mut a), vec![(1, 0, vec![0; 3])]);
        // The first message brought rank 0 its c0 toward rank 1; the release went back explicitly (threshold 1).
        assert_eq!(a.credits(1).unwrap().data_credits(), 1);
        assert_eq!(a.credits(1).unwrap().owed(), (0, 0));
        assert_eq!(a.try_send(1, &eager(5, &[5; 7]), &[5; 7]).unwrap(), SendOutcome::Sent);
        assert_eq!(drain(&mut b), vec![(0, 5, vec![5; 7])], "the credit message is consumed by the transport");
        assert_eq!(b.try_send(0, &eager(1, &[1]), &[1]).unwrap(), SendOutcome::Sent, "credit came back");
        // Reallocation: each side grants the whole slice (4) and announces it.
        a.reallocate_credits().unwrap();
        b.reallocate_credits().unwrap();
        drain(&mut a);
        drain(&mut b);
        drain(&mut a);
        // The grants sit in the mailboxes until a sender runs short and looks.
        for i in 0..4u8 {
            assert_eq!(a.try_send(1, &eager(u64::from(i), &[i]), &[i]).unwrap(), SendOutcome::Sent, "the whole slice after reallocation");
        }
        assert_eq!(a.try_send(1, &eager(9, &[9]), &[9]).unwrap(), SendOutcome::Backpressure);
        assert_eq!(drain(&mut b).len(), 4);
        for i in 0..4u8 {
            assert_eq!(b.try_send(0, &eager(u64::from(i), &[i]), &[i]).unwrap(), SendOutcome::Sent);
        }
        assert_eq!(b.try_send(0, &eager(9, &[9]), &[9]).unwrap(), SendOutcome::Backpressure, "never a fifth write into 4 slots");
        let got = drain(&mut a);
        assert_eq!(got.iter().map(|m| m.2[0]).collect::<Vec<_>>(), vec![0, 1, 2, 3], "in order");
        // Messages to ourselves use the own ring.
        assert_eq!(b.try_send(1, &eager(7, &[]), &[]).unwrap(), SendOutcome::Sent);
        assert_eq!(drain(&mut b), vec![(1, 7, vec![])]);
        let mem = a.receive_memory();
        assert_eq!((mem.eager_pool, mem.per_peer), (4 * 256, 4 * 256));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn single_copy_read_and_write_and_bounds() {
        let (mut a, mut b, dir) = pair("cma", 4, 2);
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let key = unsafe { a.expose(&src) }.unwrap();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        assert_eq!(unsafe { b.read(0, &key, &mut dst) }.unwrap(), OpStatus::Done);
        assert_eq!(dst, src);
        let mut target = vec![0u8; 10];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        let tkey = unsafe { a.expose_mut(&mut target) }.unwrap();
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        assert_eq!(unsafe { b.write(0, &[9; 10], &tkey) }.unwrap(), OpStatus::Done);
        assert_eq!(target, [9; 10]);
        let mut big = vec![0u8; 11];
        // SAFETY: the buffer outlives the operation: it is revoked or completed (waited for) before it is dropped.
        assert!(matches!(unsafe { b.read(0, &tkey, &mut big) }, Err(TransportError::RemoteBounds { len: 11, region: 10, .. })));
        let h = MsgHeader::control(MsgKind::Rts, 1, 5, 2, RemoteKey::BYTES);
        assert_eq!(b.try_send(0, &h, &key.encode()).unwrap(), SendOutcome::Sent);
        let got = drain(&mut a);
        assert_eq!(RemoteKey::decode(&got[0].2), Some(key));
        // Control messages use the reserve even when data credits are gone.
        while b.try_send(0, &eager(1, &[]), &[]).unwrap() == SendOutcome::Sent {}
        let fin = MsgHeader::control(MsgKind::Fin, 0, 5, 2, 0);
        assert_eq!(b.try_send(0, &fin, &[]).unwrap(), SendOutcome::Sent);
        assert_eq!(b.peer_state(0), PeerState::Alive);
        a.finalize().unwrap();
        assert_eq!(b.peer_state(0), PeerState::Finalized);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Without cross-memory attach, a read is copied through the segments:
    /// the owner serves pieces from its own polls (credits bound the pieces in
    /// flight), the reader completes through poll_ops; ranges not exposed are
    /// refused, a revoked buffer is not served, and splitting is off.
    #[test]
    fn a_held_message_survives_staged_pieces_in_its_ring() {
        let (mut a, mut b, dir) = pair_with("held_staged", 4, 2, false);
        a.reallocate_credits().unwrap();
        b.reallocate_credits().unwrap();
        // b's message to a, then b's pieces for a's read, travel in the same ring.
        assert_eq!(b.try_send(0, &eager(7, b"keep me"), b"keep me").unwrap(), SendOutcome::Sent);
        let mut got = Vec::new();
        assert_eq!(a.arrivals(8, &mut got).unwrap(), 1);
        let held = got.pop().unwrap();
        let src: Vec<u8> = (0..50_000u32).map(|i| (i * 7) as u8).collect();
        // SAFETY: `src` outlives the operation: revoked below after the read completed.
        let key = unsafe { b.expose(&src) }.unwrap();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: `dst` is neither touched nor dropped until poll_ops reports the read below.
        let OpStatus::Pending(id) = unsafe { a.read(1, &key, &mut dst) }.unwrap() else { panic!("a staged read is pending") };
        let (mut outcome, mut held) = (None, Some(held));
        for round in 0..100_000 {
            b.poll(usize::MAX, |_, _, _| panic!("nothing for b's core")).unwrap();
            // b's pieces arrive in the ring that holds b's message, and are given back inside.
            assert_eq!(a.arrivals(usize::MAX, &mut got).unwrap(), 0);
            if let Some(h) = &held {
                assert_eq!(a.payload(h), b"keep me", "round {round}: the held slot was reused");
                if round == 200 {
                    a.release(held.take().unwrap()).unwrap(); // credits of the newer slots follow it
                }
            }
            a.poll_ops(|i, r| outcome = Some((i, r.is_ok()))).unwrap();
            if outcome.is_some() {
                break;
            }
        }
        assert!(held.is_none(), "the read waited for the held slot's credit");
        assert_eq!(outcome, Some((id, true)));
        assert!(dst == src, "the staged copy delivered every byte");
        b.revoke(&key);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn staged_reads_copy_through_the_segments_when_attach_is_refused() {
        let (mut a, mut b, dir) = pair_with("staged", 4, 2, false);
        assert!(!a.split_rendezvous() && !b.split_rendezvous());
        assert!(b.large_message_path().contains("two copies"), "{}", b.large_message_path());
        a.reallocate_credits().unwrap();
        b.reallocate_credits().unwrap();
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 13) as u8).collect();
        // SAFETY: `src` outlives the operation: revoked below after the read completed.
        let key = unsafe { a.expose(&src) }.unwrap();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: `dst` is neither touched nor dropped until poll_ops reports the read below.
        let OpStatus::Pending(id) = unsafe { b.read(0, &key, &mut dst) }.unwrap() else { panic!("a staged read is pending") };
        let mut outcome = None;
        for _ in 0..100_000 {
            a.poll(usize::MAX, |_, _, _| panic!("nothing for the core")).unwrap();
            b.poll(usize::MAX, |_, _, _| panic!("nothing for the core")).unwrap();
            b.poll_ops(|i, r| outcome = Some((i, r.is_ok()))).unwrap();
            if outcome.is_some() {
                break;
            }
        }
        assert_eq!(outcome, Some((id, true)));
        assert!(dst == src, "the staged copy delivered every byte");
        // Outside the exposed range: refused, and the read fails.
        let beyond = RemoteKey { addr: key.addr + 10, len: key.len, key: 0 };
        let mut one = vec![0u8; key.len as usize];
        // SAFETY: `one` outlives the operation, reported below.
        let OpStatus::Pending(id) = unsafe { b.read(0, &beyond, &mut one) }.unwrap() else { panic!() };
        let mut outcome = None;
        for _ in 0..1000 {
            a.poll(usize::MAX, |_, _, _| {}).unwrap();
            b.poll(usize::MAX, |_, _, _| {}).unwrap();
            b.poll_ops(|i, r| outcome = Some((i, r.is_err()))).unwrap();
            if outcome.is_some() {
                break;
            }
        }
        assert_eq!(outcome, Some((id, true)), "a range not exposed is refused");
        a.revoke(&key);
        assert!(a.staged.exposed.is_empty());
        // SAFETY: nothing is exposed any more; the write is refused before anything moves.
        assert!(matches!(unsafe { b.write(0, &[1], &key) }, Err(TransportError::Unsupported(_))));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
