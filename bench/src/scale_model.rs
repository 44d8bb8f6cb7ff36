//! `fmx-perf scale-model`: what one process of an N-rank job pays for its
//! connections, by connection mode. A pure function of the job's shape
//! (ranks, ranks per node, communication degree) and a few costs, so that
//! the table for 10^5 ranks can be printed on a laptop and checked, at small
//! N, against what a real job reports (`Fmx::receive_memory`, the verbs
//! address's length).
//!
//! The modes:
//! - **fmx-eager** (`FMX_CONNECT=eager`): the network endpoint spans the
//!   whole world, so a queue pair per other rank, an eager pool of at least
//!   one slot per peer (`FMX_POOL_SLOTS`, default 64, must be raised past 64
//!   peers) and two control slots per peer; every rank's address carries a
//!   (QPN, PSN) per rank, and every rank reads every address.
//! - **fmx-lazy** (`FMX_CONNECT=lazy`): one fixed address per rank; a queue
//!   pair, credits and control slots only toward the peers a rank talks to
//!   (at most `degree`, all assumed off-node: the worst case). Every rank
//!   still reads every address at init (the launcher's allgather hands them
//!   all out), but each is the fixed part only. Each connection is granted its
//!   eager slots when it is made: `FMX_CONNECTION_SLOTS` (8) while the pool
//!   (`FMX_POOL_SLOTS`) has room, then only the newcomer credits (2).
//! - **RC all-to-all**, the classic MPI over RC: a queue pair and a
//!   per-peer eager receive queue toward every other rank (Open MPI openib's
//!   default `P,128,256,...`: 256 buffers of 128 B per peer).

use std::fmt::Write as _;

/// The job's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    /// Ranks in the job (N).
    pub ranks: u64,
    /// Ranks per node (P); peers on the node use shared memory.
    pub per_node: u64,
    /// Peers each rank exchanges with (d); `ranks - 1` for all-to-all.
    pub degree: u64,
}

/// How connections are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every connection at init (`FMX_CONNECT=eager`).
    Eager,
    /// A connection on first use (`FMX_CONNECT=lazy`).
    Lazy,
    /// An RC queue pair with its own eager queue to every rank (classic MPI).
    RcAllToAll,
}

impl Mode {
    /// Every mode, in table order.
    pub const ALL: [Mode; 3] = [Mode::Lazy, Mode::Eager, Mode::RcAllToAll];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "fmx-eager",
            Mode::Lazy => "fmx-lazy",
            Mode::RcAllToAll => "RC all-to-all",
        }
    }
}

/// What the model charges; [`Costs::FMX`] holds fmx's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Bytes per eager receive slot (`FMX_SLOT_BYTES`).
    pub slot_bytes: u64,
    /// The eager pool's slots (`FMX_POOL_SLOTS`); grown to one per connected peer.
    pub pool_slots: u64,
    /// Control slots per connected peer (CTS, FIN).
    pub ctrl_slots: u64,
    /// Lazily, the eager slots granted a connection while the pool has room (`FMX_CONNECTION_SLOTS`).
    pub conn_slots: u64,
    /// Lazily, the slots granted a connection beyond the pool: the newcomer
    /// credits (`FMX_NEWCOMER_CREDITS`) a first message may use.
    pub newcomer: u64,
    /// Bytes of a verbs address without its per-peer part (a lazy address
    /// is this part alone: it names the rank's one UD wire-up queue pair).
    pub address_fixed: u64,
    /// Bytes per rank in an eager address: (QPN, PSN).
    pub address_per_peer: u64,
    /// Per-peer eager receive memory of classic RC.
    pub rc_per_peer_bytes: u64,
    /// Host memory of one RC queue pair's send queue (depth x 64-byte WQEs).
    pub qp_bytes: u64,
    /// Creating a queue pair and moving it to RTS, in microseconds.
    pub qp_setup_us: f64,
    /// One network round trip, in microseconds.
    pub rtt_us: f64,
}

impl Costs {
    /// fmx's defaults; `qp_setup_us` and `rtt_us` are hardware-class figures
    /// (a `ConnectX` `ibv_create_qp` + three `ibv_modify_qp`, an `InfiniBand`
    /// round trip), which the caller may replace with measured ones.
    pub const FMX: Costs = Costs {
        slot_bytes: 8 << 10,
        pool_slots: 64,
        ctrl_slots: 2,
        conn_slots: 8,
        newcomer: 2,
        address_fixed: 65,
        address_per_peer: 8,
        rc_per_peer_bytes: 256 * 128,
        qp_bytes: 128 * 64,
        qp_setup_us: 100.0,
        rtt_us: 3.0,
    };
}

