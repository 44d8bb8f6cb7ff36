//! A pool of equal-sized buffers carved out of registered memory chunks.
//!
//! Chunks are anonymous memory maps (memmap2), optionally backed by 2 MiB huge
//! pages; each chunk is registered once through the transport's
//! [`RegistrationHook`] (verbs: `ibv_reg_mr`, libfabric: `fi_mr_reg`, shared
//! memory: nothing), like libfabric's `ofi_bufpool` `alloc_fn` and UCX's
//! `chunk_alloc`. A [`Lease`] is one buffer; it goes back with
//! [`Pool::release`]. No lock: a pool belongs to one endpoint.

use crate::TransportError;
use memmap2::{MmapMut, MmapOptions};

/// Registers pool chunks with a device; the handle carries the keys.
pub trait RegistrationHook {
    /// What registration yields (e.g. a memory region with lkey/rkey).
    type Handle;
    /// Registers `chunk` for local and remote access.
    fn register(&mut self, chunk: &mut [u8]) -> Result<Self::Handle, TransportError>;
    /// Releases a registration made by `register`.
    fn deregister(&mut self, handle: Self::Handle);
}

/// For transports that need no registration (shared memory, loopback).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoRegistration;

impl RegistrationHook for NoRegistration {
    type Handle = ();
    fn register(&mut self, _chunk: &mut [u8]) -> Result<(), TransportError> {
        Ok(())
    }
    fn deregister(&mut self, _handle: ()) {}
}

/// Whether chunks should use 2 MiB huge pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Normal pages only.
    Never,
    /// Huge pages from the reserved pool (`vm.nr_hugepages`) when it has room,
    /// else normal pages with a transparent-huge-page hint.
    Try,
}

/// Sizing of a pool.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    /// Bytes per buffer (rounded up to 64).
    pub buf_size: usize,
    /// Buffers per chunk.
    pub bufs_per_chunk: usize,
    /// The most chunks the pool grows to; `lease` answers `None` past that.
    pub max_chunks: usize,
    /// Huge-page policy.
    pub huge_pages: HugePages,
}

const HUGE_PAGE: usize = 2 << 20;
const LINE: usize = 64;

struct Chunk<H> {
    map: MmapMut,
    handle: Option<H>,
    huge: bool,
}

/// One buffer of a pool; not `Clone`: exactly one owner until released.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    chunk: u32,
    slot: u32,
}

/// The pool.
pub struct Pool<H: RegistrationHook> {
    cfg: PoolConfig,
    hook: H,
    chunks: Vec<Chunk<H::Handle>>,
    free: Vec<Lease>,
    leased: usize,
}

impl<H: RegistrationHook> Pool<H> {
    /// A pool with no chunk yet; the first `lease` maps and registers one.
    pub fn new(mut cfg: PoolConfig, hook: H) -> Self {
        cfg.buf_size = cfg.buf_size.max(1).next_multiple_of(LINE);
        cfg.bufs_per_chunk = cfg.bufs_per_chunk.max(1);
        Self { cfg, hook, chunks: Vec::new(), free: Vec::new(), leased: 0 }
    }

    fn grow(&mut self) -> Result<bool, TransportError> {
        if self.chunks.len() >= self.cfg.max_chunks {
            return Ok(false);
        }
        let bytes = self.cfg.buf_size * self.cfg.bufs_per_chunk;
        let (mut map, huge) = map_chunk(bytes, self.cfg.huge_pages)?;
        let handle = self.hook.register(&mut map[..])?;
        let chunk = self.chunks.len() as u32;
        self.chunks.push(Chunk { map, handle: Some(handle), huge });
        self.free.extend((0..self.cfg.bufs_per_chunk as u32).rev().map(|slot| Lease { chunk, slot }));
        Ok(true)
    }

    /// A free buffer, growing the pool when needed; `None` when it is at `max_chunks`.
    pub fn lease(&mut self) -> Result<Option<Lease>, TransportError> {
        if self.free.is_empty() && !self.grow()? {
            return Ok(None);
        }
        let l = self.free.pop();
        if l.is_some() {
            self.leased += 1;
        }
        Ok(l)
    }

    /// Gives a buffer back.
    pub fn release(&mut self, lease: Lease) {
        debug_assert!((lease.chunk as usize) < self.chunks.len());
        self.leased -= 1;
        self.free.push(lease);
    }

    fn range(&self, l: &Lease) -> std::ops::Range<usize> {
        let start = l.slot as usize * self.cfg.buf_size;
        start..start + self.cfg.buf_size
    }

    /// The leased buffer.
    pub fn buf(&self, l: &Lease) -> &[u8] {
        &self.chunks[l.chunk as usize].map[self.range(l)]
    }

