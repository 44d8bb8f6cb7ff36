//! Owners of libfabric objects: the provider query ([`Info`]), the fabric,
//! domain, completion queue, address vector and endpoint ([`Fabric`]), and
//! memory regions ([`Mr`]), each closed exactly once, in dependency order.
//! Every FFI call of the crate outside the data path lives here.

use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;

use fmx_transport::TransportError;
use sys::{fi_addr_t, fi_info, fid, fid_av, fid_cq, fid_domain, fid_ep, fid_fabric, fid_mr};

/// libfabric's message for a (positive) error number.
pub(crate) fn strerror(errno: i64) -> String {
    // SAFETY: fi_strerror returns a pointer to a static, NUL-terminated string for any number.
    let s = unsafe { CStr::from_ptr(sys::fi_strerror(errno.unsigned_abs() as i32)) };
    s.to_string_lossy().into_owned()
}

/// A setup error naming the call, the provider and libfabric's reason.
pub(crate) fn fail(what: &str, provider: &str, rc: i64) -> TransportError {
    TransportError::Setup {
        what: format!("{what} (libfabric provider {provider})"),
        source: std::io::Error::other(format!("{} (error {})", strerror(rc), -rc)),
    }
}

fn check(what: &str, provider: &str, rc: i32) -> Result<(), TransportError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(fail(what, provider, i64::from(rc)))
    }
}

/// The memory-registration modes fmx handles (`domain_attr->mr_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrMode {
    /// `FI_MR_LOCAL`: local buffers of sends, receives and RMA need a descriptor.
    pub local: bool,
    /// `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses, not offsets.
    pub virt_addr: bool,
    /// `FI_MR_PROV_KEY`: the provider picks keys.
    pub prov_key: bool,
    /// `FI_MR_ENDPOINT`: a region is bound to the endpoint and enabled.
    pub endpoint: bool,
    /// `FI_MR_ALLOCATED`: only allocated memory may be registered (always true of ours).
    pub allocated: bool,
}

impl MrMode {
    fn from_bits(bits: u64) -> Self {
        let has = |b: u32| bits & u64::from(b) != 0;
        Self {
            local: has(sys::FI_MR_LOCAL),
            virt_addr: has(sys::FI_MR_VIRT_ADDR),
            prov_key: has(sys::FI_MR_PROV_KEY),
            endpoint: has(sys::FI_MR_ENDPOINT),
            allocated: has(sys::FI_MR_ALLOCATED),
        }
    }

    /// Every mode fmx can honour: what the hints offer the provider.
    fn supported() -> u64 {
        u64::from(sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY | sys::FI_MR_ENDPOINT)
    }
}

/// The provider chosen for this process: the first (libfabric's best)
/// `FI_EP_RDM` offer with tagged messages and RMA, in source order.
pub struct Info {
    list: *mut fi_info,
    /// The entry used: the first, or the first on the requested domain.
    chosen: *mut fi_info,
}

// SAFETY: the list is owned by this value alone and only read after fi_getinfo.
unsafe impl Send for Info {}
// SAFETY: as above; nothing mutates it after construction.
unsafe impl Sync for Info {}

/// What fmx asks of a provider: tagged messages, and RMA when `rma`.
pub(crate) fn wanted_caps(rma: bool) -> u64 {
    let rma_caps = sys::FI_RMA | sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE;
    u64::from(sys::FI_TAGGED | if rma { rma_caps } else { 0 })
}

