//! A small safe `PMIx` client: what fmx's bootstrap needs from a `PMIx` server
//! (Open MPI's `mpirun`, `srun --mpi=pmix`, PRRTE), and no more.
//!
//! Rank, job size and namespace; the node of every rank (`PMIx_Resolve_nodes`
//! and `PMIx_Resolve_peers`); byte blobs through `PMIx_Put`, `PMIx_Commit`,
//! `PMIx_Fence` with data collection and `PMIx_Get`; `PMIx_Spawn`. The FFI
//! comes from the crate `pmix-sys` (bindgen over the system's `pmix.h`) and
//! stays inside this crate.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use pmix_sys as sys;

/// `PMIX_RANK_WILDCARD` (`UINT32_MAX-1`): job-level keys are read as this rank.
const RANK_WILDCARD: u32 = u32::MAX - 1;

/// A `PMIx` call that failed: which call, and `PMIx`'s status and its words.
#[derive(Debug, Clone)]
pub struct Error {
    /// The `PMIx` function (and key, where there is one).
    pub call: String,
    /// `PMIx`'s status code (negative).
    pub status: i32,
    /// `PMIx_Error_string` of the status.
    pub text: String,
}

impl Error {
    /// `PMIx` says the key or value is not there (`PMIX_ERR_NOT_FOUND`).
    pub fn not_found(&self) -> bool {
        self.status == sys::PMIX_ERR_NOT_FOUND
    }
    /// The server does not offer the operation (`PMIX_ERR_NOT_SUPPORTED`).
    pub fn not_supported(&self) -> bool {
        self.status == sys::PMIX_ERR_NOT_SUPPORTED
    }
    /// The operation ran past its `PMIX_TIMEOUT` (`PMIX_ERR_TIMEOUT`).
    pub fn timed_out(&self) -> bool {
        self.status == sys::PMIX_ERR_TIMEOUT
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} (PMIx status {})", self.call, self.text, self.status)
    }
}

impl std::error::Error for Error {}

