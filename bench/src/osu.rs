//! The measurement loops, as the OSU micro-benchmarks run them, between
//! ranks 0 and 1 of a communicator (other ranks idle at the barriers).

use std::time::Instant;

use fmx::{Comm, Fmx, Result};

use crate::params::{Params, Test};
use crate::report::Row;

const TAG: i32 = 1;
const ACK_TAG: i32 = 2;

type Buf = Box<dyn std::ops::DerefMut<Target = [u8]>>;

fn buffer(fmx: &Fmx, plain: bool, len: usize, fill: u8) -> Result<Buf> {
    let mut b: Buf = if plain { Box::new(vec![0u8; len]) } else { Box::new(fmx.alloc_registered::<u8>(len)?) };
    b.fill(fill);
    Ok(b)
}

/// Runs every size of `p` on the world; rows on rank 0, empty elsewhere.
pub fn run(fmx: &Fmx, p: &Params) -> Result<Vec<Row>> {
    let world = fmx.world();
    let mut rows = Vec::new();
    let max = p.sizes().last().copied().unwrap_or(0);
    let mut sbuf = buffer(fmx, p.plain, max, b'a')?;
    let mut rbuf = buffer(fmx, p.plain, max, b'b')?;
    for size in p.sizes() {
        world.barrier()?;
        let (iters, warmup) = p.loops(size);
        let value = match p.test {
            Test::Latency => latency(world, &sbuf[..size], &mut rbuf[..size], iters, warmup)?,
            Test::Bw => bw(world, &sbuf[..size], &mut rbuf[..size], iters, warmup, p.window)?,
            Test::Bibw => bibw(world, &sbuf[..size], &mut rbuf[..size], iters, warmup, p.window)?,
        };
        if world.rank() == 0 {
            rows.push(Row { size, value });
        }
        sbuf[..size].fill(b'a');
    }
    Ok(rows)
}

/// Half the round trip of a blocking ping-pong, in microseconds.
fn latency(c: &Comm, s: &[u8], r: &mut [u8], iters: usize, warmup: usize) -> Result<f64> {
    let mut t0 = Instant::now();
    for i in 0..iters + warmup {
        if i == warmup {
            t0 = Instant::now();
        }
        match c.rank() {
            0 => {
                c.send(s, 1, TAG)?;
                c.recv(r, 1, TAG)?;
            }
            1 => {
                c.recv(r, 0, TAG)?;
                c.send(s, 0, TAG)?;
            }
            _ => {}
        }
    }
    Ok(t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64))
}

/// Window of sends, one 4-byte ack: MB/s (10^6 B/s) seen by the sender.
///
/// OSU posts `window` receives into one buffer; Rust forbids that aliasing,
/// so the receiver takes the window's messages one after another into one
/// buffer (same bytes touched; the sender's sends are all in flight at once).
fn bw(c: &Comm, s: &[u8], r: &mut [u8], iters: usize, warmup: usize, window: usize) -> Result<f64> {
    let mut t0 = Instant::now();
    let mut ack = [0u8; 4];
    for i in 0..iters + warmup {
        if i == warmup {
            t0 = Instant::now();
        }
        match c.rank() {
            0 => {
                c.scope(|sc| {
                    for _ in 0..window {
                        let _ = sc.isend(s, 1, TAG)?;
                    }
                    Ok(())
                })?;
                c.recv(&mut ack, 1, ACK_TAG)?;
            }
            1 => {
                for _ in 0..window {
                    c.recv(r, 0, TAG)?;
                }
                c.send(&ack, 0, ACK_TAG)?;
            }
            _ => {}
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((s.len() * iters * window) as f64 / secs / 1e6)
}

/// Both ranks send a window to each other: aggregate MB/s.
fn bibw(c: &Comm, s: &[u8], r: &mut [u8], iters: usize, warmup: usize, window: usize) -> Result<f64> {
    let mut t0 = Instant::now();
    for i in 0..iters + warmup {
        if i == warmup {
            t0 = Instant::now();
        }
        if c.rank() < 2 {
            let peer = 1 - c.rank();
            c.scope(|sc| {
                for _ in 0..window {
                    let _ = sc.isend(s, peer, TAG)?;
                }
                for _ in 0..window {
                    c.recv(&mut *r, peer, TAG)?;
                }
                Ok(())
            })?;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((2 * s.len() * iters * window) as f64 / secs / 1e6)
}
