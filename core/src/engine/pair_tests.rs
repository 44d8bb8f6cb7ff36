//! The eager and rendezvous protocols (RTS, CTS, FIN, split halves, cancel)
//! run between engines over a simulated fabric ([`super::sim`]), without
//! processes: each seed draws a workload and a fault schedule (held and
//! reordered messages, late and reordered one-sided completions, tight
//! credits, a rank that dies and drops what it had in flight, operations
//! that never complete until abandoned). Every outcome is checked: data
//! byte for byte, statuses, errors that name the dead rank, no request left
//! pending, and no buffer given back while an exposure or an operation can
//! still touch it. A failure prints its seed; `FMX_SIM_SEED=n` replays it.

use fmx_transport::lend::{LendTable, Lent};
use fmx_transport::TransportError;

use super::sim::{Faults, SimNet, Tally};
use super::{Engine, RawStatus, ReqId, WaitsOn, SPLIT_MIN};
use crate::error::Error;
use crate::mixed::Mixed;
use crate::select::Transport;

const CTX: u32 = 7;
const MAX_EAGER: usize = 256;
/// Steps after which a request still pending is a hang.
const MAX_STEPS: u64 = 20_000;
/// How often (in steps) a rank that waits checks its peers, as a wait does when idle.
const LIVENESS_EVERY: u64 = 8;
/// Bytes past a message in a larger receive buffer: must stay untouched.
const UNTOUCHED: u8 = 0xEE;

struct Side {
    rank: u32,
    buf: Box<[u8]>,
    lent: Option<Lent>,
    req: Option<ReqId>,
    out: Option<Result<RawStatus, Error>>,
    posted: bool,
    /// Given up while pending, as a scope ending with an error discards it.
    cancelled: bool,
}

impl Side {
    fn new(rank: u32, buf: Box<[u8]>) -> Self {
        Self { rank, buf, lent: None, req: None, out: None, posted: false, cancelled: false }
    }
}

struct Transfer {
    tag: u32,
    len: usize,
    any_source: bool,
    send_at: u64,
    recv_at: u64,
    send: Side,
    recv: Side,
}

impl Transfer {
    fn cancelled(&self) -> bool {
        self.send.cancelled || self.recv.cancelled
    }
}

struct Rank {
    eng: Engine,
    lend: LendTable,
}

fn pattern(tag: u32, len: usize) -> Box<[u8]> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(tag) as u8).collect()
}

fn faults_for(seed: u64, mixed: bool) -> (u32, Faults) {
    let pick =
        SimNet::new(1, Faults { seed, slots: 1, max_hold: 0, max_op_polls: 0, death: None, stuck_ops: false, split: false, max_eager: 0 });
    // Mixed runs: 3 or 4 ranks on two nodes, so that some pairs share a node.
    let size = if mixed { 3 } else { 2 } + pick.below(2) as u32;
    // A third of the seeds kill a rank: half at a random step, half in the
    // middle of a one-sided operation with it.
    let death = (pick.below(3) == 0).then(|| (pick.below(u64::from(size)) as u32, pick.below(2) * (1 + pick.below(60))));
    let faults = Faults {
        seed,
        slots: 1 + pick.below(4) as usize,
        max_hold: pick.below(4) as u32,
        max_op_polls: pick.below(5) as u32,
        death,
        // Rare: each abandoned operation costs the engine's abandon wait (1 s).
        stuck_ops: death.is_some() && seed % 10 == 3,
        split: pick.below(2) == 0,
        max_eager: MAX_EAGER,
    };
    (size, faults)
}

fn workload(net: &Fabric, size: u32) -> Vec<Transfer> {
    let lens = [0, 1, MAX_EAGER - 1, MAX_EAGER, MAX_EAGER + 1, 4096, SPLIT_MIN as usize - 1, SPLIT_MIN as usize, 300_001];
    let count = 4 + net.below(10) as usize;
    (0..count)
        .map(|i| {
            let tag = i as u32 + 1;
            let src = net.below(u64::from(size)) as u32;
            let dst = (src + 1 + net.below(u64::from(size) - 1) as u32) % size;
            let len = lens[net.below(lens.len() as u64) as usize];
            let extra = if net.below(3) == 0 { 1 + net.below(100) as usize } else { 0 };
            Transfer {
                tag,
                len,
                any_source: net.below(4) == 0,
                send_at: net.below(40),
                recv_at: net.below(40),
                send: Side::new(src, pattern(tag, len)),
                recv: Side::new(dst, vec![UNTOUCHED; len + extra].into_boxed_slice()),
            }
        })
        .collect()
}

