//! Owning wrappers over the verbs objects fmx uses, built on the `ibverbs`
//! crate's `ffi` module: its safe API cannot register existing memory, post
//! RDMA WRITE/READ, use an SRQ or send inline, which is most of what a
//! zero-copy transport does. Every raw call of the crate is in this file.
//!
//! Ownership mirrors the verbs object tree: each wrapper holds an [`Arc`] of
//! its parent, so a context outlives its protection domain, which outlives
//! its memory regions, queues and queue pairs, whatever order they drop in.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

pub(crate) use ::ffi;
use ffi::{ibv_access_flags, ibv_qp_attr_mask, ibv_send_flags};

fn last_os_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// What to do about ENOMEM from ibv_reg_mr: registration pins pages, and
/// the locked-memory limit (`ulimit -l`) caps them.
pub(crate) fn memlock_hint() -> String {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into `r`, a valid rlimit we own.
    let limit = match unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut r) } {
        0 if r.rlim_cur == libc::RLIM_INFINITY => "unlimited".to_owned(),
        0 => format!("{} KiB", r.rlim_cur / 1024),
        _ => "unknown".to_owned(),
    };
    format!(
        "; registering pins memory and the locked-memory limit (ulimit -l) is {limit}: raise it (ulimit -l unlimited, \
         memlock in /etc/security/limits.conf, LimitMEMLOCK= for systemd services, --ulimit memlock=-1 for containers)"
    )
}

/// Verbs calls return 0 or an errno value (not -1 with errno set).
fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::from_raw_os_error(rc.abs());
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

/// The names of the RDMA devices libibverbs sees (the safe API suffices here).
pub(crate) fn device_names() -> io::Result<Vec<String>> {
    let list = ibverbs::devices()?;
    Ok(list.iter().filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned())).collect())
}

/// An open device.
pub(crate) struct Context {
    ctx: NonNull<ffi::ibv_context>,
    pub(crate) name: String,
}

