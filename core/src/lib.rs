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
//! Run it with `fmxrun -n 4 ./program`; started alone it is a world of one.
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
//! [`Fmx::finalize`] waits for every rank (a barrier through the launcher),
//! then closes the transport; dropping [`Fmx`] finalizes too, ignoring errors.
//! Shared-memory files are removed as soon as every rank has mapped them.
//!
//! ## Cargo features
//! None yet: the shared-memory transport is always built. Verbs and
//! libfabric transports arrive as features.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bootstrap;
mod coll;
mod comm;
mod engine;
mod error;
pub mod launcher;
mod scope;
mod select;
mod status;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use coll::{Op, Reduce};
pub use comm::Comm;
pub use error::{Error, Result};
pub use scope::{Request, Scope};
pub use select::TRANSPORT_NAMES;
pub use status::{Source, Status, Tag, TAG_UB};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The library instance: owns the transport and the world communicator.
pub struct Fmx {
    world: Comm,
}

/// Starts fmx from the launcher's environment (fmxrun; or a world of one).
pub fn init() -> Result<Fmx> {
    if INITIALIZED.swap(true, Ordering::SeqCst) {
        return Err(Error::AlreadyInitialized);
    }
    let r = init_inner();
    if r.is_err() {
        INITIALIZED.store(false, Ordering::SeqCst);
    }
    r
}

fn init_inner() -> Result<Fmx> {
    launcher::watch_launcher()?;
    let mut boot = bootstrap::Bootstrap::from_env()?;
    let tp = select::open(&mut boot)?;
    let size = boot.size();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let local_ranks = std::env::var("FMX_LOCAL_SIZE").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(size as usize);
    let sh = Rc::new(comm::Shared {
        engine: RefCell::new(engine::Engine::new(tp, local_ranks > cores)),
        lend: RefCell::new(fmx_transport::lend::LendTable::new()),
        boot: RefCell::new(boot),
        finalized: Cell::new(false),
        max_ctx: Cell::new(1),
    });
    let world = Comm::new(sh, 0, (0..size).collect(), size);
    Ok(Fmx { world })
}

impl Fmx {
    /// The communicator of every process of the job.
    pub fn world(&self) -> &Comm {
        &self.world
    }

    /// Waits for every rank, then shuts the transport down. Communicators
    /// answer [`Error::Finalized`] afterwards.
    pub fn finalize(mut self) -> Result<()> {
        self.finalize_inner()
    }

    fn finalize_inner(&mut self) -> Result<()> {
        let sh = &self.world.sh;
        if sh.finalized.get() {
            return Ok(());
        }
        // Drain sends that still wait for slots: peers may need them to finish.
        {
            let mut e = sh.engine.borrow_mut();
            let mut lend = sh.lend.borrow_mut();
            let mut spins = 0u32;
            while e.has_queued() {
                e.progress(&mut lend)?;
                spins += 1;
                if spins > 128 {
                    std::thread::yield_now();
                }
            }
        }
        sh.finalized.set(true);
        let r = sh.boot.borrow_mut().finalize();
        use fmx_transport::Endpoint;
        sh.engine.borrow_mut().tp.finalize()?;
        r
    }
}

impl Drop for Fmx {
    fn drop(&mut self) {
        let _ = self.finalize_inner();
    }
}