/// Whether `e` names world rank `dead` as the reason.
fn names(e: &Error, dead: u32) -> bool {
    match e {
        Error::PeerGone { world_rank, .. } => *world_rank == dead,
        Error::Transport(TransportError::Completion { peer, .. } | TransportError::PeerGone { peer, .. }) => *peer == dead,
        _ => false,
    }
}

/// The simulated fabrics of a run: one between all ranks, and in a mixed
/// run one per node (ranks alternate between two nodes), each rank's
/// endpoint then being a [`Mixed`] of its node's and the one between nodes.
struct Fabric {
    main: SimNet,
    nodes: Vec<SimNet>,
    /// Each rank's node and index there (mixed runs).
    node_of: Vec<(usize, u32)>,
}

impl Fabric {
    fn new(size: u32, faults: &Faults, mixed: bool) -> Self {
        let main = SimNet::new(size, faults.clone());
        if !mixed {
            return Self { main, nodes: Vec::new(), node_of: Vec::new() };
        }
        let members = |n: u32| (0..size).filter(move |r| r % 2 == n);
        // Within a node: the schedule's delays and credits, no death of its own.
        let nodes = (0..2u32)
            .map(|n| {
                SimNet::new(
                    members(n).count() as u32,
                    Faults { seed: faults.seed ^ (0xA5A5 + u64::from(n)), death: None, ..faults.clone() },
                )
            })
            .collect();
        let node_of = (0..size).map(|r| ((r % 2) as usize, r / 2)).collect();
        Self { main, nodes, node_of }
    }

    fn transport(&self, rank: u32) -> Transport {
        if self.nodes.is_empty() {
            return Transport::Sim(Box::new(self.main.endpoint(rank)));
        }
        let (node, local) = self.node_of[rank as usize];
        let members: Vec<u32> = (0..self.node_of.len() as u32).filter(|&r| self.node_of[r as usize].0 == node).collect();
        let m = Mixed::new(self.nodes[node].endpoint(local), self.main.endpoint(rank), &members).expect("a consistent node map");
        Transport::SimMix(Box::new(m))
    }

    fn below(&self, n: u64) -> u64 {
        self.main.below(n)
    }

    /// One step of every fabric; a rank that dies dies on its node too.
    fn step(&self) -> Option<u32> {
        for n in &self.nodes {
            n.step();
        }
        let d = self.main.step()?;
        if let Some(&(node, local)) = self.node_of.get(d as usize) {
            self.nodes[node].kill(local);
        }
        Some(d)
    }

    fn busy(&self, addr: usize, len: usize) -> Option<String> {
        std::iter::once(&self.main).chain(&self.nodes).find_map(|n| n.busy(addr, len))
    }

    fn leftovers(&self) -> Vec<String> {
        std::iter::once(&self.main).chain(&self.nodes).flat_map(SimNet::leftovers).collect()
    }

    fn tally(&self) -> Tally {
        let mut t = self.main.tally();
        for n in &self.nodes {
            // A death is the main fabric's; a node only follows it.
            t.add(&Tally { deaths: 0, ..n.tally() });
        }
        t
    }
}

/// Gives a side's buffer back, after checking that nothing can touch it any more.
fn give_back(net: &Fabric, lend: &mut LendTable, side: &mut Side, what: &str) -> Result<(), String> {
    if let Some(l) = side.lent.take() {
        lend.retire(l);
    }
    match net.busy(side.buf.as_ptr() as usize, side.buf.len()) {
        Some(why) => Err(format!("{what} on rank {} finished, but {why}", side.rank)),
        None => Ok(()),
    }
}

struct Sim {
    net: Fabric,
    ranks: Vec<Rank>,
    transfers: Vec<Transfer>,
    dead: Option<u32>,
    /// When a rank gives up one of its pending requests.
    cancel_at: Option<u64>,
    /// Errors a progress call returned (a wait would have returned them).
    progress_errors: Vec<(u32, Error)>,
}

