//! The core's registered buffers, found by address.

use std::collections::BTreeMap;

/// A registration that a lookup can hit.
pub trait Region {
    /// The first address it covers.
    fn start(&self) -> u64;
    /// Whether `[addr, addr+len)` lies inside.
    fn covers(&self, addr: u64, len: usize) -> bool;
}

/// Registration by ownership, not by interception: buffers the core
/// allocates and keeps (registered buffers) are registered once, for their
/// lifetime, and looked up here by address. Nothing else is cached, so no
/// malloc/munmap hook is needed and a freed-and-reused address can never hit
/// a stale registration: plain slices are registered per operation or
/// copied through bounce buffers.
pub struct Registry<M> {
    regions: BTreeMap<u64, M>,
}

impl<M> Default for Registry<M> {
    fn default() -> Self {
        Self { regions: BTreeMap::new() }
    }
}

impl<M: Region> Registry<M> {
    /// Keeps a registration until [`Registry::remove`].
    pub fn insert(&mut self, region: M) {
        self.regions.insert(region.start(), region);
    }

    /// Deregisters the buffer starting at `addr` (before its memory is freed).
    pub fn remove(&mut self, addr: u64) {
        self.regions.remove(&addr);
    }

    /// The registration covering `[addr, addr+len)`, if one does.
    pub fn find(&self, addr: u64, len: usize) -> Option<&M> {
        let (_, region) = self.regions.range(..=addr).next_back()?;
        region.covers(addr, len).then_some(region)
    }

    /// Deregisters everything.
    pub fn clear(&mut self) {
        self.regions.clear();
    }
}
