//! # fmx: Fast Messages, extended
//!
//! MPI-like communication for RDMA clusters, from Rust: communicators with MPI
//! matching semantics, collectives, and (in later layers) topologies and
//! malleability, over zero-copy transports with credit-based flow control.
//!
//! ## Quick start
//! ```no_run
//! let fmx = fmx::init()?;
//! let world = fmx.world();
//! let (me, n) = (world.rank(), world.size());
//! if me == 0 {
//!     world.send(&[1.0f64, 2.0], 1 % n, 7)?;
//! }
//! if me == 1 % n {
//!     let mut buf = [0.0f64; 2];
//!     let st = world.recv(&mut buf, fmx::Source::Any, fmx::Tag::Any)?;
//!     assert_eq!((st.source, st.tag, st.count), (0, 7, 2));
//! }
//! let mut sum = [0u64];
//! world.allreduce(&[u64::from(me)], &mut sum, fmx::Op::Sum)?;
//! fmx.finalize()?;
//! # Ok::<(), fmx::Error>(())
//! ```
//! Run it with `fmxrun -n 4 ./program`, `mpiexec -n 4 ./program` (MPICH's
//! Hydra, PMI-1) or `srun --mpi=pmi2 -n 4 ./program` (Slurm, PMI-2); started
//! alone it is a world of one.
//!
//! ## Non-blocking operations
//! They borrow their buffers inside [`Comm::scope`], which completes every
//! operation before it returns, so leaking a [`Request`] is harmless.
//!
//! ## Progress and thread safety
//! Progress is caller-driven: it happens inside library calls (FM's
//! *extract*); a waiting call spins briefly, then yields its core. `Fmx` and
//! communicators are single-threaded (`!Send`).
//!
//! ## Cleanup
//! [`Fmx::finalize`] tells the peers, then waits for every rank (a barrier
//! through the launcher); dropping [`Fmx`] finalizes too, ignoring errors,
//! except while the thread panics: then it tells the launcher and waits for
//! nobody.
//!
//! ## Failures
//! A peer that dies, panics or finalizes while an operation waits for it is
//! an error naming it ([`Error::PeerGone`]). Under fmxrun the job's first
//! failure is also sent to every rank: any wait that idles after it fails
//! with an error naming that rank, even a wait on a live peer, and fmxrun
//! ends the job after its kill grace. A receive from any source reports a
//! departed member as soon as it is gone, and may be waited for again
//! ([`Scope::wait_mut`]).
//! Shared-memory files are removed as soon as every rank has mapped them.
//!
//! ## Graph topologies
//! [`Comm::dist_graph_create`] and [`Comm::dist_graph_create_adjacent`]
//! (MPI-2.2) give a [`DistGraphComm`] with `neighbors` queries and the
//! neighbourhood collectives, blocking, non-blocking (in a scope) and
//! persistent ([`DistGraphComm::neighbor_alltoallv_plan`]).
//!
//! ## Intercommunicators and malleability
//! [`Comm::intercomm_create`] joins two disjoint groups of a world;
//! [`Fmx::spawn_world`] starts a new world through fmxrun and [`Fmx::parent`]
//! reaches back from it, both giving an [`Intercomm`]. [`malleable`] builds
//! DMR-style reconfiguration on them: the whole world is replaced by one of
//! another size, its state carried over the intercommunicator or through
//! checkpoint files.
//!
//! ## Cargo features
//! `verbs`: the ibverbs transport (needs rdma-core's headers). The
//! shared-memory transport is always built.
// Unsafe code only where it is unavoidable, each block with its SAFETY
// comment: adopting the PMI socket a process manager hands over by number,
// a persistent plan's loans of (and copies within) the buffers it owns, and
// the engine's one-sided operations (exposures, reads, writes), whose
// buffers the lend table keeps alive until their completion.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod am;
mod bootstrap;
mod coll;
mod comm;
pub mod diagnostics;
mod engine;
mod error;
mod failure;
mod intercomm;
mod join;
mod locality;
mod log;
pub mod malleable;
#[cfg_attr(not(any(feature = "verbs", feature = "ofi", test)), allow(dead_code))]
mod mixed;
mod registered;
mod scope;
mod select;
mod spawn;
mod status;
mod topo;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use bootstrap::{
    started_by_launcher, BootstrapExchange, SpawnRequest, UserBootstrap, ENV_BOOT_TIMEOUT, ENV_LAUNCHER_PID, ENV_RECONFIG_REQUEST,
    ENV_RENDEZVOUS,
};
pub use select::{cleanup_job, job_file_globs};