impl Sim {
    fn new(seed: u64, mixed: bool) -> Self {
        let (size, faults) = faults_for(seed, mixed);
        let net = Fabric::new(size, &faults, mixed);
        let transfers = workload(&net, size);
        let cancel_at = (net.below(3) == 0).then(|| net.below(60));
        let ranks = (0..size)
            .map(|r| Rank { eng: Engine::new(net.transport(r), super::default_spin_polls(false), None), lend: LendTable::new() })
            .collect();
        Self { net, ranks, transfers, dead: None, cancel_at, progress_errors: Vec::new() }
    }

    fn alive(&self, rank: u32) -> bool {
        self.dead != Some(rank)
    }

    fn post(&mut self, step: u64) {
        let size = self.ranks.len() as u32;
        for t in &mut self.transfers {
            if !t.send.posted && t.send_at <= step && self.dead != Some(t.send.rank) {
                t.send.posted = true;
                let r = &mut self.ranks[t.send.rank as usize];
                // SAFETY: the boxed buffer lives in `t` until the test ends, is not
                // moved (a box's heap memory stays put) and not written while lent;
                // the loan is retired in `give_back` or when the test ends.
                #[allow(unsafe_code)]
                let lent = unsafe { r.lend.lend_owned(t.send.buf.as_ptr().cast_mut(), t.send.buf.len(), false) };
                t.send.lent = Some(lent);
                match r.eng.start_send(&r.lend, CTX, t.tag, t.recv.rank, lent) {
                    Ok(id) => t.send.req = Some(id),
                    Err(e) => t.send.out = Some(Err(e)),
                }
            }
            if !t.recv.posted && t.recv_at <= step && self.dead != Some(t.recv.rank) {
                t.recv.posted = true;
                let r = &mut self.ranks[t.recv.rank as usize];
                // SAFETY: as for the send buffer; only the engine writes it while lent.
                #[allow(unsafe_code)]
                let lent = unsafe { r.lend.lend_owned(t.recv.buf.as_mut_ptr(), t.recv.buf.len(), true) };
                t.recv.lent = Some(lent);
                let (src, waits_on) = if t.any_source {
                    (None, WaitsOn::AnyOf((0..size).collect::<Vec<_>>().into()))
                } else {
                    (Some(t.send.rank), WaitsOn::Peer(t.send.rank))
                };
                match r.eng.start_recv(&mut r.lend, CTX, src, Some(t.tag), lent, waits_on, false) {
                    Ok(id) => t.recv.req = Some(id),
                    Err(e) => t.recv.out = Some(Err(e)),
                }
            }
        }
    }

    /// Collects what finished; a wildcard receive told that its only sender is
    /// gone is given up, as a user would.
    fn harvest(&mut self, check: bool) -> Result<(), String> {
        for t in &mut self.transfers {
            let sender = t.send.rank;
            for (side, what) in [(&mut t.send, "send"), (&mut t.recv, "receive")] {
                if self.dead == Some(side.rank) {
                    continue;
                }
                let r = &mut self.ranks[side.rank as usize];
                let Some(id) = side.req.filter(|_| side.out.is_none()) else {
                    if side.out.is_some() && side.lent.is_some() {
                        give_back(&self.net, &mut r.lend, side, what)?; // failed at the start
                    }
                    continue;
                };
                if check && r.eng.is_pending(id) {
                    match r.eng.check_liveness(&mut r.lend, id) {
                        Ok(()) => {}
                        Err(e @ Error::PeerGone { pending: true, world_rank, .. }) => {
                            if world_rank == sender {
                                r.eng.discard(id);
                                side.out = Some(Err(e.settled()));
                            }
                        }
                        Err(e) => return Err(format!("the liveness check of a {what} on rank {} failed: {e}", side.rank)),
                    }
                }
                if side.out.is_none() && !r.eng.is_pending(id) {
                    side.out = Some(r.eng.take(id).ok_or_else(|| format!("a finished {what} on rank {} has no outcome", side.rank))?);
                }
                if side.out.is_some() {
                    give_back(&self.net, &mut r.lend, side, what)?;
                }
            }
        }
        Ok(())
    }