// SAFETY: libibverbs objects may be used from any thread (rdma-core documents
// the verbs as thread-safe); fmx drives each endpoint from one thread at a time.
unsafe impl Send for Context {}
// SAFETY: as above; shared references only query immutable attributes.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`.
    pub(crate) fn open(name: &str) -> io::Result<Arc<Self>> {
        let mut n = 0i32;
        // SAFETY: as in `device_names`.
        let list = unsafe { ffi::ibv_get_device_list(&raw mut n) };
        if list.is_null() {
            return Err(last_os_error("ibv_get_device_list"));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n as usize {
            // SAFETY: `i < n` indexes the device array; names are NUL-terminated.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is a valid device of the list.
            let dev_name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
            if dev_name.to_bytes() == name.as_bytes() {
                // SAFETY: `dev` is valid until the list is freed; an opened
                // context stays valid after that (libibverbs keeps a reference).
                ctx = unsafe { ffi::ibv_open_device(dev) };
                break;
            }
        }
        let err = last_os_error(&format!("ibv_open_device({name})"));
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(list) };
        let ctx = NonNull::new(ctx).ok_or(err)?;
        Ok(Arc::new(Self { ctx, name: name.to_owned() }))
    }

    pub(crate) fn query_device(&self) -> io::Result<ffi::ibv_device_attr> {
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: the context is open; `attr` is a valid out-parameter.
        check(unsafe { ffi::ibv_query_device(self.ctx.as_ptr(), &raw mut attr) }, "ibv_query_device")?;
        Ok(attr)
    }

    pub(crate) fn query_port(&self, port: u8) -> io::Result<ffi::ibv_port_attr> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: the context is open; the exported ibv_query_port fills the
        // legacy-sized struct that bindgen generated from the same header.
        let rc = unsafe { ffi::ibv_query_port(self.ctx.as_ptr(), port, (&raw mut attr).cast()) };
        check(rc, &format!("ibv_query_port({}, port {port})", self.name))?;
        Ok(attr)
    }

    pub(crate) fn query_gid(&self, port: u8, index: i32) -> io::Result<[u8; 16]> {
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: the context is open; `gid` is a valid out-parameter.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx.as_ptr(), port, index, &raw mut gid) };
        check(rc, &format!("ibv_query_gid({}, port {port}, index {index})", self.name))?;
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child object holds an Arc of this context, so none is left.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// A protection domain.
pub(crate) struct Pd {
    pd: NonNull<ffi::ibv_pd>,
    _ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn alloc(ctx: &Arc<Context>) -> io::Result<Arc<Self>> {
        // SAFETY: the context is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| last_os_error("ibv_alloc_pd"))?;
        Ok(Arc::new(Self { pd, _ctx: ctx.clone() }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: children hold an Arc of the PD, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// What a memory region allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The device reads it locally (a send or RDMA WRITE source); works on read-only pages.
    LocalRead,
    /// The device writes it locally (receive slots, READ targets).
    Local,
    /// Peers may read it (read-only pages are fine).
    RemoteRead,
    /// Peers may write it (and the device writes it locally).
    RemoteWrite,
    /// Peers may read and write it.
    Remote,
    /// Peers may read, write and use atomics on it (the capability probe).
    Atomic,
}

impl Access {
    fn flags(self) -> ibv_access_flags {
        use ibv_access_flags as A;
        match self {
            Self::LocalRead => A(0),
            Self::Local => A::IBV_ACCESS_LOCAL_WRITE,
            Self::RemoteRead => A::IBV_ACCESS_REMOTE_READ,
            Self::RemoteWrite => A::IBV_ACCESS_LOCAL_WRITE | A::IBV_ACCESS_REMOTE_WRITE,
            Self::Remote => A::IBV_ACCESS_LOCAL_WRITE | A::IBV_ACCESS_REMOTE_WRITE | A::IBV_ACCESS_REMOTE_READ,
            Self::Atomic => Self::Remote.flags() | A::IBV_ACCESS_REMOTE_ATOMIC,
        }
    }
}

/// A registered memory region. It pins the pages; it does not own them: the
/// code that posts work requests naming it keeps the memory alive.
pub struct Mr {
    mr: NonNull<ffi::ibv_mr>,
    _pd: Arc<Pd>,
    pub(crate) addr: u64,
    pub(crate) len: usize,
}

// SAFETY: see Context.
unsafe impl Send for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr`.
    pub(crate) fn register(pd: &Arc<Pd>, addr: *const u8, len: usize, access: Access) -> io::Result<Self> {
        // ibv_reg_mr refuses 0 bytes; a 1-byte registration of a dangling
        // pointer would fail too, so empty regions are the caller's case.
        debug_assert!(len > 0);
        // SAFETY: registration only pins and maps the pages of [addr, addr+len)
        // into the device's tables; it reads and writes no memory itself. Work
        // requests that use the region are posted by code that owns the memory.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd.as_ptr(), addr.cast_mut().cast(), len, access.flags().0 as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::ENOMEM) { memlock_hint() } else { String::new() };
            io::Error::new(e.kind(), format!("ibv_reg_mr({len} bytes): {e}{hint}"))
        })?;
        Ok(Self { mr, _pd: pd.clone(), addr: addr as u64, len })
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered until drop.
        unsafe { self.mr.as_ref().lkey }
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the MR is registered until drop.
        unsafe { self.mr.as_ref().rkey }
    }
}

impl fmx_transport::rdma::Region for Mr {
    fn start(&self) -> u64 {
        self.addr
    }
    fn covers(&self, addr: u64, len: usize) -> bool {
        addr >= self.addr && addr + len as u64 <= self.addr + self.len as u64
    }
}

impl fmx_transport::rdma::Registration for Mr {
    type Desc = u32;
    const NO_DESC: u32 = 0;
    fn desc(&self) -> u32 {
        self.lkey()
    }
    fn remote_key(&self) -> u64 {
        u64::from(self.rkey())
    }
    fn remote_addr(&self, addr: u64) -> u64 {
        addr
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once; callers drop an MR only
        // after every work request naming it has completed.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A completion queue.
pub(crate) struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    _ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context.
unsafe impl Sync for Cq {}

impl Cq {
    pub(crate) fn create(ctx: &Arc<Context>, entries: i32) -> io::Result<Arc<Self>> {
        // SAFETY: the context is open; no channel, no user context.
        let cq = unsafe { ffi::ibv_create_cq(ctx.ctx.as_ptr(), entries, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        let cq = NonNull::new(cq).ok_or_else(|| last_os_error(&format!("ibv_create_cq({entries} entries)")))?;
        Ok(Arc::new(Self { cq, _ctx: ctx.clone() }))
    }

    /// Fills the front of `out` with completions and returns them. `out`
    /// needs no initialising: a poll that finds nothing (most of a wait's
    /// polls) writes nothing, and zeroing the array each time would cost as
    /// much as the poll under an emulated CPU.
    pub(crate) fn poll<'a>(&self, out: &'a mut [MaybeUninit<ffi::ibv_wc>]) -> io::Result<&'a [ffi::ibv_wc]> {
        // SAFETY: ibv_poll_cq is a static inline that calls the provider's
        // poll_cq through the context's op table; `out` has room for `len`
        // entries, and the provider writes (and so initialises) the first n.
        let n = unsafe {
            let ctx = (*self.cq.as_ptr()).context;
            let poll = (*ctx).ops.poll_cq.expect("provider has poll_cq");
            poll(self.cq.as_ptr(), out.len() as i32, out.as_mut_ptr().cast())
        };
        if n < 0 {
            return Err(io::Error::other("ibv_poll_cq failed"));
        }
        // SAFETY: the provider initialised out[..n] (n <= out.len()); MaybeUninit<T> has T's layout.
        Ok(unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<ffi::ibv_wc>(), (n as usize).min(out.len())) })
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: queue pairs hold an Arc of their CQs, so none is left.
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// A shared receive queue.
pub(crate) struct Srq {
    srq: NonNull<ffi::ibv_srq>,
    _pd: Arc<Pd>,
}

// SAFETY: see Context.
unsafe impl Send for Srq {}
// SAFETY: see Context.
unsafe impl Sync for Srq {}

impl Srq {
    pub(crate) fn create(pd: &Arc<Pd>, max_wr: u32) -> io::Result<Arc<Self>> {
        let mut attr = ffi::ibv_srq_init_attr::default();
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = 1;
        // SAFETY: the PD is valid; `attr` is a valid in/out parameter.
        let srq = unsafe { ffi::ibv_create_srq(pd.pd.as_ptr(), &raw mut attr) };
        let srq = NonNull::new(srq).ok_or_else(|| last_os_error(&format!("ibv_create_srq({max_wr} entries)")))?;
        Ok(Arc::new(Self { srq, _pd: pd.clone() }))
    }

    /// Posts one receive of `len` bytes at `addr`.
    ///
    /// # Safety
    /// `[addr, addr+len)` lies in a region registered with `lkey` for local
    /// write, and stays allocated until the receive completes or the SRQ is destroyed.
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, addr: u64, len: u32, lkey: u32) -> io::Result<()> {
        let mut sge = ffi::ibv_sge { addr, length: len, lkey };
        let mut wr = ffi::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &raw mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the static inline ibv_post_srq_recv calls the provider's
        // post_srq_recv from the context's op table; the WR and SGE live on
        // this stack frame for the call; the buffer is the caller's promise.
        let rc = unsafe {
            let ctx = (*self.srq.as_ptr()).context;
            let post = (*ctx).ops.post_srq_recv.expect("provider has post_srq_recv");
            post(self.srq.as_ptr(), &raw mut wr, &raw mut bad)
        };
        check(rc, "ibv_post_srq_recv")
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: queue pairs hold an Arc of the SRQ, so none is left.
        unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}

/// Where a queue pair's peer is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerPath {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    /// RoCE (and routed IB) needs a global route header; plain IB uses the LID.
    pub(crate) global: bool,
    pub(crate) mtu: u32,
}

/// Knobs of the connection that do not come from the peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpTiming {
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    /// Local ACK timeout exponent: 4.096 us × 2^timeout per try.
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) rd_atomic: u8,
}

/// One send request, as [`Qp::post_send`] takes it.
pub(crate) struct SendWr {
    pub(crate) wr_id: u64,
    pub(crate) opcode: SendOp,
    pub(crate) local: (u64, u32, u32),
    pub(crate) signaled: bool,
    pub(crate) inline: bool,
}

/// The operations fmx posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendOp {
    Send,
    /// A SEND whose completion at the peer carries this 32-bit value.
    SendImm(u32),
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    /// 8-byte fetch-and-add (the probe; fmx itself uses no atomics).
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

/// A reliable-connected queue pair.
pub(crate) struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    _pd: Arc<Pd>,
    _send_cq: Arc<Cq>,
    _recv_cq: Arc<Cq>,
    _srq: Option<Arc<Srq>>,
    pub(crate) max_inline: u32,
}

// SAFETY: see Context.
unsafe impl Send for Qp {}

impl Qp {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_rc(
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        srq: Option<&Arc<Srq>>,
        max_send_wr: u32,
        max_recv_wr: u32,
        max_inline: u32,
    ) -> io::Result<Self> {
        let caps = (max_send_wr, if srq.is_some() { 0 } else { max_recv_wr }, max_inline);
        Self::create(pd, send_cq, recv_cq, srq, ffi::ibv_qp_type::IBV_QPT_RC, caps)
    }

    /// A UD queue pair (the wire-up channel of connections made on demand);
    /// activate it with [`Qp::activate_ud`].
    pub(crate) fn create_ud(pd: &Arc<Pd>, send_cq: &Arc<Cq>, recv_cq: &Arc<Cq>, max_send_wr: u32, max_recv_wr: u32) -> io::Result<Self> {
        Self::create(pd, send_cq, recv_cq, None, ffi::ibv_qp_type::IBV_QPT_UD, (max_send_wr, max_recv_wr, 0))
    }

    fn create(
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        srq: Option<&Arc<Srq>>,
        qp_type: ffi::ibv_qp_type::Type,
        (max_send_wr, max_recv_wr, max_inline): (u32, u32, u32),
    ) -> io::Result<Self> {
        let mut attr = ffi::ibv_qp_init_attr {
            send_cq: send_cq.cq.as_ptr(),
            recv_cq: recv_cq.cq.as_ptr(),
            srq: srq.map_or(std::ptr::null_mut(), |s| s.srq.as_ptr()),
            qp_type,
            sq_sig_all: 0,
            ..Default::default()
        };
        attr.cap.max_send_wr = max_send_wr;
        attr.cap.max_recv_wr = max_recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = max_inline;
        // SAFETY: the PD, CQs and SRQ are valid and outlive the QP (it holds Arcs).
        let qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &raw mut attr) };
        let what = if qp_type == ffi::ibv_qp_type::IBV_QPT_UD { "ibv_create_qp(UD)" } else { "ibv_create_qp(RC)" };
        let qp = NonNull::new(qp).ok_or_else(|| last_os_error(what))?;
        Ok(Self {
            qp,
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
            max_inline: attr.cap.max_inline_data,
        })
    }

    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: the QP is valid until drop.
        unsafe { self.qp.as_ref().qp_num }
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ibv_qp_attr_mask, what: &str) -> io::Result<()> {
        // SAFETY: the QP is valid; `attr` is fully initialized for the bits in `mask`.
        check(unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) }, what)
    }

    /// RESET -> INIT -> RTR -> RTS toward `peer`.
    pub(crate) fn connect(&self, t: QpTiming, my_psn: u32, peer: &PeerPath) -> io::Result<()> {
        self.to_init(t.port)?;
        self.to_rts(t, my_psn, peer)
    }

    /// RESET -> INIT: receives may be posted from here on.
    pub(crate) fn to_init(&self, port: u8) -> io::Result<()> {
        use ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
                | ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
                .0,
            ..Default::default()
        };
        self.modify(&mut a, M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS, "modify QP to INIT")
    }

    /// A UD queue pair's RESET -> INIT -> RTR -> RTS, accepting datagrams that carry `qkey`.
    pub(crate) fn activate_ud(&self, port: u8, qkey: u32, psn: u32) -> io::Result<()> {
        use ibv_qp_attr_mask as M;
        let mut a =
            ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_INIT, pkey_index: 0, port_num: port, qkey, ..Default::default() };
        self.modify(&mut a, M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY, "modify UD QP to INIT")?;
        let mut a = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_RTR, ..Default::default() };
        self.modify(&mut a, M::IBV_QP_STATE, "modify UD QP to RTR")?;
        let mut a = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_RTS, sq_psn: psn, ..Default::default() };
        self.modify(&mut a, M::IBV_QP_STATE | M::IBV_QP_SQ_PSN, "modify UD QP to RTS")
    }

    /// INIT -> RTR -> RTS toward `peer`.
    pub(crate) fn to_rts(&self, t: QpTiming, my_psn: u32, peer: &PeerPath) -> io::Result<()> {
        use ibv_qp_attr_mask as M;
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: peer.mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: t.rd_atomic,
            min_rnr_timer: 12, // 0.64 ms
            ..Default::default()
        };
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.port_num = t.port;
        if peer.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = peer.gid;
            a.ah_attr.grh.sgid_index = t.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "modify QP to RTR",
        )?;

        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout: t.timeout,
            retry_cnt: t.retry_cnt,
            rnr_retry: t.rnr_retry,
            sq_psn: my_psn,
            max_rd_atomic: t.rd_atomic,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_TIMEOUT | M::IBV_QP_RETRY_CNT | M::IBV_QP_RNR_RETRY | M::IBV_QP_SQ_PSN | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "modify QP to RTS",
        )
    }

    /// Moves the QP to the error state: outstanding work flushes with errors.
    pub(crate) fn set_error(&self) {
        let mut a = ffi::ibv_qp_attr { qp_state: ffi::ibv_qp_state::IBV_QPS_ERR, ..Default::default() };
        let _ = self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "modify QP to ERR");
    }

    /// Posts one work request with one scatter/gather entry.
    ///
    /// # Safety
    /// The local range `wr.local` lies in memory registered with its lkey (or,
    /// inline, is readable for the call) and stays allocated, unmoved and — for
    /// a READ — unaliased until the request completes; remote addresses and
    /// keys are the peer's to check.
    pub(crate) unsafe fn post_send(&self, wr: &SendWr) -> io::Result<()> {
        let (addr, length, lkey) = wr.local;
        let mut sge = ffi::ibv_sge { addr, length, lkey };
        let mut flags = ibv_send_flags(0);
        if wr.signaled {
            flags = flags | ibv_send_flags::IBV_SEND_SIGNALED;
        }
        if wr.inline {
            flags = flags | ibv_send_flags::IBV_SEND_INLINE;
        }
        let mut w = ffi::ibv_send_wr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: &raw mut sge,
            num_sge: i32::from(length > 0),
            send_flags: flags.0,
            ..Default::default()
        };
        match wr.opcode {
            SendOp::Send => w.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND,
            SendOp::SendImm(imm) => {
                w.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                // Network byte order on the wire; the receiver reverses it.
                w.__bindgen_anon_1.imm_data = imm.to_be();
            }
            SendOp::Write { remote_addr, rkey } => {
                w.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            }
            SendOp::Read { remote_addr, rkey } => {
                w.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
                w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            }
            SendOp::FetchAdd { remote_addr, rkey, add } => {
                w.opcode = ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                w.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 { remote_addr, compare_add: add, swap: 0, rkey };
            }
        }
        // SAFETY: WR and SGE live on this frame for the call; the buffers are
        // the caller's promise.
        unsafe { self.post_wr(&mut w, "ibv_post_send") }
    }

    /// Hands one send work request to the provider (what the static inline
    /// `ibv_post_send` does: the provider's post_send from the context's op table).
    ///
    /// # Safety
    /// `w` and what it points to (SGEs, address handle) live for the call
    /// (the provider copies them, and inline data, before returning), and its
    /// buffers as the request's kind requires until it completes.
    #[inline]
    unsafe fn post_wr(&self, w: &mut ffi::ibv_send_wr, what: &str) -> io::Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP and its context are valid while `self` lives; the
        // rest is the caller's promise.
        let rc = unsafe {
            let ctx = (*self.qp.as_ptr()).context;
            let post = (*ctx).ops.post_send.expect("provider has post_send");
            post(self.qp.as_ptr(), w, &raw mut bad)
        };
        check(rc, what)
    }

    /// Sends one datagram from a UD queue pair, signaled.
    ///
    /// # Safety
    /// `local` lies in memory registered with its lkey and stays allocated
    /// and unwritten until the send completes.
    pub(crate) unsafe fn post_send_ud(&self, wr_id: u64, local: (u64, u32, u32), ah: &Ah, remote_qpn: u32, qkey: u32) -> io::Result<()> {
        let (addr, length, lkey) = local;
        let mut sge = ffi::ibv_sge { addr, length, lkey };
        let mut w = ffi::ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: &raw mut sge,
            num_sge: 1,
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        w.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah: ah.ah.as_ptr(), remote_qpn, remote_qkey: qkey };
        // SAFETY: as in `post_send`; the address handle lives (it is borrowed) for the call,
        // and the provider keeps what it needs of it until the send completes.
        unsafe { self.post_wr(&mut w, "ibv_post_send(UD)") }
    }

    /// Posts one receive on the QP's own receive queue (devices without SRQ).
    ///
    /// # Safety
    /// As [`Srq::post_recv`].
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, addr: u64, len: u32, lkey: u32) -> io::Result<()> {
        let mut sge = ffi::ibv_sge { addr, length: len, lkey };
        let mut wr = ffi::ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &raw mut sge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in Srq::post_recv, through the op table's post_recv.
        let rc = unsafe {
            let ctx = (*self.qp.as_ptr()).context;
            let post = (*ctx).ops.post_recv.expect("provider has post_recv");
            post(self.qp.as_ptr(), &raw mut wr, &raw mut bad)
        };
        check(rc, "ibv_post_recv")
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; buffers of outstanding requests are owned by
        // the endpoint, which drops its QPs before its memory regions.
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// An address handle: where a UD datagram goes.
pub(crate) struct Ah {
    ah: NonNull<ffi::ibv_ah>,
    _pd: Arc<Pd>,
}

// SAFETY: see Context.
unsafe impl Send for Ah {}

impl Ah {
    /// The address of a port reached by `lid`, or by `gid` through a global route header.
    pub(crate) fn create(pd: &Arc<Pd>, port: u8, gid_index: u8, lid: u16, gid: [u8; 16], global: bool) -> io::Result<Self> {
        let mut a = ffi::ibv_ah_attr { dlid: lid, port_num: port, ..Default::default() };
        if global {
            a.is_global = 1;
            a.grh.dgid.raw = gid;
            a.grh.sgid_index = gid_index;
            a.grh.hop_limit = 64;
        }
        // SAFETY: the PD is valid; `a` is a fully initialized attribute the call only reads.
        let ah = unsafe { ffi::ibv_create_ah(pd.pd.as_ptr(), &raw mut a) };
        let ah = NonNull::new(ah).ok_or_else(|| last_os_error("ibv_create_ah"))?;
        Ok(Self { ah, _pd: pd.clone() })
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; the UD QP that used it keeps
        // no reference once its sends completed (and it is destroyed first).
        unsafe { ffi::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}

/// Whether the device creates a queue pair of `qp_type` (UD, XRC, ...); the
/// probe's question, answered by trying.
pub(crate) fn can_create_qp(pd: &Arc<Pd>, cq: &Arc<Cq>, qp_type: ffi::ibv_qp_type::Type) -> bool {
    let mut attr = ffi::ibv_qp_init_attr {
        send_cq: cq.cq.as_ptr(),
        recv_cq: cq.cq.as_ptr(),
        srq: std::ptr::null_mut(),
        qp_type,
        ..Default::default()
    };
    attr.cap.max_send_wr = 4;
    attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    // SAFETY: PD and CQ are valid; the QP is destroyed right away.
    unsafe {
        let qp = ffi::ibv_create_qp(pd.pd.as_ptr(), &raw mut attr);
        if qp.is_null() {
            return false;
        }
        ffi::ibv_destroy_qp(qp);
    }
    true
}
