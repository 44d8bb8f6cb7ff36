//! A model of two processes exchanging messages through slot rings under
//! [`PeerCredits`]: eager data in the data slice, control messages (CTS/FIN)
//! in the control reserve, credits returned piggybacked or through the credit
//! mailbox (overwritten by newer totals). Property tests over random
//! interleavings and an exhaustive search of every interleaving for small windows.

use std::collections::{HashSet, VecDeque};

use proptest::prelude::*;

use super::{Class, CreditConfig, Gate, PeerCredits};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Body {
    Data(u32),
    Ctrl(u32),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Msg {
    body: Body,
    credits: (u16, u8),
}

/// One process, as seen by the pair: its credits toward the other, its pool
/// slots the other writes into, and its application traffic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    credits: PeerCredits,
    /// Our slice of slots that the peer writes (data) and our control reserve.
    data_ring: Vec<Option<Msg>>,
    ctrl_ring: Vec<Option<Msg>>,
    rx_data: u64,
    rx_ctrl: u64,
    /// Messages we wrote into the peer's rings.
    tx_data: u64,
    tx_ctrl: u64,
    /// Application messages still to send, and what we received.
    to_send: VecDeque<u32>,
    got: Vec<u32>,
    /// Control messages still to send, and those received.
    ctrl_to_send: u32,
    ctrl_got: Vec<u32>,
    /// Our credit mailbox: the newest totals the peer wrote explicitly.
    mailbox: Option<(u16, u8)>,
    reallocated: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pair {
    p: [Proc; 2],
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Send(usize),
    SendCtrl(usize),
    RecvData(usize),
    RecvCtrl(usize),
    Explicit(usize),
    ReadMailbox(usize),
    Reallocate(usize),
}

const ALL: [fn(usize) -> Action; 7] =
    [Action::Send, Action::SendCtrl, Action::RecvData, Action::RecvCtrl, Action::Explicit, Action::ReadMailbox, Action::Reallocate];

impl Pair {
    /// Process 0 has the smaller ID; each sends `n[i]` messages.
    fn new(cfg: &CreditConfig, n: [u32; 2], ctrl: [u32; 2]) -> Self {
        let mk = |lower: bool, count: u32, base: u32, ctrl: u32| Proc {
            credits: PeerCredits::new(cfg, lower),
            data_ring: vec![None; cfg.slice as usize],
            ctrl_ring: vec![None; cfg.ctrl as usize],
            rx_data: 0,
            rx_ctrl: 0,
            tx_data: 0,
            tx_ctrl: 0,
            to_send: (0..count).map(|k| base + k).collect(),
            got: Vec::new(),
            ctrl_to_send: ctrl,
            ctrl_got: Vec::new(),
            mailbox: None,
            reallocated: false,
        };
        // Process 0's peer (process 1) has a larger ID; process 1's peer is lower.
        Self { p: [mk(false, n[0], 0, ctrl[0]), mk(true, n[1], 1000, ctrl[1])] }
    }

    /// Applies `a` if enabled; panics on an invariant violation.
    fn step(&mut self, cfg: &CreditConfig, a: Action) -> bool {
        match a {
            Action::Send(i) => {
                let Some(&seq) = self.p[i].to_send.front() else { return false };
                match self.p[i].credits.try_take(Class::Data) {
                    Gate::Go => {}
                    Gate::Backpressure => return false,
                    Gate::NotAllowed => {
                        assert!(i == 0 && !self.p[0].credits.allowed(), "NotAllowed only toward an unheard larger ID");
                        return false;
                    }
                }
                let credits = self.p[i].credits.piggyback();
                let j = 1 - i;
                let slot = (self.p[i].tx_data % u64::from(cfg.slice)) as usize;
                assert!(self.p[j].data_ring[slot].is_none(), "data slot {slot} of process {j} written twice before release");
                self.p[j].data_ring[slot] = Some(Msg { body: Body::Data(seq), credits });
                self.p[i].tx_data += 1;
                self.p[i].to_send.pop_front();
                true
            }
            Action::SendCtrl(i) => {
                // Control messages answer data (CTS/FIN), so only once the rule allows.
                if self.p[i].ctrl_to_send == 0 || !self.p[i].credits.allowed() {
                    return false;
                }
                if self.p[i].credits.try_take(Class::Ctrl) != Gate::Go {
                    return false;
                }
                let credits = self.p[i].credits.piggyback();
                let j = 1 - i;
                let slot = (self.p[i].tx_ctrl % u64::from(cfg.ctrl)) as usize;
                assert!(self.p[j].ctrl_ring[slot].is_none(), "control slot {slot} of process {j} written twice before release");
                self.p[j].ctrl_ring[slot] = Some(Msg { body: Body::Ctrl(self.p[i].ctrl_to_send), credits });
                self.p[i].tx_ctrl += 1;
                self.p[i].ctrl_to_send -= 1;
                true
            }
            Action::Explicit(i) => {
                if !self.p[i].credits.wants_explicit(cfg) {
                    return false;
                }
                let totals = self.p[i].credits.explicit();
                self.p[1 - i].mailbox = Some(totals); // newer totals overwrite older ones
                true
            }
            Action::ReadMailbox(i) => {
                let Some((d, c)) = self.p[i].mailbox.take() else { return false };
                self.p[i].credits.on_credit(d, c);
                true
            }
            Action::RecvData(i) | Action::RecvCtrl(i) => {
                let data = matches!(a, Action::RecvData(_));
                let q = &mut self.p[i];
                let (ring, next) = if data { (&mut q.data_ring, &mut q.rx_data) } else { (&mut q.ctrl_ring, &mut q.rx_ctrl) };
                let slot = (*next % ring.len() as u64) as usize;
                let Some(m) = ring[slot].take() else { return false };
                *next += 1;
                q.credits.on_receive(m.credits.0, m.credits.1);
                match m.body {
                    Body::Data(seq) => q.got.push(seq),
                    Body::Ctrl(k) => q.ctrl_got.push(k),
                }
                q.credits.on_release(if data { Class::Data } else { Class::Ctrl });
                assert!(q.credits.data_credits() <= cfg.slice, "data credits {} exceed the slice {}", q.credits.data_credits(), cfg.slice);
                assert!(q.credits.ctrl_credits() <= cfg.ctrl, "control credits exceed the reserve");
                true
            }
            Action::Reallocate(i) => {
                if self.p[i].reallocated || !self.p[i].credits.allowed() {
                    return false;
                }
                self.p[i].reallocated = true;
                self.p[i].credits.reallocate(cfg);
                true
            }
        }
    }

    fn done(&self, n: [u32; 2]) -> bool {
        self.p.iter().all(|q| q.to_send.is_empty() && q.ctrl_to_send == 0)
            && self.p[1].got.len() == n[0] as usize
            && self.p[0].got.len() == n[1] as usize
            && self.p.iter().all(|q| q.data_ring.iter().chain(&q.ctrl_ring).all(Option::is_none))
    }

    fn check_delivery(&self, n: [u32; 2]) {
        assert_eq!(self.p[1].got, (0..n[0]).collect::<Vec<_>>(), "exactly once, in order, 0 -> 1");
        assert_eq!(self.p[0].got, (1000..1000 + n[1]).collect::<Vec<_>>(), "exactly once, in order, 1 -> 0");
    }

    /// Runs every enabled action round-robin until nothing is enabled.
    fn drain(&mut self, cfg: &CreditConfig) {
        for _ in 0..100_000 {
            let mut any = false;
            for i in 0..2 {
                for f in ALL {
                    any |= self.step(cfg, f(i));
                }
            }
            if !any {
                return;
            }
        }
        panic!("no quiescence after 100000 rounds (credit ping-pong?)");
    }
}

fn cfg(slice: u32, newcomer: u32, threshold: u32) -> CreditConfig {
    CreditConfig { slice, newcomer: newcomer.clamp(1, slice), ctrl: 2, threshold: threshold.clamp(1, slice) }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random interleavings: no slot is written twice before release, credits
    /// never exceed the pool, and after draining every message arrived exactly
    /// once, in order. Process 0 (smaller ID) sends only after hearing from 1,
    /// as the rule says; with no message from 1 it never may.
    #[test]
    fn random_interleavings_keep_the_invariants(
        slice in 1u32..5, newcomer in 1u32..5, threshold in 1u32..5,
        n0 in 0u32..20, n1 in 1u32..20, c0 in 0u32..8, c1 in 0u32..8,
        actions in proptest::collection::vec((0usize..5, 0usize..2), 0..300),
    ) {
        let c = cfg(slice, newcomer, threshold);
        let n = [n0, n1];
        let mut pair = Pair::new(&c, n, [c0, c1]);
        for (a, who) in actions {
            pair.step(&c, ALL[a](who));
        }
        pair.drain(&c);
        prop_assert!(pair.done(n), "stuck: {pair:?}");
        pair.check_delivery(n);
    }
}

/// Every interleaving of small exchanges: no reachable state breaks an
/// invariant (checked inside `step`), and every state where nothing can
/// happen any more has delivered everything (no deadlock).
#[test]
fn exhaustive_small_windows_never_deadlock() {
    for (slice, newcomer, threshold, n, ctrl) in [
        (1, 1, 1, [2, 1], [1, 1]),
        (1, 1, 1, [1, 2], [2, 1]),
        (2, 1, 1, [2, 2], [1, 0]),
        (2, 1, 2, [1, 2], [0, 1]),
        (1, 1, 1, [0, 2], [0, 1]),
    ] {
        let c = cfg(slice, newcomer, threshold);
        let start = Pair::new(&c, n, ctrl);
        let mut seen = HashSet::new();
        let mut todo = vec![start.clone()];
        seen.insert(start);
        let mut terminal = 0;
        while let Some(s) = todo.pop() {
            let mut any = false;
            for i in 0..2 {
                for f in ALL {
                    let mut t = s.clone();
                    if t.step(&c, f(i)) {
                        any = true;
                        if seen.insert(t.clone()) {
                            todo.push(t);
                        }
                    }
                }
            }
            if !any {
                terminal += 1;
                assert!(s.done(n), "deadlock with slice {slice}, c0 {newcomer}, threshold {threshold}: {s:?}");
                s.check_delivery(n);
            }
            assert!(seen.len() < 3_000_000, "state space too large");
        }
        assert!(terminal > 0);
        eprintln!(
            "slice {slice}, c0 {newcomer}, threshold {threshold}, messages {n:?}, control {ctrl:?}: {} states, {terminal} terminal",
            seen.len()
        );
    }
}

#[test]
fn the_rule_gates_the_larger_id_until_it_has_heard() {
    let c = cfg(4, 1, 2);
    let mut lo = PeerCredits::new(&c, false); // we are smaller; peer larger
    let mut hi = PeerCredits::new(&c, true); // we are larger; peer smaller
    assert_eq!(lo.try_take(Class::Data), Gate::NotAllowed);
    assert_eq!(hi.try_take(Class::Data), Gate::Go, "newcomer credit toward a smaller ID");
    assert_eq!(hi.try_take(Class::Data), Gate::Backpressure, "only c0 = 1 before reallocation");
    let (d, k) = hi.piggyback();
    assert_eq!(d, 1, "the first message grants the smaller ID its c0 (a cumulative total)");
    lo.on_receive(d, k);
    assert_eq!(lo.try_take(Class::Data), Gate::Go);
    assert_eq!(lo.try_take(Class::Data), Gate::Backpressure);
    // Reallocation grants the rest of the slice and announces it explicitly.
    assert_eq!(hi.reallocate(&c), 3);
    assert!(hi.wants_explicit(&c));
    let (d, k) = hi.explicit();
    lo.on_credit(d, k);
    lo.on_credit(d, k); // a total seen twice counts once
    assert_eq!(lo.data_credits(), 3);
    assert_eq!(CreditConfig::for_pool(7, 7, 2, None).map(|c| c.slice), Ok(1));
    assert!(CreditConfig::for_pool(6, 7, 2, None).unwrap_err().contains("cannot give each of 7 peers"));
}

#[test]
fn totals_wrap_around_without_losing_credits() {
    let c = cfg(4, 4, 1);
    let mut tx = PeerCredits::new(&c, true);
    let mut rx = PeerCredits::new(&c, false);
    rx.on_receive(0, 0);
    for round in 0..100_000u32 {
        assert_eq!(tx.try_take(Class::Data), Gate::Go, "round {round}");
        rx.on_release(Class::Data);
        let (d, k) = rx.explicit();
        tx.on_credit(d, k);
    }
    assert_eq!(tx.data_credits(), 4);
}
