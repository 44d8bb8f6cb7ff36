//! Starting a new world from a running one (fmxrun is the process manager),
//! and the intercommunicator that joins the two while both are alive.
//!
//! The new world's processes run the same program from `main`; their ranks
//! `0..M` are their own world. Both worlds also join a *bridge*: a third group
//! of `N + M` processes (old ranks first) with its own transport endpoint,
//! served by fmxrun. The intercommunicator lives on the bridge, so neither
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
        Some(v) => v.parse().map(Some).map_err(|_| Error::Bootstrap(format!("{name}={v:?} is not a number"))),
    }
}

impl Fmx {
    /// Starts a world of `np` processes of this program and returns the
    /// intercommunicator to it (collective over this world, like
    /// `MPI_Comm_spawn`). The new processes see `values` in
    /// [`Fmx::spawn_values`] and reach back with [`Fmx::parent`]. Only fmxrun
    /// can do this; under other launchers the error says so.
    pub fn spawn_world(&self, np: u32, values: &str) -> Result<Intercomm> {
        self.world.sh.check_live("spawn_world")?;
        let bridge = self.ask_for_world(np, true, values)?;
        let (addr, job) = bridge.ok_or_else(|| Error::Bootstrap("fmxrun answered a spawn without a bridge".into()))?;
        let n = self.world.size();
        connect_bridge(&addr, job, self.world.rank(), n, np, true)
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
        self.world.sh.boot.borrow_mut().spawn_world(np, bridge, values)
    }

    /// In a world started by [`Fmx::spawn_world`]: the intercommunicator to
    /// the world that started it (collective over both; the first call only).
    /// `None` in a world fmxrun started directly or in checkpoint-restart mode.
    pub fn parent(&self) -> Result<Option<Intercomm>> {
        self.world.sh.check_live("parent")?;
        let Some(addr) = fmx_transport::settings::var("FMX_BRIDGE_RENDEZVOUS") else { return Ok(None) };
        if self.parent_taken.replace(true) {
            return Err(Error::Intercomm {
                op: "parent",
                detail: "the intercommunicator to the parent world was already taken (and may be freed)".into(),
            });
        }
        let job = fmx_transport::settings::var("FMX_BRIDGE_JOB")
            .ok_or_else(|| Error::Bootstrap("FMX_BRIDGE_JOB is not set (fmxrun sets it)".into()))?;
        let n = env_u32("FMX_PARENT_SIZE")?.ok_or_else(|| Error::Bootstrap("FMX_PARENT_SIZE is not set (fmxrun sets it)".into()))?;
        let m = self.world.size();
        connect_bridge(&addr, job, n + self.world.rank(), n, m, false).map(Some)
    }

    /// How many reconfigurations happened before this world started (0 for
    /// the first world; a world spawned by world `k` has `k + 1`).
    pub fn reconfig_count(&self) -> u32 {
        reconfig_count()
    }

    /// Size of the world that spawned this one (`None` for the first world).
    pub fn parent_size(&self) -> Option<u32> {
        env_u32("FMX_PARENT_SIZE").ok().flatten()
    }

    /// The values the spawning world passed to [`Fmx::spawn_world`] (empty if none).
    pub fn spawn_values(&self) -> String {
        fmx_transport::settings::var("FMX_SPAWN_VALUES").unwrap_or_default()
    }
}

/// Reconfigurations before this process's world started (fmxrun says; 0 otherwise).
pub(crate) fn reconfig_count() -> u32 {
    env_u32("FMX_RECONFIG_COUNT").ok().flatten().unwrap_or(0)
}

/// Joins the bridge of `old + new` processes as `rank` and makes the intercommunicator.
fn connect_bridge(addr: &str, job: String, rank: u32, old: u32, new: u32, old_side: bool) -> Result<Intercomm> {
    let size = old + new;
    let boot = Bootstrap::bridge(addr, rank, size, job)?;
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