/// Maps a `PMIx` status to a result.
fn check(status: sys::pmix_status_t, call: impl FnOnce() -> String) -> Result<(), Error> {
    if status == sys::PMIX_SUCCESS as sys::pmix_status_t {
        return Ok(());
    }
    // SAFETY: PMIx_Error_string returns a pointer to a static string (or null) for any status.
    let p = unsafe { sys::PMIx_Error_string(status) };
    let text = if p.is_null() {
        "unknown status".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated and static (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    Err(Error { call: call(), status, text })
}

fn cstring(what: &str, s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error { call: format!("{what} {s:?}"), status: sys::PMIX_ERR_BAD_PARAM, text: "holds a NUL byte".into() })
}

/// A connected `PMIx` client (`PMIx_Init` done; `PMIx_Finalize` on drop).
pub struct Client {
    me: sys::pmix_proc_t,
    nspace: String,
}

/// An info array whose entries carry plain values (bools and ints: no owned data to free).
struct Infos(Vec<sys::pmix_info_t>);

impl Infos {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn push<T>(&mut self, key: &[u8], value: &T, ty: u32) {
        // SAFETY: pmix_info_t is a plain C struct; all-zero is PMIX_INFO_CONSTRUCT's state.
        let mut info: sys::pmix_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: `key` is one of the bindings' NUL-terminated key constants; `value` points
        // to a live T of the PMIx type `ty` (bool or int), which PMIx_Info_load copies.
        let rc =
            unsafe { sys::PMIx_Info_load(&raw mut info, key.as_ptr().cast(), ptr::from_ref(value).cast(), ty as sys::pmix_data_type_t) };
        debug_assert_eq!(rc, sys::PMIX_SUCCESS as i32);
        self.0.push(info);
    }

    /// `PMIX_TIMEOUT` in seconds, when there is one (0 is `PMIx`'s "forever").
    fn timeout(mut self, secs: u32) -> Self {
        let secs = i32::try_from(secs).unwrap_or(i32::MAX);
        self.push(sys::PMIX_TIMEOUT, &secs, sys::PMIX_INT);
        self
    }

    fn ptr(&self) -> *const sys::pmix_info_t {
        if self.0.is_empty() {
            ptr::null()
        } else {
            self.0.as_ptr()
        }
    }
}

/// A value `PMIx` returned from `PMIx_Get`, released on drop.
struct Value(*mut sys::pmix_value_t);

impl Drop for Value {
    fn drop(&mut self) {
        // SAFETY: PMIx_Get handed us this value (malloc'd, ours to release): destruct frees
        // what it owns, and free(3) the struct itself (PMIX_VALUE_RELEASE).
        unsafe {
            sys::PMIx_Value_destruct(self.0);
            libc::free(self.0.cast());
        }
    }
}

impl Value {
    fn ty(&self) -> u32 {
        // SAFETY: the pointer came non-null from a successful PMIx_Get and lives until drop.
        u32::from(unsafe { (*self.0).type_ })
    }

    /// The value as an unsigned number, whatever integer type the server chose.
    fn as_u64(&self) -> Option<u64> {
        // SAFETY: the union member read is the one `type_` names (see above for the pointer).
        let d = unsafe { &(*self.0).data };
        // SAFETY: each arm reads the member its type tag names.
        unsafe {
            match self.ty() {
                sys::PMIX_UINT32 => Some(u64::from(d.uint32)),
                sys::PMIX_UINT16 => Some(u64::from(d.uint16)),
                sys::PMIX_UINT64 => Some(d.uint64),
                sys::PMIX_SIZE => Some(d.size as u64),
                sys::PMIX_UINT => Some(u64::from(d.uint)),
                sys::PMIX_INT => u64::try_from(d.integer).ok(),
                sys::PMIX_INT32 => u64::try_from(d.int32).ok(),
                sys::PMIX_PROC_RANK => Some(u64::from(d.rank)),
                _ => None,
            }
        }
    }

    fn as_bytes(&self) -> Option<Vec<u8>> {
        // SAFETY: as in as_u64.
        let d = unsafe { &(*self.0).data };
        match self.ty() {
            sys::PMIX_BYTE_OBJECT => {
                // SAFETY: a byte object's `bytes` holds `size` bytes (or is null when empty).
                let bo = unsafe { d.bo };
                if bo.bytes.is_null() || bo.size == 0 {
                    return Some(Vec::new());
                }
                // SAFETY: see above; the slice is copied before the value is released.
                Some(unsafe { std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size) }.to_vec())
            }
            sys::PMIX_STRING => {
                // SAFETY: a string value is NUL-terminated (or null).
                let s = unsafe { d.string };
                if s.is_null() {
                    return Some(Vec::new());
                }
                // SAFETY: see above.
                Some(unsafe { CStr::from_ptr(s) }.to_bytes().to_vec())
            }
            _ => None,
        }
    }

    fn as_bool(&self) -> Option<bool> {
        // SAFETY: the member read is the one the type tag names (see as_u64).
        (self.ty() == sys::PMIX_BOOL).then(|| unsafe { (*self.0).data.flag })
    }

    fn as_proc(&self) -> Option<(String, u32)> {
        if self.ty() != sys::PMIX_PROC {
            return None;
        }
        // SAFETY: the type tag says `proc_` is the member; it points to one pmix_proc_t or is null.
        let p = unsafe { (*self.0).data.proc_ };
        if p.is_null() {
            return None;
        }
        // SAFETY: see above.
        let p = unsafe { &*p };
        Some((nspace_string(&p.nspace), p.rank))
    }
}

fn nspace_string(ns: &sys::pmix_nspace_t) -> String {
    // SAFETY: a pmix_nspace_t is a char array that PMIx keeps NUL-terminated (it copies at most
    // PMIX_MAX_NSLEN bytes into PMIX_MAX_NSLEN+1); the read stops at the first NUL inside it.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(ns.as_ptr().cast(), ns.len()) };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn proc_of(nspace: &sys::pmix_nspace_t, rank: u32) -> sys::pmix_proc_t {
    sys::pmix_proc_t { nspace: *nspace, rank }
}

impl Client {
    /// `PMIx_Init`: connects to the server that started this process.
    pub fn init() -> Result<Self, Error> {
        // SAFETY: pmix_proc_t is plain data; all-zero is PMIX_PROC_CONSTRUCT's state.
        let mut me: sys::pmix_proc_t = unsafe { std::mem::zeroed() };
        // SAFETY: `me` is a valid out-pointer; no info entries.
        let rc = unsafe { sys::PMIx_Init(&raw mut me, ptr::null_mut(), 0) };
        check(rc, || "PMIx_Init".into())?;
        let nspace = nspace_string(&me.nspace);
        Ok(Self { me, nspace })
    }

    /// This process's rank in its namespace.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// The job's namespace (unique per job under its server).
    pub fn nspace(&self) -> &str {
        &self.nspace
    }

