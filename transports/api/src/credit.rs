//! Credit-based flow control with Illinois Fast Messages' send rule. Pure
//! logic, no I/O: every transport keeps one [`PeerCredits`] per peer and asks
//! it before writing into the peer's receive slots.
//!
//! **The rule.** A process may send to every process that has sent to it, and
//! to every process with a smaller node ID. Each receiver owns a fixed pool of
//! `P` eager slots, laid out as one slice of `S = P / (N − 1)` slots per
//! possible peer (the job size `N` is known at start, as `maxnodes` is in FM's
//! `allallsync`). Until [`PeerCredits::reallocate`], a sender may use only the
//! first `c0` ("newcomer") slots of its slice: a newcomer with ID `i` holds `c0`
//! credits toward every `j < i` from the start; `j` gets its `c0` credits toward
//! `i` from the header of `i`'s first message. After everyone joined,
//! reallocation grants every peer its whole slice ("no one else will join"),
//! so eager receive memory stays `P × slot` bytes whatever `N` is.
//!
//! **Returns.** One credit per eager message. The receiver counts the slots
//! it released per sender and returns them piggybacked on any message it
//! sends to that sender (header fields), or in an explicit credit message once
//! `threshold` of them are owed and no reverse traffic carried them. Returns
//! are *cumulative totals* (modulo 2^16 for data, 2^8 for control), so the
//! newest one supersedes the older ones: the explicit credit message goes to
//! a per-sender credit mailbox that the transport drains at once and that a
//! newer total may overwrite (a store into shared memory, an RDMA WRITE, an
//! `fi_inject_write`). A credit return therefore never needs a credit itself:
//! no deadlock when both sides run dry at once, and no credit ping-pong.
//!
//! **Control reserve.** Rendezvous control messages (CTS, FIN) travel in a
//! separate reserve of `R` control slots per peer, so they never wait behind
//! exhausted eager credits; their credits come back the same ways.

/// Which reserve a message uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Eager data and rendezvous requests: the peer's slice of the pool.
    Data,
    /// Rendezvous control and credit messages: the control reserve.
    Ctrl,
}

impl Class {
    /// The reserve a message of `kind` travels in: rendezvous control (CTS,
    /// FIN) and credit messages use the control reserve, so they never wait
    /// behind exhausted eager credits.
    pub fn of(kind: crate::MsgKind) -> Self {
        match kind {
            crate::MsgKind::Eager | crate::MsgKind::Rts => Self::Data,
            crate::MsgKind::Cts | crate::MsgKind::Fin | crate::MsgKind::Credit | crate::MsgKind::Internal => Self::Ctrl,
        }
    }
}

/// What the rule and the credits say about sending now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// A credit was taken: send.
    Go,
    /// No credit now; it comes back when the peer releases slots.
    Backpressure,
    /// FM's send rule forbids it: the peer has a larger ID and has not sent to us yet.
    NotAllowed,
}

/// Sizing, the same for every peer of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditConfig {
    /// `S`: slots of the pool that belong to one peer (its slice).
    pub slice: u32,
    /// `c0`: slots of the slice usable before reallocation.
    pub newcomer: u32,
    /// `R`: control slots per peer (at least 2).
    pub ctrl: u32,
    /// Owed data credits that trigger an explicit credit message.
    pub threshold: u32,
}

impl CreditConfig {
    /// `pool` slots shared by `peers` peers; `newcomer` and `threshold` are
    /// clamped into `1..=slice`. Errors when the pool cannot give every peer a slot.
    pub fn for_pool(pool: u32, peers: u32, newcomer: u32, threshold: Option<u32>) -> Result<Self, String> {
        let peers = peers.max(1);
        let slice = pool / peers;
        if slice == 0 {
            return Err(format!("a pool of {pool} eager slots cannot give each of {peers} peers a slot"));
        }
        Ok(Self { slice, newcomer: newcomer.clamp(1, slice), ctrl: 2, threshold: threshold.unwrap_or(slice.div_ceil(2)).clamp(1, slice) })
    }

