//! The measurement loops, as the OSU micro-benchmarks run them, between
//! ranks 0 and 1 of a communicator (other ranks idle at the barriers).
//! With per-iteration timing on, rank 0 also times every iteration (a round
//! trip, or a window and its acknowledgement) for the statistics.

use std::time::Instant;

use fmx::{Comm, Fmx};

use crate::params::{Params, Test};
use crate::report::Row;
use crate::stats::Stats;

const TAG: i32 = 1;
const ACK_TAG: i32 = 2;

type Buf = Box<dyn std::ops::DerefMut<Target = [u8]>>;

fn buffer(fmx: &Fmx, plain: bool, len: usize, fill: u8) -> fmx::Result<Buf> {
    let mut b: Buf = if plain { Box::new(vec![0u8; len]) } else { Box::new(fmx.alloc_registered::<u8>(len)?) };
    b.fill(fill);
    Ok(b)
}

/// Times iterations: the whole timed loop, and each iteration when asked.
struct Clock {
    start: Instant,
    last: Instant,
    /// Seconds per timed iteration (empty unless per-iteration timing is on).
    samples: Vec<f64>,
    per_iteration: bool,
}

impl Clock {
    fn new(per_iteration: bool, iters: usize) -> Self {
        let now = Instant::now();
        Self { start: now, last: now, samples: Vec::with_capacity(if per_iteration { iters } else { 0 }), per_iteration }
    }

    /// Called before iteration `i`: the timed part starts at `warmup`.
    fn tick(&mut self, i: usize, warmup: usize) {
        if i < warmup {
            return;
        }
        let now = Instant::now();
        if i == warmup {
            self.start = now;
        } else if self.per_iteration {
            self.samples.push((now - self.last).as_secs_f64());
        }
        self.last = now;
    }

    /// Seconds of the timed part; closes the last iteration's sample.
    fn stop(&mut self) -> f64 {
        let now = Instant::now();
        if self.per_iteration {
            self.samples.push((now - self.last).as_secs_f64());
        }
        (now - self.start).as_secs_f64()
    }
}

/// Runs every size of `p` on the world; rank 0 hands each size's row to
/// `emit` as soon as it is measured.
pub fn run(fmx: &Fmx, p: &Params, mut emit: impl FnMut(Row) -> Result<(), String>) -> Result<(), String> {
    let e2s = |e: fmx::Error| e.to_string();
    let world = fmx.world();
    let max = p.sizes().last().copied().unwrap_or(0);
    let mut sbuf = buffer(fmx, p.plain, max, b'a').map_err(e2s)?;
    let mut rbuf = buffer(fmx, p.plain, max, b'b').map_err(e2s)?;
    for size in p.sizes() {
        world.barrier().map_err(e2s)?;
        let (iters, warmup) = p.loops(size);
        let mut clock = Clock::new(p.per_iteration(), iters);
        let (s, r) = (&sbuf[..size], &mut rbuf[..size]);
        match p.test {
            Test::Latency => latency(world, s, r, iters, warmup, &mut clock),
            Test::Bw => bw(world, s, r, iters, warmup, p.window, &mut clock),
            Test::Bibw => bibw(world, s, r, iters, warmup, p.window, &mut clock),
        }
        .map_err(e2s)?;
        let secs = clock.stop();
        if world.rank() == 0 {
            // Bytes one timed iteration moves (bandwidth tests), or the
            // round trip's two halves (latency).
            let per_iteration = match p.test {
                Test::Latency => 0.0,
                Test::Bw => (size * p.window) as f64,
                Test::Bibw => (2 * size * p.window) as f64,
            };
            let (value, mut samples): (f64, Vec<f64>) = match p.test {
                Test::Latency => (secs * 1e6 / (2.0 * iters as f64), clock.samples.iter().map(|s| s * 1e6 / 2.0).collect()),
                _ => (per_iteration * iters as f64 / secs / 1e6, clock.samples.iter().map(|s| per_iteration / s / 1e6).collect()),
            };
            emit(Row { size, iterations: iters, warmup, value, stats: Stats::of(&mut samples) })?;
        }
        sbuf[..size].fill(b'a');
    }
    Ok(())
}

/// Blocking ping-pong; rank 0 times round trips.
fn latency(c: &Comm, s: &[u8], r: &mut [u8], iters: usize, warmup: usize, clock: &mut Clock) -> fmx::Result<()> {
    for i in 0..iters + warmup {
        clock.tick(i, warmup);
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
    Ok(())
}

/// Window of sends, one 4-byte ack: MB/s (10^6 B/s) seen by the sender.
///
/// OSU posts `window` receives into one buffer; Rust forbids that aliasing,
/// so the receiver takes the window's messages one after another into one
/// buffer (same bytes touched; the sender's sends are all in flight at once).
fn bw(c: &Comm, s: &[u8], r: &mut [u8], iters: usize, warmup: usize, window: usize, clock: &mut Clock) -> fmx::Result<()> {
    let mut ack = [0u8; 4];
    for i in 0..iters + warmup {
        clock.tick(i, warmup);
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
    Ok(())
}

/// Both ranks send a window to each other: aggregate MB/s.
fn bibw(c: &Comm, s: &[u8], r: &mut [u8], iters: usize, warmup: usize, window: usize, clock: &mut Clock) -> fmx::Result<()> {
    for i in 0..iters + warmup {
        clock.tick(i, warmup);
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
    Ok(())
}
