//! Malleability in the manner of DMR: a running job changes its number of
//! ranks by replacing its whole world.
//!
//! A reconfiguration spawns a brand-new world of M processes of the same
//! program (fmxrun is the process manager), moves the state across, and
//! every process of the old world exits: there are no surviving ranks, on a
//! shrink as on an expand. The state moves in one of two [`Mode`]s chosen at
//! run time, with the same user callbacks:
//!
//! - **Intercomm**: both worlds are alive for a short window and joined by an
//!   [`Intercomm`] (local group: your own world; remote group: the other one).
//! - **Checkpoint-restart**: the old world writes its state to files in a
//!   directory (atomically), exits, and the new world reads them back.
//!
//! The window is enforced by types: the leaving side gets an [`Outbox`] only
//! inside [`Departure::leave`], after the spawn, and the spawned side gets an
//! [`Inbox`] only inside [`Malleable::start`], before the intercommunicator
//! is freed; neither can outlive its closure. Keeping the intercommunicator
//! for later does not compile:
//!
//! ```compile_fail,E0521
//! # fn main() -> fmx::Result<()> {
//! let mut m = fmx::malleable::Malleable::init(fmx::malleable::Mode::Intercomm)?;
//! let mut kept = None;
//! m.start(|inbox| {
//!     kept = inbox.intercomm(); // error: borrowed data escapes the closure
//!     Ok(())
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! while using it inside does:
//!
//! ```no_run
//! # fn main() -> fmx::Result<()> {
//! let mut m = fmx::malleable::Malleable::init(fmx::malleable::Mode::Intercomm)?;
//! let mut old_size = None;
//! m.start(|inbox| {
//!     old_size = inbox.intercomm().map(fmx::Intercomm::remote_size);
//!     Ok(())
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! ```no_run
//! use fmx::malleable::{Malleable, Mode, Policy};
//! # fn main() -> fmx::Result<()> {
//! const N: u64 = 1_000_000;
//! let mut m = Malleable::init(Mode::from_env()?)?;
//! let (me, size) = (m.world().rank(), m.world().size());
//! // A spawned world receives its block and the resume point; a fresh one starts at 0.
//! let restored = m.start(|inbox| Ok((inbox.blocks::<f64>("x", N)?, inbox.value::<u64>("iter")?)))?;
//! let (mut x, mut iter) = restored.unwrap_or_else(|| {
//!     let r = fmx::malleable::block_range(me, size, N);
//!     (r.map(|i| i as f64).collect(), 0)
//! });
//! let policy = Policy::Schedule { sizes: vec![4, 3, 1, 2], every: 10 };
//! while iter < 100 {
//!     if let Some(departure) = m.check(&policy)? {
//!         // Spawns the new world, sends, then finalizes and exits this process.
//!         departure.leave(|out| {
//!             out.blocks("x", &x, N)?;
//!             out.value("iter", iter)
//!         })?;
//!     }
//!     x.iter_mut().for_each(|v| *v += 1.0);
//!     iter += 1;
//! }
//! m.finalize()
//! # }
//! ```

mod blocks;
mod checkpoint;
mod policy;

use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use bytemuck::Pod;

pub use blocks::{block_range, overlap_plan, receives_of, recv_blocks, redistribute_blocks, send_blocks, sends_of, Transfer};
use checkpoint::Generation;
pub use policy::Policy;

use crate::coll::util::tag;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::intercomm::Intercomm;
use crate::Fmx;

/// Whether a reconfiguration's intercommunicator is usable now (inside the
/// leaving side's send callback or the spawned side's restore callback).
static WINDOW_OPEN: AtomicBool = AtomicBool::new(false);

/// Whether a reconfiguration's intercommunicator is valid now (DMR's
/// `dmr_intercomm_available`): true only inside [`Departure::leave`]'s and
/// [`Malleable::start`]'s callbacks in intercomm mode.
pub fn intercomm_available() -> bool {
    WINDOW_OPEN.load(Ordering::SeqCst)
}

/// How many times the job has reconfigured before this world started (DMR's
/// `dmr_get_reconfig_count`; not a progress counter), as fmxrun's
/// environment says, so before `init` too. Under Hydra the count travels in
/// the spawn's values, which only a started fmx can read: ask
/// [`Malleable::reconfig_count`] (or `Fmx::reconfig_count`) there.
pub fn reconfig_count() -> u32 {
    crate::spawn::reconfig_count()
}

/// How state crosses a reconfiguration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Both worlds alive at once, joined by an intercommunicator.
    Intercomm,
    /// Files in `dir`: the old world writes, exits; the new world reads.
    CheckpointRestart {
        /// Where the checkpoint files go (created if missing).
        dir: PathBuf,
    },
}