/// What one process pays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerProcess {
    /// Network queue pairs (or connections).
    pub queue_pairs: u64,
    /// Eager receive memory: pool and control slots, or per-peer queues.
    pub eager_bytes: u64,
    /// Queue pairs' host memory.
    pub qp_bytes: u64,
    /// Bytes of the address this rank publishes.
    pub address_bytes: u64,
    /// Bootstrap messages: one put, then one get per address read.
    pub bootstrap_msgs: u64,
    /// Bootstrap bytes read and written.
    pub bootstrap_bytes: u64,
    /// From init to the first message to a new peer having left, in microseconds.
    pub first_message_us: f64,
}

/// The model: what one process of `job` pays in `mode` at `costs`.
pub fn per_process(job: Job, mode: Mode, costs: &Costs) -> PerProcess {
    let peers = job.ranks.saturating_sub(1);
    let contacted = job.degree.min(peers);
    // Eager and RC connect to every rank (fmx's network endpoint spans the
    // world, local peers included); lazy only to those it talks to.
    let qps = match mode {
        Mode::Lazy => contacted,
        Mode::Eager | Mode::RcAllToAll => peers,
    };
    let eager_bytes = match mode {
        Mode::RcAllToAll => qps * costs.rc_per_peer_bytes,
        // The pool is cut into equal slices, one per peer of the job (at
        // least one slot each), as `CreditConfig::for_pool` does.
        Mode::Eager => {
            let pool = costs.pool_slots.checked_div(qps).map_or(0, |slice| slice.max(1) * qps);
            (pool + costs.ctrl_slots * qps) * costs.slot_bytes
        }
        Mode::Lazy => (lazy_data_slots(qps, costs) + costs.ctrl_slots * qps) * costs.slot_bytes,
    };
    // Every rank reads every other's address at init in every mode; only
    // its size differs.
    let address = match mode {
        Mode::Lazy => costs.address_fixed,
        Mode::Eager | Mode::RcAllToAll => costs.address_fixed + costs.address_per_peer * job.ranks,
    };
    let reads = peers;
    let first_message_us = match mode {
        // One wire-up endpoint at init; then the first message to a peer
        // waits for a request and an answer and a queue pair of its own.
        Mode::Lazy => costs.qp_setup_us + (costs.qp_setup_us + 2.0 * costs.rtt_us),
        Mode::Eager | Mode::RcAllToAll => qps as f64 * costs.qp_setup_us,
    };
    PerProcess {
        queue_pairs: qps,
        eager_bytes,
        qp_bytes: qps * costs.qp_bytes,
        address_bytes: address,
        bootstrap_msgs: 1 + reads,
        bootstrap_bytes: address * (1 + reads),
        first_message_us,
    }
}

/// Lazily, the eager data slots `conns` connections are granted, in the
/// order they are made (`Grants::grant` in the RDMA core): a full slice
/// each while the pool has room, the newcomer floor beyond it.
fn lazy_data_slots(conns: u64, costs: &Costs) -> u64 {
    let full = costs.conn_slots.min(costs.pool_slots).max(1);
    let floor = costs.newcomer.clamp(1, full);
    let whole = (costs.pool_slots / full).min(conns);
    whole * full + (conns - whole) * floor
}

/// The table `fmx-perf scale-model` prints: every mode at each N.
pub fn table(ns: &[u64], per_node: u64, degree: Option<u64>, costs: &Costs) -> String {
    let mut out = String::new();
    let pattern = degree.map_or("all-to-all".to_owned(), |d| format!("degree {d}"));
    let _ = writeln!(out, "# connections per process: {pattern}, {per_node} ranks per node (fmx-perf scale-model)");
    let _ = writeln!(
        out,
        "| N | mode | queue pairs | eager receive memory | QP memory | bootstrap msgs | bootstrap bytes | to first message |"
    );
    let _ = writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|");
    for &n in ns {
        let job = Job { ranks: n, per_node, degree: degree.unwrap_or(n.saturating_sub(1)) };
        for mode in Mode::ALL {
            let p = per_process(job, mode, costs);
            let _ = writeln!(
                out,
                "| {n} | {} | {} | {} | {} | {} | {} | {} |",
                mode.name(),
                p.queue_pairs,
                bytes(p.eager_bytes),
                bytes(p.qp_bytes),
                p.bootstrap_msgs,
                bytes(p.bootstrap_bytes),
                duration(p.first_message_us)
            );
        }
    }
    out
}

