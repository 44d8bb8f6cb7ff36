//! A static world on top of FM's dynamic process model (the seed's
//! `allallsync`): notify every smaller ID, wait for every larger one, then
//! promise that no one else will join and reallocate credits.

use fmx_transport::Endpoint;

use crate::coll::util::{recv, tag};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Waits until processes `0..maxnodes` have joined. The rule lets us send to
/// every smaller ID at once; the larger ones can send to us, and their
/// message is what lets us send to them.
pub(crate) fn wait_for_join(world: &Comm, maxnodes: u32) -> Result<()> {
    let me = world.rank();
    if maxnodes > world.size() {
        return Err(Error::InvalidCount {
            what: "wait_for_join",
            detail: format!("maxnodes {maxnodes} exceeds the {} processes of the job", world.size()),
        });
    }
    if me >= maxnodes {
        return Err(Error::InvalidRank { what: "wait_for_join: our node ID is not below maxnodes", rank: i64::from(me), size: maxnodes });
    }
    // A peer connected on demand (FMX_CONNECT=lazy) joins by its first
    // message: the transport opens the way then, so the join skips it.
    let joins = |j: u32| !on_demand(world, j);
    world.scope(|s| {
        for j in (0..me).filter(|&j| joins(j)) {
            let _ = s.isend_coll::<u8>(&[], j, tag::JOIN)?;
        }
        Ok(())
    })?;
    for j in (me + 1..maxnodes).filter(|&j| joins(j)) {
        recv::<u8>(world, &mut [], j, tag::JOIN)?;
    }
    Ok(())
}

/// Whether world rank `peer` is connected on demand.
pub(crate) fn on_demand(world: &Comm, peer: u32) -> bool {
    world.sh.engine.borrow().tp.connects_on_demand(peer)
}

/// Divides our eager pool among all peers ("no one else will join").
pub(crate) fn reallocate_credits(world: &Comm) -> Result<()> {
    world.sh.engine.borrow_mut().tp.reallocate_credits().map_err(Error::from)
}
