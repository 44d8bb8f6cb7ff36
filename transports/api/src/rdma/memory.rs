//! The memory a device reaches, decided once for every RDMA device: buffers
//! registered for their lifetime (the registry), exposures, the local side of
//! one-sided operations, and bounce buffers for small plain slices. The
//! device only registers ([`super::RdmaDevice::register`]); which memory is
//! registered, copied or used as it is is decided here.

use std::collections::HashMap;

use super::{Region, Registry};
use crate::pool::{HugePages, Lease, Pool, PoolConfig, RegistrationHook};
use crate::{RemoteKey, TransportError};

/// Plain slices up to this size go through bounce buffers by default.
pub const DEFAULT_BOUNCE_BYTES: usize = 64 << 10;

/// What a registration is for; each device maps it to its access flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The local side of a read: the device writes into it.
    ReadInto,
    /// The local side of a write: the device reads from it.
    WriteFrom,
    /// Exposed for peers to read.
    PeerReads,
    /// Exposed for peers to write.
    PeerWrites,
    /// Every use: a buffer registered for its lifetime, a bounce chunk.
    Any,
}

/// A device's registration as the core uses it.
pub trait Registration: Region {
    /// What a piece names its local memory by (an lkey, a libfabric `desc`).
    type Desc: Copy;
    /// The descriptor of memory that needs none (a provider without `FI_MR_LOCAL`).
    const NO_DESC: Self::Desc;
    /// Its descriptor.
    fn desc(&self) -> Self::Desc;
    /// The key peers use.
    fn remote_key(&self) -> u64;
    /// The address peers use for our `addr` inside it (the address itself,
    /// or an offset where the provider wants one).
    fn remote_addr(&self, addr: u64) -> u64;
}

/// The local side of a one-sided operation, kept until its report.
pub enum Local<M> {
    /// Registered for its lifetime, or memory the device needs no registration for.
    Ready,
    /// Registered for this operation; deregistered when it ends.
    PerOp(M),
    /// Copied through a bounce buffer.
    Bounce {
        /// The bounce buffer.
        lease: Lease,
        /// The user's buffer of a read, copied into when it succeeds.
        dst: Option<Dst>,
    },
}

/// A user's buffer that a bounce buffer is copied into at the end.
pub struct Dst(*mut u8, usize);

// SAFETY: the buffer is lent to the endpoint until the operation's report or
// the exposure's end (the promise of the unsafe `Endpoint` methods), and only
// the endpoint that owns this writes through it, from whichever thread drives it.
unsafe impl Send for Dst {}

/// What backs a key handed out by `expose`.
enum Exposure<M> {
    PerOp(M),
    /// The peer reads or writes the bounce buffer; a writable one is copied
    /// to `dst` when the exposure ends.
    Bounce {
        lease: Lease,
        dst: Option<Dst>,
    },
}

/// How the core came by memory for an operation or exposure (for the stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// A buffer registered for its lifetime.
    Owned,
    /// Nothing was needed (an empty buffer; a device without local registration).
    Plain,
    /// A bounce buffer.
    Bounced,
    /// A registration for this one use.
    PerOp,
}

/// The local side of an operation: address, descriptor, what to keep, how it was come by.
pub type LocalSide<M> = (u64, <M as Registration>::Desc, Local<M>, Path);

/// Registrations, exposures and bounce buffers of one endpoint.
pub struct Memory<H: RegistrationHook>
where
    H::Handle: Registration,
{
    /// By (peer-visible address, key): one buffer may be exposed several times at once.
    exposed: HashMap<(u64, u64), Exposure<H::Handle>>,
    registry: Registry<H::Handle>,
    bounce: Pool<H>,
    bounce_max: usize,
    /// Whether the local side of an operation must be registered (verbs
    /// always; libfabric with `FI_MR_LOCAL`).
    local_registration: bool,
}