/// Bytes in binary units.
fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Microseconds as us, ms or s.
fn duration(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.1} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{us:.0} us")
    }
}

/// Options of `fmx-perf scale-model`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Job sizes
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000,100000")]
    pub ranks: Vec<u64>,
    /// Ranks per node
    #[arg(long, default_value_t = 64)]
    pub per_node: u64,
    /// Peers each rank talks to (6: a 3-D stencil); absent: all-to-all
    #[arg(long)]
    pub degree: Option<u64>,
    /// Creating a queue pair and bringing it to RTS, microseconds
    #[arg(long, default_value_t = Costs::FMX.qp_setup_us)]
    pub qp_setup_us: f64,
    /// Network round trip, microseconds
    #[arg(long, default_value_t = Costs::FMX.rtt_us)]
    pub rtt_us: f64,
    /// Inside a job (fmxrun, mpiexec, srun) over an RDMA transport: check the
    /// model's eager receive memory and connections against what this job's ranks report
    #[arg(long)]
    pub measure: bool,
}

/// `fmx-perf scale-model`.
pub fn main(a: &Args) -> Result<(), String> {
    if a.measure {
        return measure();
    }
    let costs = Costs { qp_setup_us: a.qp_setup_us, rtt_us: a.rtt_us, ..Costs::FMX };
    print!("{}", table(&a.ranks, a.per_node, a.degree, &costs));
    Ok(())
}