    /// The leased buffer, writable.
    pub fn buf_mut(&mut self, l: &Lease) -> &mut [u8] {
        let r = self.range(l);
        &mut self.chunks[l.chunk as usize].map[r]
    }

    /// The registration of the chunk that holds `l` (its keys).
    pub fn handle(&self, l: &Lease) -> &H::Handle {
        self.chunks[l.chunk as usize].handle.as_ref().expect("registered while the pool lives")
    }

    /// Buffers currently leased.
    pub fn leased(&self) -> usize {
        self.leased
    }

    /// Bytes mapped by the pool.
    pub fn mapped_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.map.len()).sum()
    }

    /// Whether every chunk got explicit huge pages.
    pub fn on_huge_pages(&self) -> bool {
        !self.chunks.is_empty() && self.chunks.iter().all(|c| c.huge)
    }
}

impl<H: RegistrationHook> Drop for Pool<H> {
    fn drop(&mut self) {
        for c in &mut self.chunks {
            if let Some(h) = c.handle.take() {
                self.hook.deregister(h);
            }
        }
    }
}

/// Maps `bytes` of anonymous memory; with [`HugePages::Try`], explicit huge pages
/// when the reserved pool has them, else normal pages advised for THP.
/// Anonymous memory of at least `bytes`, with huge pages per `huge`; says
/// whether it came from the reserved huge-page pool.
pub fn map_chunk(bytes: usize, huge: HugePages) -> Result<(MmapMut, bool), TransportError> {
    let setup = |what: &str, source| TransportError::Setup { what: format!("mapping a {bytes}-byte pool chunk ({what})"), source };
    if huge == HugePages::Try {
        let len = bytes.next_multiple_of(HUGE_PAGE);
        #[cfg(target_os = "linux")]
        if let Ok(map) = MmapOptions::new().len(len).huge(Some(21)).map_anon() {
            return Ok((map, true));
        }
        let map = MmapOptions::new().len(len).map_anon().map_err(|e| setup("normal pages", e))?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage); // a hint; failure changes nothing
        return Ok((map, false));
    }
    let map = MmapOptions::new().len(bytes).map_anon().map_err(|e| setup("normal pages", e))?;
    Ok((map, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct CountingHook {
        registered: usize,
        deregistered: std::rc::Rc<std::cell::Cell<usize>>,
    }
    impl RegistrationHook for CountingHook {
        type Handle = usize;
        fn register(&mut self, chunk: &mut [u8]) -> Result<usize, TransportError> {
            chunk[0] = 1; // the memory is writable
            self.registered += 1;
            Ok(self.registered)
        }
        fn deregister(&mut self, _h: usize) {
            self.deregistered.set(self.deregistered.get() + 1);
        }
    }

    fn cfg(huge: HugePages) -> PoolConfig {
        PoolConfig { buf_size: 100, bufs_per_chunk: 4, max_chunks: 2, huge_pages: huge }
    }

    #[test]
    fn leases_are_distinct_bounded_and_reused() {
        let gone = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut p = Pool::new(cfg(HugePages::Never), CountingHook { registered: 0, deregistered: gone.clone() });
        let mut leases = Vec::new();
        while let Some(l) = p.lease().unwrap() {
            let tag = leases.len() as u8;
            p.buf_mut(&l).fill(tag);
            leases.push(l);
        }
        assert_eq!(leases.len(), 8, "2 chunks of 4");
        assert_eq!(p.buf(&leases[0]).len(), 128, "rounded to cache lines");
        for (i, l) in leases.iter().enumerate() {
            assert!(p.buf(l).iter().all(|&b| b == i as u8), "buffer {i} was overwritten");
        }
        assert_eq!(*p.handle(&leases[5]), 2, "second chunk, second registration");
        let l = leases.pop().unwrap();
        p.release(l);
        assert_eq!(p.leased(), 7);
        assert!(p.lease().unwrap().is_some());
        assert!(p.lease().unwrap().is_none());
        drop(p);
        assert_eq!(gone.get(), 2, "every chunk deregistered");
    }

    #[test]
    fn huge_pages_fall_back_cleanly() {
        let mut p = Pool::new(cfg(HugePages::Try), NoRegistration);
        let l = p.lease().unwrap().expect("a buffer");
        p.buf_mut(&l).fill(3);
        assert_eq!(p.mapped_bytes() % (2 << 20), 0);
        // With vm.nr_hugepages = 0 the explicit map fails and we get normal pages.
        let reserved = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap_or_default();
        if reserved.trim() == "0" {
            assert!(!p.on_huge_pages());
        }
    }
}