impl<H: RegistrationHook> Memory<H>
where
    H::Handle: Registration,
{
    /// Plain slices up to `bounce_max` bytes (0: none) are copied through
    /// buffers of chunks that `hook` registers for [`Access::Any`].
    pub fn new(hook: H, bounce_max: usize, local_registration: bool) -> Self {
        let cfg = PoolConfig { buf_size: bounce_max.max(64), bufs_per_chunk: 8, max_chunks: 8, huge_pages: HugePages::Never };
        Self { exposed: HashMap::new(), registry: Registry::default(), bounce: Pool::new(cfg, hook), bounce_max, local_registration }
    }

    /// Keeps a registration of an owned buffer until [`Memory::remove_owned`].
    pub fn insert_owned(&mut self, mr: H::Handle) {
        self.registry.insert(mr);
    }

    /// Forgets (deregisters) the owned buffer starting at `addr`.
    pub fn remove_owned(&mut self, addr: u64) {
        self.registry.remove(addr);
    }

    /// The registration of an owned buffer covering `[addr, addr+len)`.
    pub fn owned(&self, addr: u64, len: usize) -> Option<&H::Handle> {
        self.registry.find(addr, len)
    }

    /// A bounce buffer for `len` bytes, if plain slices that small bounce and one is free.
    fn lease(&mut self, len: usize) -> Result<Option<Lease>, TransportError> {
        if len > self.bounce_max {
            return Ok(None);
        }
        self.bounce.lease()
    }

    /// The local side of an operation on `[local, local+len)`: the address
    /// the device moves from or to, its descriptor, what to keep until the
    /// report, and how it was come by. `None`: nothing serves but a
    /// registration for this operation ([`Memory::registered_local`]).
    ///
    /// # Safety
    /// `local` is valid for `len` bytes (read for a write, written for a
    /// read) until [`Memory::finish_local`] runs with what this returned.
    pub unsafe fn local_side(&mut self, local: *mut u8, len: usize, read: bool) -> Result<Option<LocalSide<H::Handle>>, TransportError> {
        let addr = local as u64;
        if let Some(mr) = self.registry.find(addr, len) {
            return Ok(Some((addr, mr.desc(), Local::Ready, Path::Owned)));
        }
        if !self.local_registration {
            return Ok(Some((addr, <H::Handle as Registration>::NO_DESC, Local::Ready, Path::Plain)));
        }
        let Some(lease) = self.lease(len)? else { return Ok(None) };
        let buf = self.bounce.buf_mut(&lease);
        if !read {
            // SAFETY: `local` is valid for `len` bytes (the caller's
            // promise); the bounce buffer holds at least `bounce_max >= len`.
            unsafe { std::ptr::copy_nonoverlapping(local, buf.as_mut_ptr(), len) };
        }
        let base = buf.as_ptr() as u64;
        let desc = self.bounce.handle(&lease).desc();
        Ok(Some((base, desc, Local::Bounce { lease, dst: read.then_some(Dst(local, len)) }, Path::Bounced)))
    }

    /// The local side of an operation on `local`, registered for it as `mr`.
    pub fn registered_local(local: *mut u8, mr: H::Handle) -> LocalSide<H::Handle> {
        (local as u64, mr.desc(), Local::PerOp(mr), Path::PerOp)
    }

    /// What an access for the local side of an operation needs.
    pub fn local_access(read: bool) -> Access {
        if read {
            Access::ReadInto
        } else {
            Access::WriteFrom
        }
    }

    /// Ends the local side of a finished operation: a bounce buffer of a
    /// read that succeeded is copied into the user's buffer; a registration
    /// for the operation is dropped.
    pub fn finish_local(&mut self, local: Local<H::Handle>, succeeded: bool) {
        match local {
            Local::Bounce { lease, dst } => {
                if let (Some(Dst(dst, len)), true) = (dst, succeeded) {
                    let src = self.bounce.buf(&lease);
                    // SAFETY: `dst` is the read's local buffer, valid and
                    // untouched until this report (`local_side`'s contract).
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
                }
                self.bounce.release(lease);
            }
            Local::PerOp(mr) => drop(mr),
            Local::Ready => {}
        }
    }

    /// A key through which peers read (or, when `writable`, write)
    /// `[ptr, ptr+len)`, and how it was come by. `None`: nothing serves but a
    /// registration for this exposure ([`Memory::expose_registered`]).
    ///
    /// # Safety
    /// `ptr` is valid for `len` bytes (and writable when `writable`) until
    /// [`Memory::end_exposure`] of the returned key.
    pub unsafe fn expose(&mut self, ptr: *mut u8, len: usize, writable: bool) -> Result<Option<(RemoteKey, Path)>, TransportError> {
        let addr = ptr as u64;
        if len == 0 {
            // Nothing to reach: an empty one-sided operation never posts.
            return Ok(Some((RemoteKey { addr, len: 0, key: 0 }, Path::Plain)));
        }
        if let Some(mr) = self.registry.find(addr, len) {
            return Ok(Some((RemoteKey { addr: mr.remote_addr(addr), len: len as u64, key: mr.remote_key() }, Path::Owned)));
        }
        let Some(lease) = self.lease(len)? else { return Ok(None) };
        let b = self.bounce.buf_mut(&lease);
        if !writable {
            // SAFETY: `ptr` is valid for `len` bytes (the caller's promise);
            // the bounce buffer holds at least `bounce_max >= len`.
            unsafe { std::ptr::copy_nonoverlapping(ptr, b.as_mut_ptr(), len) };
        }
        let at = b.as_ptr() as u64;
        let mr = self.bounce.handle(&lease);
        let key = RemoteKey { addr: mr.remote_addr(at), len: len as u64, key: mr.remote_key() };
        self.exposed.insert((key.addr, key.key), Exposure::Bounce { lease, dst: writable.then_some(Dst(ptr, len)) });
        Ok(Some((key, Path::Bounced)))
    }

    /// The key of `[ptr, ptr+len)`, registered for this exposure as `mr`
    /// (kept until [`Memory::end_exposure`]).
    pub fn expose_registered(&mut self, ptr: *mut u8, len: usize, mr: H::Handle) -> RemoteKey {
        let key = RemoteKey { addr: mr.remote_addr(ptr as u64), len: len as u64, key: mr.remote_key() };
        self.exposed.insert((key.addr, key.key), Exposure::PerOp(mr));
        key
    }

    /// What an access for an exposure needs.
    pub fn exposure_access(writable: bool) -> Access {
        if writable {
            Access::PeerWrites
        } else {
            Access::PeerReads
        }
    }

    /// Ends the exposure behind `key`: a bounce buffer peers wrote into is
    /// copied to the exposed buffer; a registration for it is dropped. An
    /// owned or empty buffer needs nothing.
    pub fn end_exposure(&mut self, key: &RemoteKey) {
        match self.exposed.remove(&(key.addr, key.key)) {
            Some(Exposure::PerOp(mr)) => drop(mr),
            Some(Exposure::Bounce { lease, dst }) => {
                if let Some(Dst(dst, len)) = dst {
                    let src = self.bounce.buf(&lease);
                    // SAFETY: `dst` is the exposed buffer, valid and writable
                    // until this end (`expose`'s contract).
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, len) };
                }
                self.bounce.release(lease);
            }
            None => {}
        }
    }

    /// Drops every exposure and registration (the device must no longer
    /// reach them: its queues are closed or in error).
    pub fn clear(&mut self) {
        for (_, e) in self.exposed.drain() {
            if let Exposure::Bounce { lease, .. } = e {
                self.bounce.release(lease);
            }
        }
        self.registry.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registration made of numbers: key 7 for pool chunks, 9 per operation.
    struct FakeMr {
        base: u64,
        len: usize,
        key: u64,
    }

    impl Region for FakeMr {
        fn start(&self) -> u64 {
            self.base
        }
        fn covers(&self, addr: u64, len: usize) -> bool {
            addr >= self.base && addr + len as u64 <= self.base + self.len as u64
        }
    }

    impl Registration for FakeMr {
        type Desc = u64;
        const NO_DESC: u64 = 0;
        fn desc(&self) -> u64 {
            self.key + 100
        }
        fn remote_key(&self) -> u64 {
            self.key
        }
        fn remote_addr(&self, addr: u64) -> u64 {
            addr
        }
    }

    struct Hook;
    impl RegistrationHook for Hook {
        type Handle = FakeMr;
        fn register(&mut self, chunk: &mut [u8]) -> Result<FakeMr, TransportError> {
            Ok(FakeMr { base: chunk.as_ptr() as u64, len: chunk.len(), key: 7 })
        }
        fn deregister(&mut self, _: FakeMr) {}
    }

    /// Exposes as the core does: what serves, else a registration (key 9).
    fn expose(m: &mut Memory<Hook>, buf: *mut u8, len: usize, writable: bool) -> (RemoteKey, Path) {
        // SAFETY: every test's buffer outlives its exposures, each ended in the test.
        match unsafe { m.expose(buf, len, writable) }.expect("expose") {
            Some(served) => served,
            None => (m.expose_registered(buf, len, FakeMr { base: buf as u64, len, key: 9 }), Path::PerOp),
        }
    }

    #[test]
    fn small_slices_bounce_large_ones_register_owned_ones_hit() {
        let mut m = Memory::new(Hook, 64, true);
        let mut small = [1u8; 32];
        let mut large = [2u8; 128];
        let (k, path) = expose(&mut m, small.as_mut_ptr(), 32, false);
        assert_eq!((path, k.key), (Path::Bounced, 7));
        assert_ne!(k.addr, small.as_ptr() as u64, "a copy is exposed, not the slice");
        m.end_exposure(&k);
        let (k, path) = expose(&mut m, large.as_mut_ptr(), 128, false);
        assert_eq!((path, k.key, k.addr), (Path::PerOp, 9, large.as_ptr() as u64));
        m.end_exposure(&k);
        m.insert_owned(FakeMr { base: large.as_ptr() as u64, len: 128, key: 5 });
        let (k, path) = expose(&mut m, large.as_mut_ptr().wrapping_add(8), 16, false);
        assert_eq!((path, k.key), (Path::Owned, 5));
        let (k, path) = expose(&mut m, large.as_mut_ptr(), 0, true);
        assert_eq!((path, k.len), (Path::Plain, 0));
    }

    #[test]
    fn a_bounced_writable_exposure_lands_in_the_buffer_when_it_ends() {
        let mut m = Memory::new(Hook, 64, true);
        let mut buf = [0u8; 16];
        let (k, _) = expose(&mut m, buf.as_mut_ptr(), 16, true);
        // The peer's write, into the bounce buffer.
        // SAFETY: `k` names 16 bytes of a leased bounce buffer.
        unsafe { std::ptr::write_bytes(k.addr as *mut u8, 0xab, 16) };
        assert_eq!(buf, [0u8; 16], "nothing lands before the exposure ends");
        m.end_exposure(&k);
        assert_eq!(buf, [0xab; 16]);
    }

    #[test]
    fn a_bounced_read_lands_only_when_it_succeeded() {
        let mut m = Memory::new(Hook, 64, true);
        let mut buf = [0u8; 8];
        for (succeeded, want) in [(false, 0u8), (true, 0xcd)] {
            // SAFETY: `buf` outlives the operation, finished below.
            let (at, desc, local, path) = unsafe { m.local_side(buf.as_mut_ptr(), 8, true) }.expect("local side").expect("a bounce buffer");
            assert_eq!((path, desc), (Path::Bounced, 107));
            // The device's read, into the bounce buffer.
            // SAFETY: `at` is 8 bytes of a leased bounce buffer.
            unsafe { std::ptr::write_bytes(at as *mut u8, 0xcd, 8) };
            m.finish_local(local, succeeded);
            assert_eq!(buf, [want; 8]);
        }
    }

    #[test]
    fn a_large_local_side_asks_for_a_registration() {
        let mut m = Memory::new(Hook, 64, true);
        let mut buf = [0u8; 128];
        // SAFETY: nothing is kept: the answer is "register it".
        assert!(unsafe { m.local_side(buf.as_mut_ptr(), 128, false) }.expect("local side").is_none());
    }

    #[test]
    fn without_local_registration_the_slice_is_used_as_it_is() {
        let mut m = Memory::new(Hook, 64, false);
        let mut buf = [0u8; 8];
        // SAFETY: `buf` outlives the operation, finished below.
        let (at, desc, local, path) = unsafe { m.local_side(buf.as_mut_ptr(), 8, false) }.expect("local side").expect("the slice");
        assert_eq!((at, desc, path), (buf.as_ptr() as u64, 0, Path::Plain));
        m.finish_local(local, true);
    }
}