/// fmxrun's bootstrap protocol (frames, rounds, the failure notice), for the
/// launcher crate that serves it (`fmx-launcher`) and its tests.
pub mod launch_protocol {
    pub use crate::bootstrap::wire::*;
}
pub use coll::{Op, Reduce};
pub use comm::SendAttempt;
pub use comm::{Comm, Topology};
pub use error::{Error, Result};
pub use fmx_transport::{ReceiveMemory, RegistrationStats};
pub use intercomm::{Intercomm, Side};
pub use locality::Locality;
pub use registered::Registered;
pub use scope::{Request, Scope};
pub use select::{transport_problem, TRANSPORT_NAMES};
pub use status::{Source, Status, Tag, TAG_UB};
pub use topo::{Block, DistGraphComm, Info, MappingCost, NeighborPlan, NeighborRequest, Neighbors, Reorder, Weights};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The library instance: owns the transport and the world communicator.
pub struct Fmx {
    world: Comm,
    /// [`Fmx::parent`] was called (the bridge is joined once).
    parent_taken: Cell<bool>,
    /// What the world that spawned this one passed, read at first use
    /// (under Hydra a PMI get; nothing for a first world).
    lineage: std::cell::OnceCell<spawn::Lineage>,
    /// When `init` began (connections are reported relative to it).
    started: std::time::Instant,
}

/// A connection this process holds toward one rank ([`Fmx::connections`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The world rank it reaches.
    pub rank: u32,
    /// The transport that holds it (`verbs`, `ofi`).
    pub transport: &'static str,
    /// How long after `init` began it was ready.
    pub made_after: std::time::Duration,
}

/// How to start.
#[derive(Clone, Copy, Debug, Default)]
pub struct InitOptions {
    /// Return before the join (FM's dynamic process model): the program calls
    /// [`Fmx::wait_for_join`] and [`Fmx::reallocate_credits`] itself. Until
    /// then a process may send only to smaller IDs and to those that sent to it.
    pub defer_join: bool,
}

/// Starts fmx from the launcher's environment (fmxrun; or a world of one):
/// every process joins, then credits are reallocated, so the world is static.
pub fn init() -> Result<Fmx> {
    init_with(InitOptions::default())
}

/// Starts fmx with options.
pub fn init_with(opts: InitOptions) -> Result<Fmx> {
    start(opts, init_inner)
}

/// Starts fmx inside a job that something else started (an MPI job, a
/// scheduler's own wire-up), through the program's `bootstrap`: its rank,
/// size and nodes, an allgather and a barrier (see [`UserBootstrap`]). No
/// launcher is involved: spawning is refused, and a dead peer is found by
/// the transport's liveness checks.
pub fn init_with_bootstrap(bootstrap: Box<dyn UserBootstrap>, opts: InitOptions) -> Result<Fmx> {
    start(opts, move || {
        let boot = bootstrap::Bootstrap::user(bootstrap)?;
        let local_ranks = Locality::from_nodes(&boot.nodes(), boot.rank()).local_size as usize;
        let world = open_world(boot, local_ranks)?;
        Ok(Fmx { world, parent_taken: Cell::new(false), lineage: std::cell::OnceCell::new(), started: std::time::Instant::now() })
    })
}

fn start(opts: InitOptions, open: impl FnOnce() -> Result<Fmx>) -> Result<Fmx> {
    if INITIALIZED.swap(true, Ordering::SeqCst) {
        return Err(Error::AlreadyInitialized);
    }
    let started = std::time::Instant::now();
    let r = log::init().and_then(|()| open()).and_then(|mut f| {
        f.started = started;
        if !opts.defer_join {
            f.wait_for_join(f.world.size())?;
            f.reallocate_credits()?;
            f.world.agree_on_checking()?;
        }
        Ok(f)
    });
    if r.is_err() {
        INITIALIZED.store(false, Ordering::SeqCst);
    }
    r
}

fn init_inner() -> Result<Fmx> {
    bootstrap::watch_launcher()?;
    let boot = bootstrap::Bootstrap::from_env()?;
    // Ranks sharing this host: fmxrun says; PMI launchers place ranks on nodes.
    let local_ranks = fmx_transport::settings::var("FMX_LOCAL_SIZE")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| Locality::from_nodes(&boot.nodes(), boot.rank()).local_size as usize);
    let world = open_world(boot, local_ranks)?;
    Ok(Fmx { world, parent_taken: Cell::new(false), lineage: std::cell::OnceCell::new(), started: std::time::Instant::now() })
}

