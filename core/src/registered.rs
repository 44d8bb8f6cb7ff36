//! Registered buffers: memory fmx allocates and registers once with the
//! transport, for the buffer's whole lifetime. Sending from or receiving into
//! one never registers anything per operation (the verbs transport looks the
//! address up); plain slices are registered per operation or bounced, so no
//! allocator hook and no stale-registration cache is needed.

use std::rc::Rc;

use bytemuck::{AnyBitPattern, NoUninit};
use fmx_transport::pool::{map_chunk, HugePages};
use fmx_transport::Endpoint;
use memmap2::MmapMut;

use crate::comm::Shared;
use crate::error::{Error, Result};

/// A `[T]` in registered memory (page-aligned, zero-initialized). Derefs to a slice.
pub struct Registered<T> {
    map: Option<MmapMut>,
    len: usize,
    sh: Rc<Shared>,
    _t: std::marker::PhantomData<T>,
}

impl<T: AnyBitPattern + NoUninit> Registered<T> {
    pub(crate) fn new(sh: &Rc<Shared>, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| Error::InvalidCount {
            what: "registered buffer length",
            detail: format!("a registered buffer of {len} elements of {} bytes overflows", std::mem::size_of::<T>()),
        })?;
        // From 2 MiB, huge pages (reserved, else a transparent-huge-page hint):
        // fewer pages to pin for a single copy, fewer TLB misses.
        let huge = if bytes >= 2 << 20 { HugePages::Try } else { HugePages::Never };
        let (map, _) = map_chunk(bytes.max(1), huge)?;
        sh.engine.borrow_mut().tp.register_owned(&map[..bytes])?;
        Ok(Self { map: Some(map), len, sh: sh.clone(), _t: std::marker::PhantomData })
    }

    fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<T: AnyBitPattern + NoUninit> std::ops::Deref for Registered<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let map = self.map.as_ref().expect("mapped until drop");
        bytemuck::cast_slice(&map[..self.bytes()])
    }
}

impl<T: AnyBitPattern + NoUninit> std::ops::DerefMut for Registered<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let n = self.bytes();
        let map = self.map.as_mut().expect("mapped until drop");
        bytemuck::cast_slice_mut(&mut map[..n])
    }
}

impl<T> Drop for Registered<T> {
    fn drop(&mut self) {
        let Some(map) = self.map.take() else { return };
        let bytes = self.len * std::mem::size_of::<T>();
        match self.sh.engine.try_borrow_mut() {
            Ok(mut e) => {
                e.tp.deregister_owned(&map[..bytes]);
                drop(map);
            }
            // Dropped while the engine is busy (inside a handler): the device may
            // still address this memory, so it is leaked rather than unmapped.
            Err(_) => std::mem::forget(map),
        }
    }
}