impl Mode {
    /// From `FMX_MALLEABLE_MODE` (`intercomm`, the default, or `checkpoint`
    /// with the directory in `FMX_CHECKPOINT_DIR`).
    pub fn from_env() -> Result<Self> {
        match fmx_transport::settings::var("FMX_MALLEABLE_MODE").unwrap_or_default().as_str() {
            "" | "intercomm" => Ok(Self::Intercomm),
            "checkpoint" => match fmx_transport::settings::var("FMX_CHECKPOINT_DIR") {
                Some(d) => Ok(Self::CheckpointRestart { dir: d.into() }),
                _ => Err(Error::Reconfig("FMX_MALLEABLE_MODE=checkpoint needs FMX_CHECKPOINT_DIR".into())),
            },
            other => Err(Error::Reconfig(format!("FMX_MALLEABLE_MODE={other:?}: expected intercomm or checkpoint"))),
        }
    }

    /// What the new world needs to know (passed through fmxrun).
    fn encode(&self) -> Result<String> {
        match self {
            Self::Intercomm => Ok("mode=intercomm".into()),
            Self::CheckpointRestart { dir } => {
                let d = dir.to_str().filter(|d| !d.contains('\n') && !d.contains('\0'));
                let d = d.ok_or_else(|| Error::Reconfig(format!("checkpoint directory {} must be UTF-8 on one line", dir.display())))?;
                Ok(format!("mode=checkpoint\ndir={d}"))
            }
        }
    }

    fn decode(values: &str) -> Option<Self> {
        let mut lines = values.lines();
        match lines.next()? {
            "mode=intercomm" => Some(Self::Intercomm),
            "mode=checkpoint" => Some(Self::CheckpointRestart { dir: lines.next()?.strip_prefix("dir=")?.into() }),
            _ => None,
        }
    }
}

/// A malleable process: owns [`Fmx`], decides reconfigurations, carries state.
pub struct Malleable {
    fmx: Fmx,
    mode: Mode,
    /// Checks in this world.
    checks: u64,
    /// [`Malleable::start`] ran.
    started: bool,
}

impl Malleable {
    /// Starts fmx ([`crate::init`]) and reconfigures in `mode` from now on.
    pub fn init(mode: Mode) -> Result<Self> {
        Ok(Self::new(crate::init()?, mode))
    }

    /// Wraps an initialized fmx.
    pub fn new(fmx: Fmx, mode: Mode) -> Self {
        Self { fmx, mode, checks: 0, started: false }
    }

    /// The fmx instance.
    pub fn fmx(&self) -> &Fmx {
        &self.fmx
    }

    /// This world.
    pub fn world(&self) -> &Comm {
        self.fmx.world()
    }

    /// Reconfigurations before this world (0 on a fresh launch).
    pub fn reconfig_count(&self) -> u32 {
        self.fmx.reconfig_count()
    }

    /// Whether this world was spawned by a reconfiguration.
    pub fn is_restart(&self) -> bool {
        self.fmx.reconfig_count() > 0
    }