/// Opens a transport through `boot` and the communicator of all its ranks
/// (context 0): the process's world, or a bridge between two worlds.
pub(crate) fn open_world(mut boot: bootstrap::Bootstrap, local_ranks: usize) -> Result<Comm> {
    let tp = select::open(&mut boot)?;
    let size = boot.size();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let link = boot.link();
    let spin = fmx_transport::settings::env_limited("FMX_SPIN_POLLS", fmx_transport::settings::limits::SPIN_POLLS)?
        .map_or_else(|| engine::default_spin_polls(local_ranks > cores), |v| v as u32);
    let sh = Rc::new(comm::Shared {
        engine: RefCell::new(engine::Engine::new(tp, spin, link)),
        lend: RefCell::new(fmx_transport::lend::LendTable::new()),
        boot: RefCell::new(boot),
        finalized: Cell::new(false),
        in_handler: Cell::new(false),
        max_ctx: Cell::new(1),
        check_colls: coll::check::enabled_from_env()?,
        in_coll: Cell::new(false),
        spare_pending: RefCell::new(std::collections::VecDeque::new()),
    });
    comm::register_engine(&sh);
    Ok(Comm::new(sh, 0, (0..size).collect(), size))
}

/// Finalizes one engine: drains queued sends, tells the peers (a peer still
/// waiting for a message from us gets an error at once instead of waiting
/// for ever), waits for every rank through the launcher.
pub(crate) fn finalize_shared(sh: &std::rc::Rc<comm::Shared>) -> Result<()> {
    if sh.finalized.get() {
        return Ok(());
    }
    // Drain sends that still wait for credits: peers may need them to finish.
    let drained = sh.engine.borrow_mut().drain_queued(&mut sh.lend.borrow_mut());
    sh.finalized.set(true);
    use fmx_transport::Endpoint;
    let announced = sh.engine.borrow_mut().tp.finalize();
    drained?;
    // Ranks may finish long apart: the barrier waits, but not for a dead peer.
    let weak = std::rc::Rc::downgrade(sh);
    let mut gone_since = None;
    let watch = Box::new(move || {
        let sh = weak.upgrade()?;
        let mut e = sh.engine.try_borrow_mut().ok()?;
        // With connections made on demand, a rank that waits for us may
        // connect only now, to learn that we finalized: answer it.
        if let Ok(mut lend) = sh.lend.try_borrow_mut() {
            let _ = e.progress(&mut lend);
        }
        let Some(err) = e.dead_peer("finalizing (waiting for every rank to finish)") else {
            gone_since = None;
            return None;
        };
        // A rank that got the launcher's answer may have exited before ours
        // came, and one never connected to us (on demand) had no word to
        // say it finalized: it looks dead. The answer comes to every rank at
        // once, so a peer still gone after the grace is really lost.
        let since = *gone_since.get_or_insert_with(std::time::Instant::now);
        (since.elapsed() >= FINALIZE_GRACE).then_some(err)
    });
    let r = sh.boot.borrow_mut().finalize_watching(watch);
    announced?;
    r
}

/// How long the finalize round goes on after its watch first found a peer
/// gone (see [`finalize_shared`]).
const FINALIZE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The exit code of a Rust panic, which the launcher is told when a rank panics.
pub(crate) const PANIC_EXIT_CODE: i32 = 101;

/// Leaves without finalizing (the process is failing: it panicked): tells
/// the launcher, so every rank learns it at once, and waits for nobody.
pub(crate) fn abort_shared(sh: &comm::Shared, code: i32, why: &str) {
    if sh.finalized.replace(true) {
        return;
    }
    if let Ok(b) = sh.boot.try_borrow() {
        b.abort(code, why);
    }
}

impl Fmx {
    /// Ends the whole job, like `MPI_Abort` on the world: the launcher is told
    /// (fmxrun tells every rank; Hydra's PMI kills every rank on every node
    /// and mpiexec exits with `code`), then this process exits with `code`.
    /// For a failure no rank can recover from, such as a lost node.
    pub fn abort(self, code: i32, why: &str) -> ! {
        abort_shared(&self.world.sh, code, why);
        std::process::exit(code)
    }

    /// The communicator of every process of the job.
    pub fn world(&self) -> &Comm {
        &self.world
    }

    /// Waits until processes `0..maxnodes` have joined (FM's `allallsync`):
    /// notifies every smaller ID, waits for a message from every larger one.
    pub fn wait_for_join(&self, maxnodes: u32) -> Result<()> {
        self.world.sh.check_live("wait_for_join")?;
        join::wait_for_join(&self.world, maxnodes)
    }

    /// Promises that no one else will join: every peer gets its whole share of
    /// our eager pool, `P / (N − 1)` slots, so our eager receive memory stays
    /// `P × slot bytes` whatever the number of peers.
    pub fn reallocate_credits(&self) -> Result<()> {
        self.world.sh.check_live("reallocate_credits")?;
        join::reallocate_credits(&self.world)
    }