impl Info {
    /// Asks libfabric for reliable datagram endpoints with tagged messages,
    /// send-after-send order, and RMA when `rma`. `provider` (e.g. `"tcp;ofi_rxm"`)
    /// restricts the answer; `FI_PROVIDER` restricts it inside libfabric.
    pub fn query(provider: Option<&str>, domain: Option<&str>, rma: bool) -> Result<Self, TransportError> {
        // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with its attribute structs (fi_allocinfo).
        let hints = unsafe { sys::fi_dupinfo(ptr::null()) };
        if hints.is_null() {
            return Err(fail("fi_allocinfo", provider.unwrap_or("any"), -i64::from(sys::FI_ENOMEM)));
        }
        // SAFETY: `hints` and its attribute pointers were just allocated by libfabric;
        // strings put in it are malloc'ed (strdup) because fi_freeinfo frees them.
        let rc = unsafe {
            let h = &mut *hints;
            h.caps = wanted_caps(rma);
            // fmx hands every operation a context of fi_context2 size that lives until its completion.
            h.mode = sys::fmx_fi_context_modes();
            (*h.ep_attr).type_ = sys::FI_EP_RDM;
            (*h.domain_attr).mr_mode = MrMode::supported() as i32;
            (*h.domain_attr).threading = sys::FI_THREAD_DOMAIN;
            (*h.domain_attr).av_type = sys::FI_AV_TABLE;
            // Eager messages from one sender are matched in send order.
            (*h.tx_attr).msg_order = u64::from(sys::FI_ORDER_SAS);
            (*h.rx_attr).msg_order = u64::from(sys::FI_ORDER_SAS);
            if let Some(p) = provider {
                let c = CString::new(p).map_err(|_| fail("provider name with a NUL byte", p, -i64::from(sys::FI_EINVAL)))?;
                (*h.fabric_attr).prov_name = libc::strdup(c.as_ptr());
            }
            if let Some(d) = domain {
                let c = CString::new(d).map_err(|_| fail("domain name with a NUL byte", d, -i64::from(sys::FI_EINVAL)))?;
                (*h.domain_attr).name = libc::strdup(c.as_ptr());
            }
            let mut list = ptr::null_mut();
            let rc = sys::fi_getinfo(sys::fmx_fi_header_version(), ptr::null(), ptr::null(), 0, hints, &raw mut list);
            sys::fi_freeinfo(hints);
            (rc, list)
        };
        // Providers may list other domains despite the hint (tcp in 1.17 does): pick ourselves.
        let chosen = match rc {
            (0, list) => {
                let mut e = list;
                // SAFETY: `e` walks the non-null entries of the list fi_getinfo
                // returned; every entry has its domain_attr.
                let name_of = |e: *mut fi_info| Self::c_str(unsafe { (*(*e).domain_attr).name });
                while !e.is_null() && domain.is_some_and(|d| name_of(e) != d) {
                    // SAFETY: as above: `e` is a live entry.
                    e = unsafe { (*e).next };
                }
                if e.is_null() && !list.is_null() {
                    // SAFETY: the list came from fi_getinfo and is not used after this.
                    unsafe { sys::fi_freeinfo(list) };
                }
                e
            }
            _ => ptr::null_mut(),
        };
        match rc {
            (0, list) if !chosen.is_null() => Ok(Self { list, chosen }),
            (rc, _) => {
                let mut which = provider.map_or_else(
                    || std::env::var("FI_PROVIDER").map_or("any provider".into(), |p| format!("FI_PROVIDER={p}")),
                    |p| format!("provider {p:?}"),
                );
                if let Some(d) = domain {
                    which = format!("{which} on domain {d:?}");
                }
                Err(TransportError::Setup {
                    what: format!(
                        "no libfabric provider offers reliable datagram endpoints (FI_EP_RDM) with tagged messages{} and \
                         send-after-send order for {which} (libfabric {}; `fi_info -t FI_EP_RDM` lists what this host has)",
                        if rma { ", RMA" } else { "" },
                        sys::LIBFABRIC_VERSION
                    ),
                    source: std::io::Error::other(strerror(i64::from(rc.min(-(sys::FI_ENODATA as i32))))),
                })
            }
        }
    }

    fn first(&self) -> &fi_info {
        // SAFETY: `chosen` is a non-null entry of the list fi_getinfo returned, alive until drop.
        unsafe { &*self.chosen }
    }