    fn get(&self, rank: u32, key: &[u8], timeout_s: Option<u32>) -> Result<Value, Error> {
        let who = proc_of(&self.me.nspace, rank);
        let infos = match timeout_s {
            Some(s) => Infos::new().timeout(s),
            None => Infos::new(),
        };
        let mut out: *mut sys::pmix_value_t = ptr::null_mut();
        // SAFETY: `who` and the infos outlive the call; `key` is NUL-terminated; `out` is a
        // valid out-pointer that PMIx fills with a value we release (Value's drop).
        let rc = unsafe { sys::PMIx_Get(&raw const who, key.as_ptr().cast(), infos.ptr(), infos.0.len(), &raw mut out) };
        let name = || {
            let k = String::from_utf8_lossy(key.strip_suffix(&[0]).unwrap_or(key)).into_owned();
            if rank == RANK_WILDCARD {
                format!("PMIx_Get({k})")
            } else {
                format!("PMIx_Get({k} of rank {rank})")
            }
        };
        check(rc, name)?;
        if out.is_null() {
            return Err(Error { call: name(), status: sys::PMIX_ERR_NOT_FOUND, text: "no value returned".into() });
        }
        Ok(Value(out))
    }

    fn get_u64(&self, rank: u32, key: &[u8]) -> Result<u64, Error> {
        let v = self.get(rank, key, None)?;
        v.as_u64().ok_or_else(|| Error {
            call: format!("PMIx_Get({})", String::from_utf8_lossy(key.strip_suffix(&[0]).unwrap_or(key))),
            status: sys::PMIX_ERR_TYPE_MISMATCH,
            text: format!("the value has PMIx type {}, not an integer", v.ty()),
        })
    }

    /// The number of processes in this job (`PMIX_JOB_SIZE`).
    pub fn job_size(&self) -> Result<u32, Error> {
        self.get_u64(RANK_WILDCARD, sys::PMIX_JOB_SIZE).map(|n| n as u32)
    }

    /// This process's rank among the job's processes on its node (`PMIX_LOCAL_RANK`).
    pub fn local_rank(&self) -> Result<u32, Error> {
        self.get_u64(self.me.rank, sys::PMIX_LOCAL_RANK).map(|n| n as u32)
    }

    /// The node index of every rank, in rank order: nodes numbered in the
    /// order `PMIx_Resolve_nodes` lists them, each rank placed by
    /// `PMIx_Resolve_peers`. A rank no node claims is an error naming it.
    pub fn nodes(&self, size: u32) -> Result<Vec<u32>, Error> {
        let mut list: *mut c_char = ptr::null_mut();
        // SAFETY: the nspace is NUL-terminated inside `me`; `list` is an out-pointer to a
        // malloc'd string we free below.
        let rc = unsafe { sys::PMIx_Resolve_nodes(self.me.nspace.as_ptr(), &raw mut list) };
        check(rc, || "PMIx_Resolve_nodes".into())?;
        let names = if list.is_null() {
            String::new()
        } else {
            // SAFETY: non-null and NUL-terminated (PMIx's contract); freed right after the copy.
            let s = unsafe { CStr::from_ptr(list) }.to_string_lossy().into_owned();
            // SAFETY: PMIx allocated it with malloc and hands ownership to the caller.
            unsafe { libc::free(list.cast::<c_void>()) };
            s
        };
        const UNPLACED: u32 = u32::MAX;
        let mut node_of = vec![UNPLACED; size as usize];
        for (index, name) in names.split(',').filter(|n| !n.is_empty()).enumerate() {
            let cname = cstring("PMIx_Resolve_peers: node", name)?;
            let mut procs: *mut sys::pmix_proc_t = ptr::null_mut();
            let mut n = 0usize;
            // SAFETY: valid NUL-terminated strings and out-pointers; PMIx gives us a malloc'd array.
            let rc = unsafe { sys::PMIx_Resolve_peers(cname.as_ptr(), self.me.nspace.as_ptr(), &raw mut procs, &raw mut n) };
            check(rc, || format!("PMIx_Resolve_peers({name})"))?;
            if !procs.is_null() {
                // SAFETY: `procs` holds `n` pmix_proc_t (PMIx's contract), read before it is freed.
                let peers = unsafe { std::slice::from_raw_parts(procs, n) };
                for p in peers {
                    if let Some(slot) = node_of.get_mut(p.rank as usize) {
                        *slot = index as u32;
                    }
                }
                // SAFETY: the array is ours to free (PMIX_PROC_FREE is free(3)); nothing else holds it.
                unsafe { libc::free(procs.cast::<c_void>()) };
            }
        }
        if let Some(r) = node_of.iter().position(|&n| n == UNPLACED) {
            return Err(Error {
                call: "PMIx_Resolve_peers".into(),
                status: sys::PMIX_ERR_NOT_FOUND,
                text: format!("rank {r} is on none of the job's nodes ({names})"),
            });
        }
        Ok(node_of)
    }

