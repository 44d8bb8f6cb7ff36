//! fmxrun's rendezvous server: one per world (and one per bridge between two
//! worlds), serving the bootstrap rounds in lock step.

use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;

use super::Event;
use crate::bootstrap::wire::{self, OP_ALLGATHER, OP_BARRIER, OP_FINALIZE, OP_HELLO, OP_SPAWN};

/// A world's request to start another world, as every rank sent it.
pub(crate) struct SpawnAsk {
    /// Size of the asking world.
    pub(crate) parent_np: u32,
    /// Size of the new world.
    pub(crate) np: u32,
    /// Connect both worlds through a bridge (intercommunicator mode).
    pub(crate) bridge: bool,
    /// Opaque values for the new world (`FMX_SPAWN_VALUES`).
    pub(crate) values: Vec<u8>,
    /// Where the answer goes: the bridge's address and job id, or why not.
    pub(crate) reply: mpsc::Sender<Result<Option<(String, String)>, String>>,
}

/// Decodes a spawn round's body: new size, bridge flag, values.
pub(crate) fn decode_spawn(body: &[u8]) -> Option<(u32, bool, &[u8])> {
    let np = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let bridge = *body.get(4)? != 0;
    Some((np, bridge, &body[5..]))
}

/// Serves the rounds of one group of `np` ranks; on any failure closes every
/// connection, so that ranks waiting in a round get an error instead of hanging.
pub(crate) fn serve(listener: &TcpListener, np: u32, events: &mpsc::Sender<Event>) {
    let Some(mut conns) = accept_all(listener, np) else { return };
    loop {
        let mut op = None;
        let mut blobs = Vec::with_capacity(np as usize);
        for c in &mut conns {
            match wire::read_frame(c) {
                Ok((o, body)) if op.is_none_or(|p| p == o) => {
                    op = Some(o);
                    blobs.push(body);
                }
                _ => return, // a rank died or disagreed: dropping `conns` closes them all
            }
        }
        let op = op.expect("np >= 1");
        let reply = match op {
            OP_ALLGATHER => wire::encode_blobs(&blobs),
            OP_BARRIER | OP_FINALIZE => Vec::new(),
            OP_SPAWN => spawn_reply(np, &blobs, events),
            _ => return,
        };
        for c in &mut conns {
            let _ = wire::write_frame(c, op, &reply);
        }
        if op == OP_FINALIZE {
            return;
        }
    }
}

fn accept_all(listener: &TcpListener, np: u32) -> Option<Vec<TcpStream>> {
    let mut conns: Vec<Option<TcpStream>> = (0..np).map(|_| None).collect();
    for _ in 0..np {
        let (mut s, _) = listener.accept().ok()?;
        let _ = s.set_nodelay(true);
        let Ok((OP_HELLO, body)) = wire::read_frame(&mut s) else { return None };
        let rank = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
        let size = body.get(4..8).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        if rank >= np || size != Some(np) || conns[rank as usize].is_some() {
            return None;
        }
        conns[rank as usize] = Some(s);
    }
    let mut conns: Vec<TcpStream> = conns.into_iter().flatten().collect();
    if conns.iter_mut().any(|c| wire::write_frame(c, OP_HELLO, &[]).is_err()) {
        return None;
    }
    Some(conns)
}

/// Asks the launcher's main loop to start the world; the reply is a status
/// byte (0 ok, 1 error) then the bridge's address and job, or the error text.
fn spawn_reply(np: u32, blobs: &[Vec<u8>], events: &mpsc::Sender<Event>) -> Vec<u8> {
    let fail = |msg: String| {
        let mut v = vec![1u8];
        v.extend_from_slice(msg.as_bytes());
        v
    };
    if let Some(r) = blobs.iter().position(|b| b != &blobs[0]) {
        return fail(format!("spawn: ranks 0 and {r} asked for different worlds (a spawn is collective and must agree)"));
    }
    let Some((new_np, bridge, values)) = decode_spawn(&blobs[0]) else {
        return fail("spawn: malformed request".into());
    };
    let (tx, rx) = mpsc::channel();
    let ask = SpawnAsk { parent_np: np, np: new_np, bridge, values: values.to_vec(), reply: tx };
    if events.send(Event::Spawn(ask)).is_err() {
        return fail("spawn: fmxrun is shutting down".into());
    }
    match rx.recv() {
        Ok(Ok(Some((addr, job)))) => {
            let mut v = vec![0u8];
            v.extend_from_slice(&wire::encode_blobs(&[addr.into_bytes(), job.into_bytes()]));
            v
        }
        Ok(Ok(None)) => vec![0u8],
        Ok(Err(e)) => fail(e),
        Err(_) => fail("spawn: fmxrun is shutting down".into()),
    }
}
