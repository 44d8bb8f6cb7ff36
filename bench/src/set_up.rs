//! fmx-perf's `# set-up:` line: connection set-up apart from the steady
//! state. The pair exchanges one 8 B round trip before anything timed;
//! connected on demand (`FMX_CONNECT=lazy`) that is what connects it, and its
//! time is reported on its own, so no warm-up iteration absorbs set-up.

fn e2s(e: fmx::Error) -> String {
    e.to_string()
}

/// The pair's first 8 B round trip, from rank 0 of `comm` (`None` on the
/// others), and whether rank 0 was connected to `pair.1` before it.
pub fn first_round_trip(fmx: &fmx::Fmx, comm: &fmx::Comm, pair: (u32, u32)) -> Result<Option<FirstTrip>, String> {
    let (mut b, tag) = ([0u8; 8], 91);
    match comm.rank() {
        0 => {
            let connected_before = fmx.connections().iter().any(|c| c.rank == pair.1);
            let t = std::time::Instant::now();
            comm.send(&b, 1, tag).map_err(e2s)?;
            comm.recv(&mut b, 1, tag).map_err(e2s)?;
            Ok(Some(FirstTrip { took: t.elapsed(), connected_before }))
        }
        1 => {
            comm.recv(&mut b, 0, tag).map_err(e2s)?;
            comm.send(&b, 0, tag).map_err(e2s)?;
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The pair's first round trip before the timed loops.
#[derive(Clone, Copy)]
pub struct FirstTrip {
    /// How long it took.
    pub took: std::time::Duration,
    /// Rank 0 held a connection to the other before it.
    pub connected_before: bool,
}

/// The `# set-up:` line: when the pair's connection was made, and what the
/// first round trip cost.
pub fn line(fmx: &fmx::Fmx, comm: &fmx::Comm, pair: (u32, u32), f: FirstTrip) -> Result<String, String> {
    let transport = comm.transport_of(1).map_err(e2s)?;
    let us = f.took.as_secs_f64() * 1e6;
    let conn = fmx.connections().into_iter().find(|c| c.rank == pair.1 && c.transport == transport);
    Ok(match conn {
        None => format!("no connection to set up ({transport} keeps none per peer); the first 8 B round trip took {us:.1} us"),
        Some(c) if f.connected_before => format!(
            "rank {}'s connection to rank {} ({transport}) was ready {:.1} ms after init began, before the first message; \
             the first 8 B round trip took {us:.1} us: no warm-up iteration absorbs set-up",
            pair.0,
            pair.1,
            c.made_after.as_secs_f64() * 1e3
        ),
        Some(c) => format!(
            "rank {}'s connection to rank {} ({transport}) was made by the first message, {:.1} ms after init began \
             (connected on demand): that first 8 B round trip took {us:.1} us, set-up included, and ran before the \
             warm-up: no warm-up iteration absorbs set-up",
            pair.0,
            pair.1,
            c.made_after.as_secs_f64() * 1e3
        ),
    })
}