    /// [`CreditConfig::for_pool`] with `ctrl` control slots per peer, for a
    /// transport's setup: the error names the setting (`pool_var`) to raise.
    pub fn for_transport(
        pool: u32,
        peers: u32,
        newcomer: u32,
        threshold: Option<u32>,
        ctrl: u32,
        pool_var: &str,
    ) -> Result<Self, crate::TransportError> {
        let mut c = Self::for_pool(pool, peers, newcomer, threshold).map_err(|what| crate::TransportError::Setup {
            what: format!("{what} (set {pool_var} to at least {})", peers.max(1)),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
        c.ctrl = ctrl;
        Ok(c)
    }
}

/// Credits between us and one peer, both directions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerCredits {
    /// Data credits we hold toward the peer.
    data: u32,
    /// Control credits we hold toward the peer.
    ctrl: u32,
    /// The newest cumulative totals the peer returned to us (modular).
    seen_data: u16,
    seen_ctrl: u8,
    /// Cumulative totals we returned (or granted) to the peer.
    returned_data: u32,
    returned_ctrl: u32,
    /// Released (or granted) but not yet announced to the peer.
    owed_data: u32,
    owed_ctrl: u32,
    /// Data credits granted to the peer in our pool so far (`c0`, then `S`).
    granted: u32,
    /// The peer has sent to us.
    heard: bool,
    /// The peer has a smaller ID than ours.
    lower: bool,
    /// Reallocation granted the peer more than it has been told.
    announce: bool,
    /// Data credits still owed back after our window toward the peer shrank
    /// (see [`PeerCredits::resize`]): returns pay it off before they count.
    debt: u32,
    /// The peer's window in our pool when it shrank below the slice (0: the
    /// slice): returns are due at half of it, or they would never come.
    window: u32,
}

impl PeerCredits {
    /// The state at join time toward a peer with a smaller (`lower`) or larger ID.
    pub fn new(cfg: &CreditConfig, lower: bool) -> Self {
        Self {
            // Toward a smaller ID we start with its newcomer credits; toward a larger
            // one with nothing until its first message brings them.
            data: if lower { cfg.newcomer } else { 0 },
            ctrl: cfg.ctrl,
            // The c0 we hold toward a smaller ID is what its side counts as returned.
            seen_data: if lower { cfg.newcomer as u16 } else { 0 },
            seen_ctrl: 0,
            // A larger ID starts with our c0 (it counts as returned); a smaller ID
            // may not send to us until our first message grants it c0.
            returned_data: if lower { 0 } else { cfg.newcomer },
            returned_ctrl: 0,
            owed_data: if lower { cfg.newcomer } else { 0 },
            owed_ctrl: 0,
            granted: cfg.newcomer,
            heard: false,
            lower,
            announce: false,
            debt: 0,
            window: 0,
        }
    }

    /// Takes a credit of `class` if the rule and the credits allow.
    #[inline]
    pub fn try_take(&mut self, class: Class) -> Gate {
        if !self.lower && !self.heard && class == Class::Data {
            return Gate::NotAllowed;
        }
        let c = match class {
            Class::Data => &mut self.data,
            Class::Ctrl => &mut self.ctrl,
        };
        if *c == 0 {
            Gate::Backpressure
        } else {
            *c -= 1;
            Gate::Go
        }
    }

    /// What [`PeerCredits::try_take`] would answer, without taking.
    #[inline]
    pub fn peek(&self, class: Class) -> Gate {
        if !self.lower && !self.heard && class == Class::Data {
            return Gate::NotAllowed;
        }
        let c = match class {
            Class::Data => self.data,
            Class::Ctrl => self.ctrl,
        };
        if c == 0 {
            Gate::Backpressure
        } else {
            Gate::Go
        }
    }

    /// Announces everything owed: the cumulative totals to put in the header
    /// of a message to the peer.
    #[inline]
    pub fn piggyback(&mut self) -> (u16, u8) {
        self.announce = false;
        self.returned_data = self.returned_data.wrapping_add(self.owed_data);
        self.returned_ctrl = self.returned_ctrl.wrapping_add(self.owed_ctrl);
        self.owed_data = 0;
        self.owed_ctrl = 0;
        (self.returned_data as u16, self.returned_ctrl as u8)
    }

    /// The totals returned so far, announcing nothing new: what a first
    /// mailbox word carries before any slot was released.
    pub fn totals(&self) -> (u16, u8) {
        (self.returned_data as u16, self.returned_ctrl as u8)
    }

    /// The totals for an explicit credit message (the same as [`PeerCredits::piggyback`]).
    pub fn explicit(&mut self) -> (u16, u8) {
        self.piggyback()
    }

    /// A message from the peer arrived carrying its cumulative totals.
    #[inline]
    pub fn on_receive(&mut self, data_total: u16, ctrl_total: u8) {
        self.heard = true;
        self.on_credit(data_total, ctrl_total);
    }

    /// Totals from an explicit credit message (it does not count as hearing
    /// from the peer: it is not an application message).
    #[inline]
    pub fn on_credit(&mut self, data_total: u16, ctrl_total: u8) {
        let d = data_total.wrapping_sub(self.seen_data);
        if d != 0 && d < 0x8000 {
            let pay = u32::from(d).min(self.debt);
            self.debt -= pay;
            self.data += u32::from(d) - pay;
            self.seen_data = data_total;
        }
        let c = ctrl_total.wrapping_sub(self.seen_ctrl);
        if c != 0 && c < 0x80 {
            self.ctrl += u32::from(c);
            self.seen_ctrl = ctrl_total;
        }
    }

