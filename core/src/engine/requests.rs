//! Request slots: what each non-blocking operation is waiting for.

use std::rc::Rc;

use fmx_transport::RemoteKey;

use crate::error::Error;

/// A request handle inside the engine: slot index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ReqId {
    idx: u32,
    generation: u32,
}

impl ReqId {
    pub(crate) fn new(idx: u32, generation: u32) -> Self {
        Self { idx, generation }
    }

    /// The cookie that travels in RTS/FIN headers.
    pub(crate) fn cookie(self) -> u64 {
        (u64::from(self.idx) << 32) | u64::from(self.generation)
    }

    pub(crate) fn from_cookie(c: u64) -> Self {
        Self::new((c >> 32) as u32, c as u32)
    }

    pub(crate) fn index(self) -> u32 {
        self.idx
    }
}

/// What a completed operation reports (world ranks; the communicator translates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawStatus {
    pub(crate) src: u32,
    pub(crate) tag: u32,
    /// Bytes the sender sent.
    pub(crate) sent: u64,
    /// Bytes the receive buffer could hold (sent > capacity means truncated).
    pub(crate) capacity: u64,
}

/// Which processes an operation depends on (for failure detection).
#[derive(Clone, Debug)]
pub(crate) enum WaitsOn {
    /// One world rank.
    Peer(u32),
    /// Any of these world ranks (wildcard receive): reports each departed
    /// member once, fails when all are gone.
    AnyOf(Rc<[u32]>),
}

pub(crate) enum State {
    Pending,
    Done(RawStatus),
    Failed(Error),
}

pub(crate) struct Req {
    generation: u32,
    live: bool,
    pub(crate) state: State,
    pub(crate) waits_on: WaitsOn,
    /// A send's exposed buffer, revoked when the receiver says FIN.
    pub(crate) exposed: Option<RemoteKey>,
    /// What the operation is, for error messages.
    pub(crate) what: &'static str,
    /// Parts still to finish before the operation completes with `partial`
    /// (a split rendezvous finishes when both sides' halves are copied).
    pub(crate) parts_left: u8,
    /// The status to report once `parts_left` reaches zero.
    pub(crate) partial: Option<RawStatus>,
    /// A rendezvous send's buffer (the sender copies half of it on CTS).
    pub(crate) buf: Option<fmx_transport::lend::Lent>,
    /// A send whose data the engine owns (active messages): nobody waits for
    /// it, and the slot frees itself when the operation ends.
    pub(crate) owned: Option<Vec<u8>>,
    /// Members a wildcard receive has reported departed (each once).
    pub(crate) reported: Vec<u32>,
    /// When a liveness check first found the operation still waiting.
    pub(crate) idle_since: Option<std::time::Instant>,
    /// A collective's receive: its context and tag.
    pub(crate) coll: Option<(u32, u32)>,
}

/// The slab of requests.
#[derive(Default)]
pub(crate) struct Requests {
    slots: Vec<Req>,
    free: Vec<u32>,
}

impl Requests {
    pub(crate) fn insert(&mut self, waits_on: WaitsOn, what: &'static str) -> ReqId {
        if let Some(idx) = self.free.pop() {
            let r = &mut self.slots[idx as usize];
            r.live = true;
            r.state = State::Pending;
            r.waits_on = waits_on;
            r.exposed = None;
            r.what = what;
            r.parts_left = 1;
            r.partial = None;
            r.buf = None;
            r.owned = None;
            r.reported.clear();
            r.idle_since = None;
            r.coll = None;
            ReqId::new(idx, r.generation)
        } else {
            self.slots.push(Req {
                generation: 0,
                live: true,
                state: State::Pending,
                waits_on,
                exposed: None,
                what,
                parts_left: 1,
                partial: None,
                buf: None,
                owned: None,
                reported: Vec::new(),
                idle_since: None,
                coll: None,
            });
            ReqId::new(self.slots.len() as u32 - 1, 0)
        }
    }

    pub(crate) fn get_mut(&mut self, id: ReqId) -> Option<&mut Req> {
        self.slots.get_mut(id.idx as usize).filter(|r| r.live && r.generation == id.generation)
    }

    pub(crate) fn get(&self, id: ReqId) -> Option<&Req> {
        self.slots.get(id.idx as usize).filter(|r| r.live && r.generation == id.generation)
    }

    pub(crate) fn is_pending(&self, id: ReqId) -> bool {
        matches!(self.get(id).map(|r| &r.state), Some(State::Pending))
    }

    pub(crate) fn complete(&mut self, id: ReqId, st: RawStatus) {
        if let Some(r) = self.get_mut(id) {
            if r.owned.is_some() {
                self.discard(id);
            } else if matches!(r.state, State::Pending) {
                r.state = State::Done(st);
            }
        }
    }

    /// One part of a multi-part operation finished; completes it with its
    /// `partial` status (or `fallback`) when it was the last.
    pub(crate) fn part_done(&mut self, id: ReqId, fallback: RawStatus) {
        if let Some(r) = self.get_mut(id) {
            r.parts_left = r.parts_left.saturating_sub(1);
            if r.parts_left == 0 {
                let st = r.partial.unwrap_or(fallback);
                self.complete(id, st);
            }
        }
    }

    pub(crate) fn fail(&mut self, id: ReqId, e: Error) {
        if let Some(r) = self.get_mut(id) {
            if r.owned.is_some() {
                // Nobody waits for an owned send; its failure shows in the peer's state.
                self.discard(id);
            } else if matches!(r.state, State::Pending) {
                r.state = State::Failed(e);
            }
        }
    }

    /// Frees a finished request and hands back its outcome; `None` if the id is stale.
    pub(crate) fn take(&mut self, id: ReqId) -> Option<Result<RawStatus, Error>> {
        let r = self.get_mut(id)?;
        let out = match std::mem::replace(&mut r.state, State::Pending) {
            State::Pending => return None,
            State::Done(s) => Ok(s),
            State::Failed(e) => Err(e),
        };
        r.live = false;
        r.generation = r.generation.wrapping_add(1);
        self.free.push(id.idx);
        Some(out)
    }

    /// Frees a request whatever its state (cancel).
    pub(crate) fn discard(&mut self, id: ReqId) {
        if let Some(r) = self.get_mut(id) {
            r.live = false;
            r.state = State::Pending;
            r.owned = None;
            r.generation = r.generation.wrapping_add(1);
            self.free.push(id.idx);
        }
    }
}