    fn finished(&self) -> bool {
        self.transfers.iter().all(|t| {
            t.cancelled() || [&t.send, &t.recv].iter().all(|s| !self.alive(s.rank) || (s.posted && (s.req.is_none() || s.out.is_some())))
        })
    }

    /// Discards a pending request of a live rank; the buffer must be free at once.
    fn give_up(&mut self, i: usize, send: bool) -> Result<(), String> {
        let t = &mut self.transfers[i];
        let side = if send { &mut t.send } else { &mut t.recv };
        let r = &mut self.ranks[side.rank as usize];
        if let Some(id) = side.req.take().filter(|_| side.out.is_none()) {
            r.eng.discard(id);
            side.cancelled = true;
            give_back(&self.net, &mut r.lend, side, if send { "a cancelled send" } else { "a cancelled receive" })?;
        }
        Ok(())
    }

    /// Cancels one pending request at `cancel_at`.
    fn cancel(&mut self, step: u64) -> Result<(), String> {
        if self.cancel_at != Some(step) {
            return Ok(());
        }
        let pending: Vec<(usize, bool)> = (0..self.transfers.len())
            .flat_map(|i| [(i, true), (i, false)])
            .filter(|&(i, send)| {
                let t = &self.transfers[i];
                let s = if send { &t.send } else { &t.recv };
                self.alive(s.rank) && s.out.is_none() && s.req.is_some_and(|id| self.ranks[s.rank as usize].eng.is_pending(id))
            })
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let (i, send) = pending[self.net.below(pending.len() as u64) as usize];
        self.give_up(i, send)
    }

    /// The other halves of cancelled transfers may wait for ever (nobody will
    /// match them): given up as well once everything else is done.
    fn give_up_orphans(&mut self) -> Result<(), String> {
        for i in 0..self.transfers.len() {
            let t = &self.transfers[i];
            if t.cancelled() {
                let (s, r) = (self.alive(t.send.rank), self.alive(t.recv.rank));
                if s {
                    self.give_up(i, true)?;
                }
                if r {
                    self.give_up(i, false)?;
                }
            }
        }
        Ok(())
    }

    fn run(&mut self) -> Result<(), String> {
        for step in 0..MAX_STEPS {
            if let Some(d) = self.net.step() {
                self.dead = Some(d);
            }
            self.post(step);
            self.cancel(step)?;
            let order: Vec<usize> = {
                let mut o: Vec<usize> = (0..self.ranks.len()).collect();
                for i in (1..o.len()).rev() {
                    o.swap(i, self.net.below(i as u64 + 1) as usize);
                }
                o
            };
            for i in order {
                if self.dead == Some(i as u32) {
                    continue;
                }
                let r = &mut self.ranks[i];
                if let Err(e) = r.eng.progress(&mut r.lend) {
                    self.progress_errors.push((i as u32, e));
                }
            }
            self.harvest(step % LIVENESS_EVERY == 0)?;
            if self.finished() {
                self.give_up_orphans()?;
                return self.verdict();
            }
        }
        let pending: Vec<String> = self
            .transfers
            .iter()
            .flat_map(|t| [("send", &t.send, t.tag), ("receive", &t.recv, t.tag)])
            .filter(|(_, s, _)| self.alive(s.rank) && s.out.is_none() && !s.cancelled)
            .map(|(what, s, tag)| format!("{what} of tag {tag} on rank {}", s.rank))
            .collect();
        Err(format!("hang: after {MAX_STEPS} steps still pending: {}", pending.join(", ")))
    }