    fn c_str(p: *const std::ffi::c_char) -> String {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: libfabric's attribute strings are NUL-terminated and live with the info.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    /// The provider name, e.g. `tcp;ofi_rxm`.
    pub fn provider(&self) -> String {
        // SAFETY: fabric_attr is non-null in every fi_getinfo answer.
        Self::c_str(unsafe { (*self.first().fabric_attr).prov_name })
    }

    /// Every (provider, domain) libfabric listed, in its order, duplicates removed.
    pub fn offers(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let mut e = self.list;
        while !e.is_null() {
            // SAFETY: `e` walks the non-null entries of the list fi_getinfo returned,
            // alive until drop; every entry has its fabric_attr and domain_attr.
            let (prov, dom, next) =
                unsafe { (Self::c_str((*(*e).fabric_attr).prov_name), Self::c_str((*(*e).domain_attr).name), (*e).next) };
            if !out.iter().any(|o| o.0 == prov && o.1 == dom) {
                out.push((prov, dom));
            }
            e = next;
        }
        out
    }

    /// The fabric and domain names, e.g. `127.0.0.0/8` and `lo`.
    pub fn fabric_and_domain(&self) -> (String, String) {
        let i = self.first();
        // SAFETY: fabric_attr and domain_attr are non-null in every fi_getinfo answer.
        unsafe { (Self::c_str((*i.fabric_attr).name), Self::c_str((*i.domain_attr).name)) }
    }

    /// The registration modes the provider asks for.
    pub fn mr_mode(&self) -> MrMode {
        // SAFETY: as above.
        MrMode::from_bits(unsafe { (*self.first().domain_attr).mr_mode } as u64)
    }

    /// The largest message (and RMA transfer) one operation may carry.
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: ep_attr is non-null in every answer.
        unsafe { (*self.first().ep_attr).max_msg_size }
    }

    /// Receive and transmit queue depths.
    pub fn queue_sizes(&self) -> (usize, usize) {
        // SAFETY: rx_attr and tx_attr are non-null in every answer.
        unsafe { ((*self.first().rx_attr).size, (*self.first().tx_attr).size) }
    }

    /// Bytes `fi_tinject` takes.
    pub fn inject_size(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.first().tx_attr).inject_size }
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once.
        unsafe { sys::fi_freeinfo(self.list) };
    }
}

/// The opened objects of one endpoint, closed in reverse order of opening.
pub struct Fabric {
    pub(crate) provider: String,
    pub(crate) mr_mode: MrMode,
    fabric: *mut fid_fabric,
    domain: *mut fid_domain,
    cq: *mut fid_cq,
    av: *mut fid_av,
    /// Null once closed ([`Fabric::close_endpoint`]).
    ep: AtomicPtr<fid_ep>,
    next_key: AtomicU64,
    _info: Info,
}

// SAFETY: the objects are opened with FI_THREAD_DOMAIN and used by the one
// thread that drives the endpoint at a time (`&mut` on the endpoint); the
// registration hooks that share this value run on that same thread.
unsafe impl Send for Fabric {}
// SAFETY: as above: shared only between the endpoint and its own pools.
unsafe impl Sync for Fabric {}

fn as_fid<T>(p: *mut T) -> *mut fid {
    // Every fid_* struct starts with its `struct fid`.
    p.cast()
}

