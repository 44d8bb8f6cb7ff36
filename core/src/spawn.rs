//! Starting a new world from a running one (fmxrun or Hydra is the process
//! manager), and the intercommunicator that joins the two while both are alive.
//!
//! The new world's processes run the same program from `main`; their ranks
//! `0..M` are their own world. Both worlds also join a *bridge*: a third group
//! of `N + M` processes (old ranks first) with its own transport endpoint,
//! served by fmxrun, or under Hydra by the old world's rank 0 (`bootstrap::hub`).
//! The intercommunicator lives on the bridge, so neither
//! world's transport has to grow; freeing it closes the bridge, which every
//! process of both worlds must do (the old world cannot leave before the new
//! one has received what it was sent).

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::intercomm::{Bridge, Intercomm, Side};
use crate::Fmx;

/// Context base of a bridge's intercommunicator (0 and 1 belong to the bridge's own group).
const BRIDGE_CTX: u32 = 2;

fn env_u32(name: &str) -> Result<Option<u32>> {
    match fmx_transport::settings::var(name) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| Error::Bootstrap(format!("{name}={v:?} is not a number"))),
    }
}

/// What the world that spawned this one passed: from the environment fmxrun
/// sets, or from the values of Hydra's PMI spawn.
#[derive(Clone, Debug, Default)]
pub(crate) struct Lineage {
    /// Reconfigurations before this world (0: the first world).
    pub(crate) count: u32,
    /// The spawning world's size.
    pub(crate) parent_size: Option<u32>,
    /// What it passed to `spawn_world`.
    pub(crate) values: String,
    /// The bridge's rendezvous and job id, for a connected world.
    pub(crate) bridge: Option<(String, String)>,
}

impl Lineage {
    /// Under Hydra, from the one value fmx's PMI spawns always carry
    /// (`spawn_keys::KEY_LINEAGE`); otherwise from the environment fmxrun sets.
    pub(crate) fn read(boot: &mut Bootstrap) -> Result<Self> {
        if boot.spawned() {
            if let Some(v) = boot.parent_value(crate::bootstrap::spawn_keys::KEY_LINEAGE)? {
                return crate::bootstrap::spawn_keys::decode_lineage(&v)
                    .ok_or_else(|| Error::Bootstrap(format!("what the spawning world passed is malformed ({v:?})")));
            }
        }
        let bridge = match fmx_transport::settings::var("FMX_BRIDGE_RENDEZVOUS") {
            None => None,
            Some(addr) => {
                let job = fmx_transport::settings::var("FMX_BRIDGE_JOB")
                    .ok_or_else(|| Error::Bootstrap("FMX_BRIDGE_JOB is not set (fmxrun sets it)".into()))?;
                Some((addr, job))
            }
        };
        Ok(Self {
            count: env_u32("FMX_RECONFIG_COUNT")?.unwrap_or(0),
            parent_size: env_u32("FMX_PARENT_SIZE")?,
            values: fmx_transport::settings::var("FMX_SPAWN_VALUES").unwrap_or_default(),
            bridge,
        })
    }
}

impl Fmx {
    /// What the spawning world passed (read once). A value fmx cannot read
    /// is said on stderr and taken as a first world's: the accessors that
    /// use it answer plain values, as under any other launcher.
    fn lineage(&self) -> &Lineage {
        self.lineage.get_or_init(|| {
            Lineage::read(&mut self.world.sh.boot.borrow_mut()).unwrap_or_else(|e| {
                eprintln!("fmx: rank {}: what the spawning world passed cannot be read: {e}", self.world.rank());
                Lineage::default()
            })
        })
    }

    /// Starts a world of `np` processes of this program and returns the
    /// intercommunicator to it (collective over this world, like
    /// `MPI_Comm_spawn`). The new processes see `values` in
    /// [`Fmx::spawn_values`] and reach back with [`Fmx::parent`]. fmxrun and
    /// Hydra (PMI-1 and PMI-2) can do this; under other launchers the error
    /// says so. Under Hydra the old world's rank 0 serves the bridge on
    /// `FMX_BRIDGE_ADDR` (default 127.0.0.1).
    pub fn spawn_world(&self, np: u32, values: &str) -> Result<Intercomm> {
        self.world.sh.check_live("spawn_world")?;
        let bridge = self.ask_for_world(np, true, values)?;
        let (addr, job) = bridge.ok_or_else(|| Error::Bootstrap("fmxrun answered a spawn without a bridge".into()))?;
        let n = self.world.size();
        connect_bridge(&addr, job, self.world.rank(), n, np, true, self.bridge_by_hub())
    }