    /// Publishes `bytes` under `key` for every process of the job (`PMIX_GLOBAL`);
    /// visible to the others after [`Client::commit`] and a fence.
    pub fn put(&self, key: &str, bytes: &[u8]) -> Result<(), Error> {
        let ckey = cstring("PMIx_Put: key", key)?;
        let bo = sys::pmix_byte_object_t { bytes: bytes.as_ptr().cast_mut().cast(), size: bytes.len() };
        // SAFETY: pmix_value_t is plain data; all-zero is PMIX_VALUE_CONSTRUCT's state.
        let mut v: sys::pmix_value_t = unsafe { std::mem::zeroed() };
        // SAFETY: `bo` describes `bytes`, alive here; PMIx_Value_load copies them (it never writes
        // through the pointer), and the copy is released by the destruct below.
        let rc = unsafe { sys::PMIx_Value_load(&raw mut v, ptr::from_ref(&bo).cast(), sys::PMIX_BYTE_OBJECT as sys::pmix_data_type_t) };
        check(rc, || format!("PMIx_Value_load({key})"))?;
        // SAFETY: `v` is a loaded value that PMIx_Put copies; we release our copy after.
        let rc = unsafe { sys::PMIx_Put(sys::PMIX_GLOBAL as sys::pmix_scope_t, ckey.as_ptr(), &raw mut v) };
        // SAFETY: `v` was loaded above and is not used after.
        unsafe { sys::PMIx_Value_destruct(&raw mut v) };
        check(rc, || format!("PMIx_Put({key})"))
    }

    /// `PMIx_Commit`: sends what was put to the local server.
    pub fn commit(&self) -> Result<(), Error> {
        // SAFETY: no arguments; the client is initialized.
        check(unsafe { sys::PMIx_Commit() }, || "PMIx_Commit".into())
    }

    /// `PMIx_Fence_nb` over the whole job (with data collection when
    /// `collect`), with no deadline of its own: the caller polls the
    /// returned [`Fence`] and decides how long to wait, so that a long wait
    /// (a finalize barrier behind a slow rank) can watch for dead peers.
    pub fn fence_start(&self, collect: bool) -> Result<Fence, Error> {
        let mut infos = Infos::new();
        if collect {
            infos.push(sys::PMIX_COLLECT_DATA, &true, sys::PMIX_BOOL);
        }
        let all = proc_of(&self.me.nspace, sys::PMIX_RANK_WILDCARD);
        let state = Arc::new(AtomicI32::new(FENCE_PENDING));
        let for_callback = Arc::into_raw(Arc::clone(&state));
        // SAFETY: one proc and the infos, alive for the call (PMIx copies them before it
        // returns); the callback gets one reference to `state` that it releases (fence_done).
        let rc =
            unsafe { sys::PMIx_Fence_nb(&raw const all, 1, infos.ptr(), infos.0.len(), Some(fence_done), for_callback.cast_mut().cast()) };
        if rc != sys::PMIX_SUCCESS as i32 {
            // SAFETY: PMIx refused the request, so the callback will never run: the reference is ours again.
            drop(unsafe { Arc::from_raw(for_callback) });
            check(rc, || "PMIx_Fence_nb".into())?;
        }
        Ok(Fence { state, collect })
    }

    /// The bytes `rank` put under `key`.
    pub fn get_bytes(&self, rank: u32, key: &str, timeout_s: u32) -> Result<Vec<u8>, Error> {
        let mut k = key.as_bytes().to_vec();
        k.push(0);
        if k[..k.len() - 1].contains(&0) {
            return Err(cstring("PMIx_Get: key", key).unwrap_err());
        }
        let v = self.get(rank, &k, Some(timeout_s))?;
        v.as_bytes().ok_or_else(|| Error {
            call: format!("PMIx_Get({key} of rank {rank})"),
            status: sys::PMIX_ERR_TYPE_MISMATCH,
            text: format!("the value has PMIx type {}, not bytes", v.ty()),
        })
    }

    /// The process that spawned this job (`PMIX_PARENT_ID`), if one did.
    pub fn parent(&self) -> Option<(String, u32)> {
        self.get(self.me.rank, sys::PMIX_PARENT_ID, None).ok().and_then(|v| v.as_proc())
    }

    /// Whether the server says this job was started by `PMIx_Spawn`
    /// (`PMIX_SPAWNED`, or a `PMIX_PARENT_ID`). Not every server says so:
    /// Open MPI 4.1's mpirun gives neither.
    pub fn spawned(&self) -> bool {
        let flag = self.get(self.me.rank, sys::PMIX_SPAWNED, None).ok().and_then(|v| v.as_bool());
        let job_flag = || self.get(RANK_WILDCARD, sys::PMIX_SPAWNED, None).ok().and_then(|v| v.as_bool());
        flag.or_else(job_flag).unwrap_or(false) || self.parent().is_some()
    }

