//! Registration by ownership, not by interception: buffers the core
//! allocates and keeps (registered buffers) are registered once, for their
//! lifetime, and looked up here by address. Nothing else is cached, so no
//! malloc/munmap hook is needed and a freed-and-reused address can never hit
//! a stale registration: plain slices are registered per operation or
//! copied through bounce buffers.

use std::collections::BTreeMap;

use crate::sys::Mr;

/// Keys of a lookup hit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owned {
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// The core's registered buffers, by start address.
#[derive(Default)]
pub(crate) struct Registry {
    regions: BTreeMap<u64, Mr>,
}

impl Registry {
    pub(crate) fn insert(&mut self, mr: Mr) {
        self.regions.insert(mr.addr, mr);
    }

    /// Deregisters the buffer starting at `addr` (before its memory is freed).
    pub(crate) fn remove(&mut self, addr: u64) {
        self.regions.remove(&addr);
    }

    /// The registration covering `[addr, addr+len)`, if one does.
    pub(crate) fn find(&self, addr: u64, len: usize) -> Option<Owned> {
        let (_, mr) = self.regions.range(..=addr).next_back()?;
        mr.covers(addr, len).then(|| Owned { lkey: mr.lkey(), rkey: mr.rkey() })
    }
}