    /// Starts a world of `np` processes without connecting to it (the
    /// checkpoint-restart mode: state goes through files).
    pub(crate) fn spawn_detached(&self, np: u32, values: &str) -> Result<()> {
        self.world.sh.check_live("spawn")?;
        self.ask_for_world(np, false, values).map(drop)
    }

    fn ask_for_world(&self, np: u32, bridge: bool, values: &str) -> Result<Option<(String, String)>> {
        if np == 0 {
            return Err(Error::Launch("spawn_world: a world needs at least one process (asked for 0)".into()));
        }
        if values.contains('\0') {
            return Err(Error::Launch("spawn_world: values may not contain NUL".into()));
        }
        // (Read before the bootstrap is borrowed: reading it may borrow it.)
        let generation = self.lineage().count;
        self.world.sh.boot.borrow_mut().spawn_world(np, bridge, values, generation)
    }

    /// Whether a bridge of this world's is served by the old world's rank 0
    /// (every launcher that can spawn but fmxrun, which serves its own).
    fn bridge_by_hub(&self) -> bool {
        self.world.sh.boot.borrow().name() != "fmxrun"
    }

    /// In a world started by [`Fmx::spawn_world`]: the intercommunicator to
    /// the world that started it (collective over both; the first call only).
    /// `None` in a world fmxrun started directly or in checkpoint-restart mode.
    pub fn parent(&self) -> Result<Option<Intercomm>> {
        self.world.sh.check_live("parent")?;
        let Some((addr, job)) = self.lineage().bridge.clone() else { return Ok(None) };
        if self.parent_taken.replace(true) {
            return Err(Error::Intercomm {
                op: "parent",
                detail: "the intercommunicator to the parent world was already taken (and may be freed)".into(),
            });
        }
        let n = self
            .lineage()
            .parent_size
            .ok_or_else(|| Error::Bootstrap("the spawning world's size is not known (FMX_PARENT_SIZE)".into()))?;
        let m = self.world.size();
        connect_bridge(&addr, job, n + self.world.rank(), n, m, false, self.bridge_by_hub()).map(Some)
    }

    /// How many reconfigurations happened before this world started (0 for
    /// the first world; a world spawned by world `k` has `k + 1`).
    pub fn reconfig_count(&self) -> u32 {
        self.lineage().count
    }

    /// Size of the world that spawned this one (`None` for the first world).
    pub fn parent_size(&self) -> Option<u32> {
        self.lineage().parent_size
    }

    /// The values the spawning world passed to [`Fmx::spawn_world`] (empty if none).
    pub fn spawn_values(&self) -> String {
        self.lineage().values.clone()
    }
}

/// Reconfigurations before this process's world started (fmxrun says; 0 otherwise).
pub(crate) fn reconfig_count() -> u32 {
    env_u32("FMX_RECONFIG_COUNT").ok().flatten().unwrap_or(0)
}

/// Joins the bridge of `old + new` processes as `rank` and makes the intercommunicator.
/// `by_hub`: the old world's rank 0 serves the bridge (under a PMI process
/// manager), not fmxrun.
fn connect_bridge(addr: &str, job: String, rank: u32, old: u32, new: u32, old_side: bool, by_hub: bool) -> Result<Intercomm> {
    let size = old + new;
    let boot = if by_hub { Bootstrap::bridge_by_hub(addr, rank, size, job)? } else { Bootstrap::bridge(addr, rank, size, job)? };
    let all = crate::open_world(boot, size as usize)?;
    crate::join::wait_for_join(&all, size)?;
    crate::join::reallocate_credits(&all)?;
    let (old_group, new_group): (Vec<u32>, Vec<u32>) = ((0..old).collect(), (old..size).collect());
    let (local, remote) = if old_side { (old_group, new_group) } else { (new_group, old_group) };
    Ok(Intercomm::from_groups(
        &all.sh,
        BRIDGE_CTX,
        local,
        remote,
        Some((Bridge { sh: all.sh.clone() }, if old_side { Side::Old } else { Side::New })),
    ))
}