    /// `PMIx_Spawn`: starts `nprocs` processes of `program` with `args`, with
    /// `env` ("NAME=value") added to their environment; returns the new
    /// job's namespace.
    pub fn spawn(&self, program: &str, args: &[String], env: &[String], nprocs: u32) -> Result<String, Error> {
        let cmd = cstring("PMIx_Spawn: program", program)?;
        let mut owned = vec![cmd.clone()];
        for a in args {
            owned.push(cstring("PMIx_Spawn: argument", a)?);
        }
        let envs: Vec<CString> = env.iter().map(|e| cstring("PMIx_Spawn: environment entry", e)).collect::<Result<_, _>>()?;
        let mut argv: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr().cast_mut()).collect();
        argv.push(ptr::null_mut());
        let mut envp: Vec<*mut c_char> = envs.iter().map(|s| s.as_ptr().cast_mut()).collect();
        envp.push(ptr::null_mut());
        let app = sys::pmix_app_t {
            cmd: cmd.as_ptr().cast_mut(),
            argv: argv.as_mut_ptr(),
            env: envp.as_mut_ptr(),
            cwd: ptr::null_mut(),
            maxprocs: i32::try_from(nprocs).unwrap_or(i32::MAX),
            info: ptr::null_mut(),
            ninfo: 0,
        };
        // SAFETY: pmix_nspace_t is a char array; zeroed is an empty string.
        let mut ns: sys::pmix_nspace_t = unsafe { std::mem::zeroed() };
        // SAFETY: the app's strings and arrays (NULL-terminated) live until the call returns;
        // PMIx_Spawn only reads them and writes the new namespace into `ns`.
        let rc = unsafe { sys::PMIx_Spawn(ptr::null(), 0, &raw const app, 1, ns.as_mut_ptr()) };
        check(rc, || format!("PMIx_Spawn({program}, {nprocs} processes)"))?;
        Ok(nspace_string(&ns))
    }
}

/// The fence's state word while the server has not answered (`PMIx` statuses are 0 or negative).
const FENCE_PENDING: i32 = i32::MAX;

/// `PMIx_Fence_nb`'s completion callback: publishes the outcome.
///
/// # Safety
/// Only PMIx calls it, once per fence it accepted, with the `cbdata` that
/// `fence_start` passed (an `Arc<AtomicI32>` turned into a raw pointer).
unsafe extern "C" fn fence_done(status: sys::pmix_status_t, cbdata: *mut c_void) {
    // SAFETY: `cbdata` is the Arc::into_raw reference fence_start gave this callback, which
    // PMIx calls once per accepted request: taking it back here releases it exactly once.
    let state = unsafe { Arc::from_raw(cbdata.cast_const().cast::<AtomicI32>()) };
    state.store(status, Ordering::Release);
}

/// A fence in flight (see [`Client::fence_start`]).
pub struct Fence {
    state: Arc<AtomicI32>,
    collect: bool,
}

impl Fence {
    /// `None` while the fence is in flight, then its outcome.
    pub fn poll(&self) -> Option<Result<(), Error>> {
        match self.state.load(Ordering::Acquire) {
            FENCE_PENDING => None,
            rc => Some(check(rc, || if self.collect { "PMIx_Fence (collecting data)".into() } else { "PMIx_Fence".into() })),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: balances the PMIx_Init of `init`; nothing of ours is in flight.
        let _ = unsafe { sys::PMIx_Finalize(ptr::null(), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_pmix_words() {
        let e = check(sys::PMIX_ERR_NOT_FOUND, || "PMIx_Get(x)".into()).unwrap_err();
        assert!(e.not_found() && e.to_string().starts_with("PMIx_Get(x): "), "{e}");
        assert!(e.to_string().contains("NOT-FOUND") || e.to_string().to_lowercase().contains("not found"), "{e}");
        assert!(check(0, || unreachable!()).is_ok());
    }

    #[test]
    fn init_without_a_server_fails_with_an_error() {
        // No PMIx server started this test: init must fail cleanly, not hang or crash.
        if std::env::vars().any(|(k, _)| k.starts_with("PMIX_SERVER_URI")) {
            return;
        }
        let e = Client::init().err().expect("PMIx_Init without a server");
        assert!(e.call == "PMIx_Init" && e.status < 0, "{e}");
    }
}
