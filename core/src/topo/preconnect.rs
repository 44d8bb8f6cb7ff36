//! `fmx_preconnect`: a graph communicator connects its declared neighbours
//! while it is created, when connections are made on demand
//! (`FMX_CONNECT=lazy`): the topology says who they are, so the first
//! neighbour exchange pays no connection set-up.

use std::time::{Duration, Instant};

use fmx_transport::{Endpoint, PeerState, TransportError};

use crate::comm::Comm;
use crate::error::{Error, Result};

/// How long the neighbours may take to answer (they answer from any fmx call).
const PRECONNECT_TIMEOUT: Duration = Duration::from_secs(60);

impl Comm {
    /// Connects to `neighbours` (ranks of this communicator) and waits,
    /// making progress, until each connection exists: an error names a
    /// neighbour that is gone or never answered.
    pub(super) fn preconnect(&self, op: &'static str, neighbours: impl Iterator<Item = u32>) -> Result<()> {
        let me = self.members[self.rank() as usize];
        let mut todo: Vec<u32> = neighbours.map(|r| self.members[r as usize]).filter(|&w| w != me).collect();
        todo.sort_unstable();
        todo.dedup();
        let deadline = Instant::now() + PRECONNECT_TIMEOUT;
        loop {
            let mut e = self.sh.engine.borrow_mut();
            let mut waiting = Vec::with_capacity(todo.len());
            for &w in &todo {
                if !e.tp.preconnect(w)? {
                    waiting.push(w);
                }
            }
            todo = waiting;
            if todo.is_empty() {
                return Ok(());
            }
            e.progress(&mut self.sh.lend.borrow_mut())?;
            if let Some(&w) = todo.iter().find(|&&w| matches!(e.tp.peer_state(w), PeerState::Dead | PeerState::Finalized)) {
                return Err(Error::PeerGone {
                    rank: self.world_to_comm[w as usize],
                    world_rank: w,
                    during: format!("{op} connected to its neighbours (fmx_preconnect)"),
                    reason: "its process exited or finalized".into(),
                    pending: false,
                });
            }
            drop(e);
            if Instant::now() >= deadline {
                return Err(Error::Transport(TransportError::Setup {
                    what: format!(
                        "{op} (fmx_preconnect): world ranks {todo:?} did not answer a connection request within {} s",
                        PRECONNECT_TIMEOUT.as_secs()
                    ),
                    source: std::io::Error::from(std::io::ErrorKind::TimedOut),
                }));
            }
            std::thread::yield_now();
        }
    }
}
