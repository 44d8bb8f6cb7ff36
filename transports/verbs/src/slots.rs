//! The registrations that cover the receive slots. Eagerly one covers the
//! whole region (every slot is posted at init). Lazily each connection's
//! grant is registered when the connection is made: registering pins
//! memory, and pinned memory must grow with the peers a process talks to,
//! not with the job.

use std::ops::Range;
use std::sync::Arc;

use fmx_transport::{PeerId, TransportError};

use crate::sys::{Access, Mr, Pd};

/// Registered stretches of the receive region, in slot order.
pub(crate) struct RecvRegions {
    /// Where slot 0 is.
    base: u64,
    slot_bytes: usize,
    /// Each registration and the slots it covers (ascending, disjoint).
    mrs: Vec<(Range<usize>, Mr)>,
}

impl RecvRegions {
    /// No slot registered yet; slots lie at `base + i × slot_bytes`.
    pub(crate) fn new(base: *const u8, slot_bytes: usize) -> Self {
        Self { base: base as u64, slot_bytes, mrs: Vec::new() }
    }

    /// Registers `slots` (granted to `peer`) for the device to write into;
    /// `false` when they already are.
    pub(crate) fn register(&mut self, pd: &Arc<Pd>, peer: PeerId, slots: Range<usize>) -> Result<bool, TransportError> {
        if slots.is_empty() || self.mrs.iter().any(|(r, _)| r.start < slots.end && slots.start < r.end) {
            return Ok(false);
        }
        let addr = (self.base + (slots.start * self.slot_bytes) as u64) as *const u8;
        let mr = Mr::register(pd, addr, slots.len() * self.slot_bytes, Access::Local).map_err(|source| TransportError::Io {
            op: "register receive slots",
            peer,
            source,
        })?;
        let at = self.mrs.partition_point(|(r, _)| r.end <= slots.start);
        self.mrs.insert(at, (slots, mr));
        Ok(true)
    }

    /// Slot `slot`'s address and the lkey that covers it (`None`: not registered).
    pub(crate) fn slot(&self, slot: usize) -> Option<(u64, u32)> {
        let (r, mr) = match self.mrs.as_slice() {
            [one] => one,
            many => many.get(many.partition_point(|(r, _)| r.end <= slot))?,
        };
        r.contains(&slot).then(|| (self.base + (slot * self.slot_bytes) as u64, mr.lkey()))
    }

    /// How many registrations there are (one eagerly; one per connection lazily).
    pub(crate) fn count(&self) -> usize {
        self.mrs.len()
    }
}