    /// DMR's `dmr_init`: on a fresh launch returns `None` without calling
    /// `restore`; in a spawned world runs `restore` with the state the old
    /// world sent (the intercommunicator is valid only inside it), frees the
    /// intercommunicator, and returns what `restore` returned.
    pub fn start<S>(&mut self, restore: impl FnOnce(&mut Inbox<'_>) -> Result<S>) -> Result<Option<S>> {
        if std::mem::replace(&mut self.started, true) {
            return Err(Error::Reconfig("start was already called in this world".into()));
        }
        if !self.is_restart() {
            return Ok(None);
        }
        let mode = Mode::decode(&self.fmx.spawn_values())
            .ok_or_else(|| Error::Reconfig(format!("the parent world passed {:?}, not a reconfiguration", self.fmx.spawn_values())))?;
        let old = self.fmx.parent_size().ok_or_else(|| Error::Reconfig("FMX_PARENT_SIZE is not set (fmxrun sets it)".into()))?;
        match mode {
            Mode::Intercomm => {
                let ic = self.fmx.parent()?.ok_or_else(|| Error::Reconfig("no intercommunicator to the old world".into()))?;
                let mut inbox = Inbox { world: self.fmx.world(), channel: Channel::Intercomm(&ic), old, read: Vec::new() };
                let r = in_window(|| restore(&mut inbox));
                match r {
                    // Freeing it waits for the old world: it may exit only now.
                    Ok(s) => ic.free().map(|()| Some(s)),
                    Err(e) => {
                        ic.abandon();
                        Err(e)
                    }
                }
            }
            Mode::CheckpointRestart { dir } => {
                let generation = Generation { dir, number: self.reconfig_count() };
                let mut inbox = Inbox { world: self.fmx.world(), channel: Channel::Files(&generation), old, read: Vec::new() };
                let s = restore(&mut inbox)?;
                let read = std::mem::take(&mut inbox.read);
                // Every rank has read everything before the files go.
                self.world().barrier()?;
                if self.world().rank() == 0 {
                    let (blocks, values): (Vec<_>, Vec<_>) = read.into_iter().partition(|(b, _)| *b);
                    let names = |v: Vec<(bool, String)>| v.into_iter().map(|(_, n)| n).collect::<Vec<_>>();
                    generation.remove(&names(blocks), &names(values), old);
                }
                Ok(Some(s))
            }
        }
    }

    /// DMR's `dmr_check`: counts this check and asks `policy` whether to
    /// reconfigure now (every rank must call it at the same points).
    pub fn check(&mut self, policy: &Policy) -> Result<Option<Departure<'_>>> {
        if self.is_restart() && !self.started {
            return Err(Error::Reconfig("this world was spawned by a reconfiguration: call start() (and receive the state) first".into()));
        }
        self.checks += 1;
        let at = policy::Moment {
            size: self.world().size(),
            parent: self.fmx.parent_size(),
            generation: self.reconfig_count(),
            checks: self.checks,
        };
        let new_size = policy.decide(&at, self.world())?;
        Ok(new_size.map(|new_size| Departure { m: self, new_size }))
    }

    /// Finalizes fmx (the job's last world ends normally).
    pub fn finalize(self) -> Result<()> {
        self.fmx.finalize()
    }
}

/// A decided reconfiguration on the leaving side.
#[must_use = "a departure must leave (every rank of the world decided to)"]
pub struct Departure<'m> {
    m: &'m mut Malleable,
    new_size: u32,
}

impl Departure<'_> {
    /// Size of the world that will replace this one.
    pub fn new_size(&self) -> u32 {
        self.new_size
    }

    /// Spawns the new world, runs `send` with the [`Outbox`] (the only place
    /// the intercommunicator is valid), waits until the new world has it all,
    /// finalizes and exits this process with status 0. Returns only on error.
    pub fn leave(self, send: impl FnOnce(&mut Outbox<'_>) -> Result<()>) -> Result<Infallible> {
        let m = self.m;
        let values = m.mode.encode()?;
        match m.mode.clone() {
            Mode::Intercomm => {
                let ic = m.fmx.spawn_world(self.new_size, &values)?;
                let mut out = Outbox { world: m.fmx.world(), channel: Channel::Intercomm(&ic) };
                if let Err(e) = in_window(|| send(&mut out)) {
                    ic.abandon();
                    return Err(e);
                }
                ic.free()?;
            }
            Mode::CheckpointRestart { dir } => {
                let generation = Generation { dir, number: m.reconfig_count() + 1 };
                send(&mut Outbox { world: m.fmx.world(), channel: Channel::Files(&generation) })?;
                // Collective: every file is renamed into place before fmxrun starts the new world.
                m.fmx.spawn_detached(self.new_size, &values)?;
            }
        }
        m.fmx.finalize_inner()?;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        std::process::exit(0)
    }
}

fn in_window<R>(f: impl FnOnce() -> R) -> R {
    WINDOW_OPEN.store(true, Ordering::SeqCst);
    let r = f();
    WINDOW_OPEN.store(false, Ordering::SeqCst);
    r
}

enum Channel<'a> {
    Intercomm(&'a Intercomm),
    Files(&'a Generation),
}

/// FNV-1a of a state name: both sides compare what they send and expect.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The leaving side's way to send state (one per reconfiguration).
pub struct Outbox<'a> {
    world: &'a Comm,
    channel: Channel<'a>,
}