/// Every rank times its init and counts its connections after it, then
/// exchanges with its two ring neighbours (d = 2; one for N = 2) and
/// compares its eager receive memory (`Fmx::receive_memory`: the granted
/// data and control slots) and its connections with the model's for the
/// job's mode (eagerly every peer from init on; lazily none after init and
/// the d neighbours after the ring), and the address it published and read
/// through the launcher (`Fmx::bootstrap_exchanges`: verbs' against the
/// model's size, ofi's the same fixed size on every rank); rank 0 prints
/// one row. Fails naming each rank that differs.
fn measure() -> Result<(), String> {
    let t0 = std::time::Instant::now();
    let fmx = fmx::init().map_err(|e| e.to_string())?;
    let init_us = t0.elapsed().as_micros() as u64;
    let w = fmx.world();
    let transport = w.transport_name();
    if !(transport.starts_with("verbs") || transport.starts_with("ofi")) {
        return Err(format!("the scale model is of the RDMA transports; this job runs over {transport} (set FMX_TRANSPORT=verbs or ofi)"));
    }
    let (n, me) = (w.size(), w.rank());
    let lazy = (0..n).any(|r| w.connects_on_demand(r).unwrap_or(false));
    let after_init = fmx.connections().len() as u64;
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let mut got = [0u64; 1];
    for (to, from) in [(right, left), (left, right)] {
        w.sendrecv(&[u64::from(me)], to, 7, &mut got, from, 7).map_err(|e| e.to_string())?;
        if got[0] != u64::from(from) {
            return Err(format!("rank {me}: the ring exchange from rank {from} brought {}", got[0]));
        }
    }
    let m = fmx.receive_memory();
    let conns = fmx.connections();
    // Every rank has counted before any goes on to the allgather (whose
    // messages would connect us to more peers): a token twice round the
    // ring, over the ring's own connections.
    if n > 1 {
        let mut token = [0u8];
        for _ in 0..2 {
            let first = me == 0;
            if first {
                w.send(&token, right, 8).map_err(|e| e.to_string())?;
            }
            w.recv(&mut token, left, 8).map_err(|e| e.to_string())?;
            if !first {
                w.send(&token, right, 8).map_err(|e| e.to_string())?;
            }
        }
    }
    let number = |var: &str, default: u64| std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let costs = Costs {
        slot_bytes: number("FMX_SLOT_BYTES", Costs::FMX.slot_bytes),
        pool_slots: number("FMX_POOL_SLOTS", Costs::FMX.pool_slots),
        conn_slots: number("FMX_CONNECTION_SLOTS", Costs::FMX.conn_slots),
        newcomer: number("FMX_NEWCOMER_CREDITS", Costs::FMX.newcomer),
        ..Costs::FMX
    };
    let n64 = u64::from(n);
    let ring = if n == 2 { 1 } else { 2 };
    let (mode, degree, at_init) = if lazy { (Mode::Lazy, ring, 0) } else { (Mode::Eager, n64 - 1, n64 - 1) };
    let model = per_process(Job { ranks: n64, per_node: 1, degree }, mode, &costs);
    // Each rank's eager receive memory, its connections after init and after
    // the ring, the slots it set apart for first contacts, when its last
    // connection was ready and how long its init took, in microseconds.
    let last_us = conns.iter().map(|c| c.made_after.as_micros() as u64).max().unwrap_or(0);
    // What init exchanged through the launcher: the transport's addresses
    // (put, and read from the others), and every exchange's bytes read.
    let exchanges = fmx.bootstrap_exchanges();
    let family = if transport.starts_with("verbs") { "verbs addresses" } else { "ofi addresses" };
    let address = exchanges.iter().find(|e| e.what == family);
    let (put, read) = address.map_or((0, 0), |e| (e.bytes_put as u64, e.bytes_read as u64));
    let boot_read: u64 = exchanges.iter().map(|e| e.bytes_read as u64).sum();
    let mine =
        [(m.eager_pool + m.control) as u64, after_init, conns.len() as u64, m.first_contact as u64, last_us, init_us, put, read, boot_read];
    let fields = mine.len();
    let mut all = vec![0u64; fields * n as usize];
    w.allgather(&mine, &mut all).map_err(|e| e.to_string())?;
    let ranks: Vec<&[u64]> = all.chunks(fields).collect();
    let differ = |i: usize, want: u64, unit: &str| -> Vec<String> {
        ranks.iter().enumerate().filter(|(_, v)| v[i] != want).map(|(r, v)| format!("rank {r}: {}{unit}", v[i])).collect()
    };
    // The model's address is verbs'; an ofi address is the provider's
    // endpoint name, whose size the model does not know: there it checks
    // that every rank's is the same fixed size, whatever N.
    let verbs = family.starts_with("verbs");
    let want_put = if verbs { model.address_bytes } else { ranks[0][6] };
    let read_of = |put: u64| put * (n64 - 1);
    let checks = [
        (differ(0, model.eager_bytes, " B"), format!("{} B of eager receive memory after the ring", model.eager_bytes)),
        (differ(1, at_init, " connections"), format!("{at_init} connections after init")),
        (differ(2, model.queue_pairs, " connections"), format!("{} connections after the ring", model.queue_pairs)),
        (differ(6, want_put, " B"), format!("a {want_put}-byte {} published", &family[..family.len() - 2])),
        (differ(7, read_of(want_put), " B"), format!("{} B of {family} read at init", read_of(want_put))),
    ];
    let shown = |i: usize, want: String| if checks[i].0.is_empty() { want } else { checks[i].0.join(", ") };
    if me == 0 {
        let slowest = |i: usize| ranks.iter().map(|v| v[i]).max().unwrap_or(0) as f64 / 1000.0;
        println!("# scale model against this job ({transport}): per process, after init and a ring exchange (d = {degree})");
        println!(
            "| N | mode | eager memory: model | measured (every rank) | first-contact slots | connections after init: model | measured | after the ring: model | measured | address: model | measured | addresses read: model | measured | bootstrap read in all | init took (slowest rank) | last connection ready |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let model_address = if verbs { format!("{} B", model.address_bytes) } else { "(verbs only)".into() };
        let model_read = if verbs { format!("{} B", read_of(model.address_bytes)) } else { format!("(N-1) x {want_put} B") };
        println!(
            "| {n} | {} | {} B | {} | {} B | {at_init} | {} | {} | {} | {model_address} | {} | {model_read} | {} | {} B | {:.1} ms | {:.1} ms after init began |",
            mode.name(),
            model.eager_bytes,
            shown(0, format!("{} B", model.eager_bytes)),
            ranks[0][3],
            shown(1, at_init.to_string()),
            model.queue_pairs,
            shown(2, model.queue_pairs.to_string()),
            shown(3, format!("{want_put} B")),
            shown(4, format!("{} B", read_of(want_put))),
            ranks.iter().map(|v| v[8]).max().unwrap_or(0),
            slowest(5),
            slowest(4),
        );
    }
    fmx.finalize().map_err(|e| e.to_string())?;
    let wrong: Vec<String> =
        checks.iter().filter(|c| !c.0.is_empty()).map(|(who, want)| format!("{want} per process, but {}", who.join(", "))).collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("for N={n} ({}) the model says {}", mode.name(), wrong.join("; and ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Costs = Costs::FMX;

    #[test]
    fn eager_grows_with_the_job_and_lazy_with_the_degree() {
        for n in [100, 10_000, 100_000] {
            let job = Job { ranks: n, per_node: 64, degree: 6 };
            let eager = per_process(job, Mode::Eager, &C);
            let lazy = per_process(job, Mode::Lazy, &C);
            assert_eq!(eager.queue_pairs, n - 1);
            assert_eq!(lazy.queue_pairs, 6);
            // Lazy: 6 connections' slices of 8 slots and their control slots, whatever N.
            assert_eq!(lazy.eager_bytes, (6 * 8 + 2 * 6) * 8192);
            // Eager: a slot and two control slots per peer once past 64 peers.
            assert_eq!(eager.eager_bytes, (64 / (n - 1)).max(1) * (n - 1) * 8192 + 2 * (n - 1) * 8192);
            // Every address read at init, each of the fixed 65 bytes.
            assert_eq!(lazy.bootstrap_bytes, 65 * n);
            assert_eq!(eager.bootstrap_bytes, (65 + 8 * n) * n);
        }
    }

    #[test]
    fn lazy_grants_full_slices_while_the_pool_has_room_then_the_newcomer_floor() {
        assert_eq!(lazy_data_slots(0, &C), 0);
        assert_eq!(lazy_data_slots(8, &C), 64);
        // The ninth connection finds the 64-slot pool granted: 2 slots.
        assert_eq!(lazy_data_slots(9, &C), 66);
        assert_eq!(lazy_data_slots(9_999, &C), 64 + 9_991 * 2);
        // A connection slice beyond the pool is cut to it.
        let small = Costs { pool_slots: 4, ..C };
        assert_eq!(lazy_data_slots(3, &small), 4 + 2 * 2);
    }

    #[test]
    fn eager_bootstrap_is_quadratic_per_job() {
        let small = per_process(Job { ranks: 1_000, per_node: 1, degree: 999 }, Mode::Eager, &C);
        let large = per_process(Job { ranks: 10_000, per_node: 1, degree: 9_999 }, Mode::Eager, &C);
        // Ten times the ranks: about a hundred times the bytes each process reads.
        let ratio = large.bootstrap_bytes as f64 / small.bootstrap_bytes as f64;
        assert!((95.0..=101.0).contains(&ratio), "{ratio}");
        assert_eq!(small.bootstrap_msgs, 1_000);
    }

    #[test]
    fn all_to_all_connects_everyone_in_every_mode() {
        let job = Job { ranks: 32, per_node: 4, degree: 31 };
        for mode in Mode::ALL {
            assert_eq!(per_process(job, mode, &C).queue_pairs, 31, "{mode:?}");
        }
        let rc = per_process(job, Mode::RcAllToAll, &C);
        assert_eq!(rc.eager_bytes, 31 * 32 * 1024);
    }

    #[test]
    fn lazy_pays_its_setup_at_the_first_message_eager_at_init() {
        let job = Job { ranks: 10_000, per_node: 64, degree: 6 };
        let lazy = per_process(job, Mode::Lazy, &C);
        let eager = per_process(job, Mode::Eager, &C);
        assert!((lazy.first_message_us - (2.0 * C.qp_setup_us + 2.0 * C.rtt_us)).abs() < 1e-9);
        assert!((eager.first_message_us - 9_999.0 * C.qp_setup_us).abs() < 1e-6);
    }

    #[test]
    fn the_table_has_a_row_per_mode_and_size() {
        let t = table(&[100, 1000], 64, Some(6), &C);
        assert_eq!(t.lines().filter(|l| l.starts_with("| 100 |") || l.starts_with("| 1000 |")).count(), 6);
        assert!(t.contains("fmx-lazy") && t.contains("RC all-to-all"));
        assert_eq!(bytes(608 * 1024), "608.0 KiB");
        assert_eq!(duration(2_500.0), "2.5 ms");
    }
}