impl Fabric {
    /// Opens fabric, domain, completion queue (tagged format, `cq_size`
    /// entries), address vector (`peers` entries) and the endpoint, names it
    /// (`fi_setname`, when `name` is given), binds and enables it.
    pub fn open(info: Info, cq_size: usize, peers: usize, name: Option<&str>) -> Result<Self, TransportError> {
        let provider = info.provider();
        let mr_mode = info.mr_mode();
        let mut me = Self {
            provider,
            mr_mode,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ep: AtomicPtr::new(ptr::null_mut()),
            next_key: AtomicU64::new(1),
            _info: info,
        };
        let p = me.provider.clone();
        let i = me._info.chosen;
        // SAFETY: `i` is the chosen fi_info; every out-pointer is a field of
        // `me`, which closes whatever was opened if a later step fails (Drop).
        // fi_setname reads `c.len()` bytes of `c`, a NUL-terminated string it copies.
        unsafe {
            check("fi_fabric", &p, sys::fmx_fi_fabric((*i).fabric_attr, &raw mut me.fabric, ptr::null_mut()))?;
            check("fi_domain", &p, sys::fmx_fi_domain(me.fabric, i, &raw mut me.domain, ptr::null_mut()))?;
            let mut cq_attr =
                sys::fi_cq_attr { size: cq_size, format: sys::FI_CQ_FORMAT_TAGGED, wait_obj: sys::FI_WAIT_NONE, ..Default::default() };
            check("fi_cq_open", &p, sys::fmx_fi_cq_open(me.domain, &raw mut cq_attr, &raw mut me.cq, ptr::null_mut()))?;
            let mut av_attr = sys::fi_av_attr { type_: sys::FI_AV_TABLE, count: peers, ..Default::default() };
            check("fi_av_open", &p, sys::fmx_fi_av_open(me.domain, &raw mut av_attr, &raw mut me.av, ptr::null_mut()))?;
            let mut ep = ptr::null_mut();
            check("fi_endpoint", &p, sys::fmx_fi_endpoint(me.domain, i, &raw mut ep, ptr::null_mut()))?;
            me.ep = AtomicPtr::new(ep);
            check("fi_ep_bind (completion queue)", &p, sys::fmx_fi_ep_bind(ep, as_fid(me.cq), u64::from(sys::FI_TRANSMIT | sys::FI_RECV)))?;
            check("fi_ep_bind (address vector)", &p, sys::fmx_fi_ep_bind(ep, as_fid(me.av), 0))?;
            if let Some(name) = name {
                // The provider copies a NUL-terminated string.
                let mut c = format!("{name}\0").into_bytes();
                check(&format!("fi_setname ({name})"), &p, sys::fmx_fi_setname(ep, c.as_mut_ptr().cast(), c.len()))?;
            }
            check("fi_enable", &p, sys::fmx_fi_enable(ep))?;
        }
        Ok(me)
    }

    /// The endpoint's address, as peers insert it into their address vectors.
    pub fn name(&self) -> Result<Vec<u8>, TransportError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: `buf` has `len` writable bytes; the provider writes at most that and updates `len`.
        let mut rc = unsafe { sys::fmx_fi_getname(self.ep(), buf.as_mut_ptr().cast(), &raw mut len) };
        if rc == -(sys::FI_ETOOSMALL as i32) {
            buf.resize(len, 0);
            // SAFETY: as above, with the size the provider asked for.
            rc = unsafe { sys::fmx_fi_getname(self.ep(), buf.as_mut_ptr().cast(), &raw mut len) };
        }
        check("fi_getname", &self.provider, rc)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Inserts every peer's name; returns their addresses in the same order.
    pub fn insert(&self, names: &[&[u8]]) -> Result<Vec<fi_addr_t>, TransportError> {
        let mut out = Vec::with_capacity(names.len());
        for (r, n) in names.iter().enumerate() {
            let mut a: fi_addr_t = sys::FI_ADDR_UNSPEC;
            // SAFETY: `n` is one address in the provider's format (fi_getname of rank r's endpoint).
            let rc = unsafe { sys::fmx_fi_av_insert(self.av, n.as_ptr().cast(), 1, &raw mut a, 0, ptr::null_mut()) };
            if rc != 1 {
                return Err(fail(&format!("fi_av_insert of rank {r}'s address"), &self.provider, i64::from(rc.min(-1))));
            }
            out.push(a);
        }
        Ok(out)
    }

    /// The endpoint (null after [`Fabric::close_endpoint`]).
    pub(crate) fn ep(&self) -> *mut fid_ep {
        self.ep.load(Ordering::Relaxed)
    }

    /// Closes the endpoint first, before the memory its posted operations
    /// point into goes away; closing cancels them.
    pub(crate) fn close_endpoint(&self) {
        let ep = self.ep.swap(ptr::null_mut(), Ordering::Relaxed);
        if !ep.is_null() {
            // SAFETY: opened by us; the swap makes this the only close.
            unsafe { sys::fmx_fi_close(as_fid(ep)) };
        }
    }

    pub(crate) fn cq(&self) -> *mut fid_cq {
        self.cq
    }