    /// A zeroed buffer of `len` elements registered with the transport for its
    /// lifetime: sends and receives on it need no registration of their own.
    pub fn alloc_registered<T: bytemuck::AnyBitPattern + bytemuck::NoUninit>(&self, len: usize) -> Result<Registered<T>> {
        self.world.sh.check_live("alloc_registered")?;
        Registered::new(&self.world.sh, len)
    }

    /// How the transport's memory registrations went (zeros where nothing is registered).
    pub fn registration_stats(&self) -> RegistrationStats {
        use fmx_transport::Endpoint;
        self.world.sh.engine.borrow().tp.registration_stats()
    }

    /// The launcher that started this process: `fmxrun`, `PMI-1` (Hydra),
    /// `PMI-2` (Slurm), `program` (`init_with_bootstrap`) or `single`.
    pub fn launcher(&self) -> &'static str {
        self.world.sh.boot.borrow().name()
    }

    /// Which node this process runs on, and its neighbours there.
    pub fn locality(&self) -> Locality {
        Locality::from_nodes(&self.world.sh.boot.borrow().nodes(), self.world.rank())
    }

    /// Whether this world was started by another world's [`Fmx::spawn`].
    pub fn spawned(&self) -> bool {
        self.world.sh.boot.borrow().spawned()
    }

    /// Asks the process manager to start a new world of `req.nprocs`
    /// processes (one caller, not collective). Hydra (PMI-1 and PMI-2) can;
    /// fmxrun and Slurm's PMI-2 cannot (the error says so). The new world is
    /// not connected to this one; under fmxrun, [`Fmx::spawn_world`] starts a
    /// world of this program with an intercommunicator to it.
    pub fn spawn(&self, req: &SpawnRequest) -> Result<()> {
        self.world.sh.check_live("spawn")?;
        if req.nprocs == 0 {
            return Err(Error::Launch("spawn: nprocs is 0; a world needs at least one process".into()));
        }
        self.world.sh.boot.borrow_mut().spawn(req)
    }

    /// A value the spawning world passed in [`SpawnRequest::values`]
    /// (`None` if absent, or if this world was not spawned).
    pub fn parent_value(&self, key: &str) -> Result<Option<String>> {
        self.world.sh.check_live("parent_value")?;
        self.world.sh.boot.borrow_mut().parent_value(key)
    }

    /// Where this process's receive memory goes.
    pub fn receive_memory(&self) -> ReceiveMemory {
        use fmx_transport::Endpoint;
        self.world.sh.engine.borrow().tp.receive_memory()
    }

    /// The connections this process holds, in rank order within each
    /// transport, and when each was made (after `init` began). Shared memory
    /// keeps none per peer: one segment serves the node. Today every network
    /// connection is made during `init`, toward every rank of the job (a
    /// mixed transport's network half too, toward this node's ranks).
    pub fn connections(&self) -> Vec<Connection> {
        let engine = self.world.sh.engine.borrow();
        engine
            .tp
            .connections_by_transport()
            .into_iter()
            .map(|(transport, c)| Connection { rank: c.peer, transport, made_after: c.made_at.saturating_duration_since(self.started) })
            .collect()
    }

    /// What this process exchanged through its launcher, one entry per
    /// allgather in order (the node identities, each transport's addresses):
    /// bytes put and bytes read from the other ranks. Every rank reads every
    /// rank's address at `init`, in both connection modes; lazily the
    /// address has a fixed size, eagerly a verbs address grows with the job.
    pub fn bootstrap_exchanges(&self) -> Vec<BootstrapExchange> {
        self.world.sh.boot.borrow().exchanges().to_vec()
    }

    /// Tells the peers, waits for every rank, then shuts the transport down.
    /// Communicators answer [`Error::Finalized`] afterwards. Callable through
    /// a shared reference, so that an `Fmx` kept in a `static` is finalized
    /// too: under fmxrun a rank that exits without finalizing while others
    /// run fails the job (as under Open MPI's mpirun).
    pub fn finalize(&self) -> Result<()> {
        self.finalize_inner()
    }

    fn finalize_inner(&self) -> Result<()> {
        finalize_shared(&self.world.sh).map_err(|e| self.world.localize(e))
    }
}

impl Drop for Fmx {
    /// Finalizes (ignoring errors), except while the thread panics: then
    /// the process is failing, and waiting for the others in a finalize
    /// would hang the job (they may wait for a message from us). fmxrun
    /// then tells every rank that this one panicked.
    fn drop(&mut self) {
        if std::thread::panicking() {
            abort_shared(&self.world.sh, PANIC_EXIT_CODE, "panicked");
        } else {
            let _ = self.finalize_inner();
        }
    }
}