    /// We released a slot of `class` that the peer had written.
    #[inline]
    pub fn on_release(&mut self, class: Class) {
        match class {
            Class::Data => self.owed_data += 1,
            Class::Ctrl => self.owed_ctrl += 1,
        }
    }

    /// Whether an explicit credit message is due. Releases are returned
    /// explicitly only to peers that sent to us; the initial grant to a smaller
    /// ID rides on our first message (that is the rule: our first message is
    /// what lets it send to us).
    #[inline]
    pub fn wants_explicit(&self, cfg: &CreditConfig) -> bool {
        let threshold = if self.window > 0 { cfg.threshold.min(self.window.div_ceil(2)) } else { cfg.threshold };
        (self.heard || self.announce) && (self.owed_data >= threshold || self.owed_ctrl > 0 || (self.announce && self.owed_data > 0))
    }

    /// The peer now writes at most `window` slots of our pool: explicit
    /// returns fall due at half of it (a threshold above the window would
    /// leave the peer waiting forever).
    pub fn set_peer_window(&mut self, window: u32) {
        self.window = window.max(1);
    }

    /// Grants the peer the rest of its slice ("no one else will join").
    /// Returns the credits added; they travel with the next message or an explicit one.
    pub fn reallocate(&mut self, cfg: &CreditConfig) -> u32 {
        let add = cfg.slice - self.granted.min(cfg.slice);
        self.granted += add;
        self.owed_data += add;
        self.announce = add > 0;
        add
    }

    /// Our data window toward the peer changes from `old` to `new` slots (the
    /// receiver resized our share of its pool). Credits we hold shrink with it;
    /// what the window lost beyond them becomes a debt that the next returns
    /// pay off, so held + in flight never exceeds `new`.
    pub fn resize(&mut self, old: u32, new: u32) {
        if new >= old {
            let grow = new - old;
            let pay = grow.min(self.debt);
            self.debt -= pay;
            self.data += grow - pay;
        } else {
            let cut = old - new;
            let take = cut.min(self.data);
            self.data -= take;
            self.debt += cut - take;
        }
    }

    /// Returns everything owed to the peer at the next chance, below the
    /// threshold too (the peer waits for it after resizing its window).
    pub fn flush(&mut self) {
        self.announce = true;
    }

    /// Whether the rule lets us send data to the peer.
    pub fn allowed(&self) -> bool {
        self.lower || self.heard
    }

    /// Data credits held toward the peer.
    pub fn data_credits(&self) -> u32 {
        self.data
    }

    /// Control credits held toward the peer.
    pub fn ctrl_credits(&self) -> u32 {
        self.ctrl
    }

    /// Credits owed to the peer and not yet announced (data, control).
    pub fn owed(&self) -> (u32, u32) {
        (self.owed_data, self.owed_ctrl)
    }

    /// Data credits granted to the peer in our pool.
    pub fn granted(&self) -> u32 {
        self.granted
    }
}

pub mod mailbox;
#[cfg(test)]
mod model;

#[cfg(test)]
mod resize_tests {
    use super::*;

    #[test]
    fn a_shrunk_window_is_repaid_from_returns_before_credits_count() {
        let cfg = CreditConfig::for_pool(8, 1, 8, None).unwrap();
        let mut c = PeerCredits::new(&cfg, true);
        assert_eq!(c.data_credits(), 8);
        for _ in 0..5 {
            assert_eq!(c.try_take(Class::Data), Gate::Go);
        }
        // 3 held, 5 in flight; the window becomes 2: 3 held go, 3 more are owed.
        c.resize(8, 2);
        assert_eq!(c.data_credits(), 0);
        // The peer returns the 5: 3 repay the debt, 2 are usable: held + in flight = 2.
        c.on_credit(8 + 5, 0);
        assert_eq!(c.data_credits(), 2);
        c.resize(2, 4);
        assert_eq!(c.data_credits(), 4);
    }

    #[test]
    fn returns_fall_due_within_a_small_window() {
        let cfg = CreditConfig::for_pool(16, 1, 16, None).unwrap();
        let mut c = PeerCredits::new(&cfg, false);
        c.on_receive(0, 0);
        c.on_release(Class::Data);
        assert!(!c.wants_explicit(&cfg), "one owed credit is below the slice's threshold");
        c.set_peer_window(1);
        assert!(c.wants_explicit(&cfg), "with a one-slot window it is due at once");
    }
}