    /// Registers `[buf, buf+len)` for `access` (FI_SEND/FI_RECV/FI_READ/FI_WRITE/FI_REMOTE_*).
    pub fn register(self: &Arc<Self>, buf: *const u8, len: usize, access: u64) -> Result<Mr, TransportError> {
        let requested = if self.mr_mode.prov_key { 0 } else { self.next_key.fetch_add(1, Ordering::Relaxed) };
        let mut mr: *mut fid_mr = ptr::null_mut();
        // SAFETY: the caller keeps the memory mapped until the returned Mr is dropped.
        let rc = unsafe { sys::fmx_fi_mr_reg(self.domain, buf.cast(), len, access, 0, requested, 0, &raw mut mr, ptr::null_mut()) };
        if rc != 0 {
            return Err(TransportError::Setup {
                what: format!("fi_mr_reg of {len} bytes (libfabric provider {})", self.provider),
                source: std::io::Error::other(strerror(i64::from(rc))),
            });
        }
        let region = Mr { mr, desc: ptr::null_mut(), key: 0, base: buf as u64, len, remote_base: 0, _fabric: self.clone() };
        if self.mr_mode.endpoint {
            // SAFETY: `mr` was just registered; binding to our endpoint and enabling is the FI_MR_ENDPOINT sequence.
            unsafe {
                check("fi_mr_bind", &self.provider, sys::fmx_fi_mr_bind(mr, as_fid(self.ep()), 0))?;
                check("fi_mr_enable", &self.provider, sys::fmx_fi_mr_enable(mr))?;
            }
        }
        let mut region = region;
        // SAFETY: `mr` is a live, enabled region.
        unsafe {
            region.desc = sys::fmx_fi_mr_desc(mr);
            region.key = sys::fmx_fi_mr_key(mr);
        }
        if region.key == u64::MAX {
            // FI_KEY_NOTAVAIL: raw keys, which fmx does not ask for.
            return Err(fail("fi_mr_key (raw keys are not supported)", &self.provider, -i64::from(sys::FI_ENOSYS)));
        }
        region.remote_base = if self.mr_mode.virt_addr { buf as u64 } else { 0 };
        Ok(region)
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.close_endpoint();
        for f in [as_fid(self.av), as_fid(self.cq), as_fid(self.domain), as_fid(self.fabric)] {
            if !f.is_null() {
                // SAFETY: each object was opened by us and is closed once, dependants first.
                unsafe { sys::fmx_fi_close(f) };
            }
        }
    }
}

/// A registered memory region; deregistered on drop.
pub struct Mr {
    mr: *mut fid_mr,
    /// Local descriptor for data-path calls (null where the provider needs none).
    pub desc: *mut c_void,
    /// The key a peer uses.
    pub key: u64,
    /// Start address in our address space.
    pub base: u64,
    /// Bytes covered.
    pub len: usize,
    /// What a peer addresses the start as: `base` with FI_MR_VIRT_ADDR, else 0.
    pub remote_base: u64,
    /// The domain outlives its regions.
    _fabric: Arc<Fabric>,
}

// SAFETY: a region handle; used by the thread that drives its endpoint.
unsafe impl Send for Mr {}

impl fmx_transport::rdma::Region for Mr {
    fn start(&self) -> u64 {
        self.base
    }
    fn covers(&self, addr: u64, len: usize) -> bool {
        addr >= self.base && addr + len as u64 <= self.base + self.len as u64
    }
}

impl fmx_transport::rdma::Registration for Mr {
    type Desc = *mut c_void;
    const NO_DESC: *mut c_void = ptr::null_mut();
    fn desc(&self) -> *mut c_void {
        self.desc
    }
    fn remote_key(&self) -> u64 {
        self.key
    }
    fn remote_addr(&self, addr: u64) -> u64 {
        Mr::remote_addr(self, addr)
    }
}

impl Mr {
    /// The address a peer uses for our `addr`.
    pub fn remote_addr(&self, addr: u64) -> u64 {
        self.remote_base + (addr - self.base)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the region was registered by Fabric::register and is closed once.
        unsafe { sys::fmx_fi_close(as_fid(self.mr)) };
    }
}