impl Outbox<'_> {
    /// The intercommunicator to the new world (`None` in checkpoint-restart mode).
    pub fn intercomm(&self) -> Option<&Intercomm> {
        match self.channel {
            Channel::Intercomm(ic) => Some(ic),
            Channel::Files(_) => None,
        }
    }

    /// Sends this rank's block of a block-distributed array of `global_n`
    /// elements (every old rank calls it, in the same order as the new side).
    pub fn blocks<T: Pod>(&mut self, name: &str, local: &[T], global_n: u64) -> Result<()> {
        checkpoint::check_name(name)?;
        let (me, old) = (self.world.rank(), self.world.size());
        match self.channel {
            Channel::Intercomm(ic) => {
                if me == 0 {
                    let desc = [name_hash(name), std::mem::size_of::<T>() as u64, global_n];
                    crate::coll::util::send(ic.remote(), &desc, 0, tag::REDISTRIBUTE + 1)?;
                }
                send_blocks(ic, local, global_n)
            }
            Channel::Files(g) => {
                blocks::check_block(me, old, local.len(), global_n)?;
                g.write_block(name, me, old, global_n, std::mem::size_of::<T>(), bytemuck::cast_slice(local))
            }
        }
    }

    /// Carries rank 0's `value` (e.g. the loop index to resume at) to every new rank.
    pub fn value<T: Pod>(&mut self, name: &str, value: T) -> Result<()> {
        checkpoint::check_name(name)?;
        if self.world.rank() != 0 {
            return Ok(());
        }
        match self.channel {
            Channel::Intercomm(ic) => {
                let desc = [name_hash(name), std::mem::size_of::<T>() as u64, 0];
                crate::coll::util::send(ic.remote(), &desc, 0, tag::REDISTRIBUTE + 1)?;
                crate::coll::util::send(ic.remote(), &[value], 0, tag::REDISTRIBUTE + 2)
            }
            Channel::Files(g) => g.write_value(name, bytemuck::bytes_of(&value)),
        }
    }
}

/// The spawned side's way to receive state (inside [`Malleable::start`]).
pub struct Inbox<'a> {
    world: &'a Comm,
    channel: Channel<'a>,
    old: u32,
    /// (is a block, name) of everything read: the checkpoint files to remove.
    read: Vec<(bool, String)>,
}

impl Inbox<'_> {
    /// The intercommunicator to the old world (`None` in checkpoint-restart mode).
    pub fn intercomm(&self) -> Option<&Intercomm> {
        match self.channel {
            Channel::Intercomm(ic) => Some(ic),
            Channel::Files(_) => None,
        }
    }

    /// Size of the world that is leaving.
    pub fn old_size(&self) -> u32 {
        self.old
    }

    /// New rank 0 checks that the old side sent what we expect next.
    fn expect(&self, ic: &Intercomm, name: &str, elem: usize, global_n: u64) -> Result<()> {
        if self.world.rank() != 0 {
            return Ok(());
        }
        let mut desc = [0u64; 3];
        crate::coll::util::recv(ic.remote(), &mut desc, 0, tag::REDISTRIBUTE + 1)?;
        if desc != [name_hash(name), elem as u64, global_n] {
            return Err(Error::Reconfig(format!(
                "the new world expected {name:?} ({elem}-byte elements, global_n {global_n}) but the old world sent a different item \
                 ({}-byte elements, global_n {}); both sides must carry the same items in the same order",
                desc[1], desc[2]
            )));
        }
        Ok(())
    }

    /// This rank's block of the block-distributed array `name` of `global_n` elements.
    pub fn blocks<T: Pod>(&mut self, name: &str, global_n: u64) -> Result<Vec<T>> {
        checkpoint::check_name(name)?;
        self.read.push((true, name.to_string()));
        match self.channel {
            Channel::Intercomm(ic) => {
                self.expect(ic, name, std::mem::size_of::<T>(), global_n)?;
                recv_blocks(ic, global_n)
            }
            Channel::Files(g) => {
                let (me, new) = (self.world.rank(), self.world.size());
                let r = block_range(me, new, global_n);
                let len =
                    usize::try_from(r.end - r.start).map_err(|_| Error::Reconfig(format!("a block of {} elements", r.end - r.start)))?;
                let mut out: Vec<T> = bytemuck::allocation::zeroed_vec(len);
                g.read_block(name, me, new, self.old, global_n, &mut out)?;
                Ok(out)
            }
        }
    }

    /// The value old rank 0 carried under `name` (every new rank gets it).
    pub fn value<T: Pod>(&mut self, name: &str) -> Result<T> {
        checkpoint::check_name(name)?;
        self.read.push((false, name.to_string()));
        let mut v = [T::zeroed()];
        match self.channel {
            Channel::Intercomm(ic) => {
                if self.world.rank() == 0 {
                    self.expect(ic, name, std::mem::size_of::<T>(), 0)?;
                    crate::coll::util::recv(ic.remote(), &mut v, 0, tag::REDISTRIBUTE + 2)?;
                }
                self.world.bcast(&mut v, 0)?;
            }
            Channel::Files(g) => g.read_value(name, bytemuck::bytes_of_mut(&mut v[0]))?,
        }
        Ok(v[0])
    }
}