    fn verdict(&self) -> Result<(), String> {
        for (rank, e) in &self.progress_errors {
            match self.dead {
                Some(d) if names(e, d) => {}
                _ => return Err(format!("rank {rank}'s progress failed: {e}")),
            }
        }
        for t in &self.transfers {
            let involved = self.dead.filter(|&d| d == t.send.rank || d == t.recv.rank);
            let cancelled = t.cancelled();
            let what = format!("tag {} ({} bytes, rank {} to {})", t.tag, t.len, t.send.rank, t.recv.rank);
            for (side, name) in [(&t.send, "send"), (&t.recv, "receive")] {
                if !self.alive(side.rank) || side.cancelled {
                    continue;
                }
                let out = match (side.out.as_ref(), cancelled) {
                    (Some(out), _) => out,
                    (None, true) => continue, // given up with its cancelled other half
                    (None, false) => return Err(format!("{name} of {what} has no outcome")),
                };
                match (out, involved) {
                    (Ok(st), _) => {
                        if st.sent != t.len as u64 {
                            return Err(format!("{name} of {what} reports {} bytes", st.sent));
                        }
                        if name == "receive" {
                            if (st.src, st.tag, st.capacity) != (t.send.rank, t.tag, t.recv.buf.len() as u64) {
                                return Err(format!("receive of {what} reports {st:?}"));
                            }
                            if t.recv.buf[..t.len] != t.send.buf[..] {
                                return Err(format!("receive of {what}: the data differ"));
                            }
                            if t.recv.buf[t.len..].iter().any(|&b| b != UNTOUCHED) {
                                return Err(format!("receive of {what}: bytes past the message were written"));
                            }
                        }
                    }
                    (Err(e), Some(d)) if names(e, d) => {}
                    // The other half gave up: any error, as long as it ends.
                    (Err(_), _) if cancelled => {}
                    (Err(e), _) => return Err(format!("{name} of {what} failed: {e}")),
                }
            }
        }
        let left = self.net.leftovers();
        if !left.is_empty() {
            return Err(format!("every request is finished, but {}", left.join("; ")));
        }
        Ok(())
    }
}

fn run_seed(seed: u64, mixed: bool, tally: &mut Tally) -> Result<(), String> {
    let mut sim = Sim::new(seed, mixed);
    let r = sim.run();
    tally.add(&sim.net.tally());
    r.map_err(|e| {
        let (size, faults) = faults_for(seed, mixed);
        format!(
            "seed {seed} ({size} ranks{}, {faults:?}; {:?}): {e}\nreplay: FMX_SIM_SEED={seed} cargo test -p fmx {}",
            if mixed { " on two nodes" } else { "" },
            sim.net.tally(),
            if mixed { "rendezvous_over_a_mixed" } else { "rendezvous_pair" }
        )
    })
}

/// Runs the seeds (`FMX_SIM_SEED`, or `FMX_SIM_SEEDS` of them, default
/// `default`) and requires every fault of the schedule to have happened.
fn run_seeds(mixed: bool, default: u64) {
    let seeds: Vec<u64> = match std::env::var("FMX_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("FMX_SIM_SEED is a number")],
        Err(_) => {
            let n = std::env::var("FMX_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
            (0..n).collect()
        }
    };
    let mut tally = Tally::default();
    let failures: Vec<String> = seeds.iter().filter_map(|&s| run_seed(s, mixed, &mut tally).err()).collect();
    println!("{} seeds{}: {tally:?}", seeds.len(), if mixed { " (mixed)" } else { "" });
    if std::env::var_os("FMX_SIM_VERBOSE").is_some() {
        failures.iter().for_each(|f| eprintln!("{f}"));
    }
    assert!(failures.is_empty(), "{} of {} seeds failed; the first:\n{}", failures.len(), seeds.len(), failures[0]);
    if seeds.len() >= 100 {
        // Every fault of the schedule happened, or the run proves nothing about it.
        let t = tally;
        let met = [
            ("deaths", t.deaths),
            ("dropped messages", t.dropped),
            ("held messages", t.held),
            ("backpressure", t.backpressure),
            ("pending operations", t.ops_pending),
            ("out-of-order completions", t.out_of_order),
            ("refused operations", t.refused),
            ("split offers (CTS)", t.split_offers),
            ("abandoned operations", t.abandoned),
        ];
        let never: Vec<&str> = met.iter().filter(|(_, n)| *n == 0).map(|(what, _)| *what).collect();
        assert!(never.is_empty(), "the schedule never produced: {}", never.join(", "));
    }
}

#[test]
fn rendezvous_pair_under_faults() {
    run_seeds(false, 400);
}

/// The same over a mixed transport: each rank's endpoint is a node's fabric
/// for the ranks of its node and the fabric between nodes for the others
/// (ranks alternate between two nodes), as shm+verbs and shm+ofi are built.
#[test]
fn rendezvous_over_a_mixed_transport_under_faults() {
    run_seeds(true, 300);
}
