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

    /// Called before iteration `i`: the timed part starts at `warmup`. The
    /// clock is read per iteration only when each is timed (OSU reads it at
    /// the start and the end: a read per round trip was 5-7 % of fmx's 8 B
    /// latency in `perf`, a cost the MPI peers did not pay).
    #[inline]
    fn tick(&mut self, i: usize, warmup: usize) {
        if i < warmup || (i > warmup && !self.per_iteration) {
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

/// Runs every size of `p` on `world` (its ranks 0 and 1 measure; mbw_mr:
/// all of its ranks); rank 0 hands each size's row to `emit` as soon as it
/// is measured. `fmx` gives the registered buffers.
pub fn run(fmx: &Fmx, world: &fmx::Comm, p: &Params, mut emit: impl FnMut(Row) -> Result<(), String>) -> Result<(), String> {
    let e2s = |e: fmx::Error| e.to_string();
    let pairs = p.pairs;
    let max = p.sizes().last().copied().unwrap_or(0);
    let mut sbuf = buffer(fmx, p.plain, max, b'a').map_err(e2s)?;
    let mut rbuf = buffer(fmx, p.plain, max, b'b').map_err(e2s)?;
    let mut progress =
        (world.rank() == 0).then(|| crate::progress::Progress::for_rank(p.sizes().len(), &format!("fmx-perf {}", p.test.name())));
    for size in p.sizes() {
        if let Some(pr) = progress.as_mut() {
            pr.step(format!("{size} B"));
        }
        world.barrier().map_err(e2s)?;
        let (iters, warmup) = p.loops(size);
        let mut clock = Clock::new(p.per_iteration(), iters);
        let (s, r) = (&sbuf[..size], &mut rbuf[..size]);
        match p.test {
            Test::Latency => latency(world, s, r, iters, warmup, &mut clock),
            Test::Bw => bw(world, s, r, iters, warmup, p.window, &mut clock),
            Test::Bibw => bibw(world, s, r, iters, warmup, p.window, &mut clock),
            Test::MbwMr => mbw_mr(world, s, r, iters, warmup, p.window, pairs, &mut clock),
        }
        .map_err(e2s)?;
        let mut secs = clock.stop();
        if p.test == Test::MbwMr {
            // The pairs run at once: the aggregate is over the slowest sender's time.
            let mine = [if (world.rank() as usize) < pairs { secs } else { 0.0 }];
            let mut slowest = [0.0f64];
            world.allreduce(&mine, &mut slowest, fmx::Op::Max).map_err(e2s)?;
            secs = slowest[0];
        }
        if world.rank() == 0 {
            // Messages and bytes one timed iteration moves (bandwidth tests).
            let messages = match p.test {
                Test::Latency => 0,
                Test::Bw => p.window,
                Test::Bibw => 2 * p.window,
                Test::MbwMr => pairs * p.window,
            } as f64;
            let bytes = messages * size as f64;
            let (value, mut samples): (f64, Vec<f64>) = match p.test {
                Test::Latency => (secs * 1e6 / (2.0 * iters as f64), clock.samples.iter().map(|s| s * 1e6 / 2.0).collect()),
                _ => (bytes * iters as f64 / secs / 1e6, clock.samples.iter().map(|s| bytes / s / 1e6).collect()),
            };
            let rate = (p.test != Test::Latency).then(|| messages * iters as f64 / secs);
            emit(Row { size, iterations: iters, warmup, value, stats: Stats::of(&mut samples), rate })?;
        }
        if let Some(pr) = &progress {
            pr.inc();
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

/// osu_mbw_mr: ranks `0..pairs` each stream a window to their partner
/// `rank + pairs` and wait for its 4-byte ack, all pairs at once.
#[allow(clippy::too_many_arguments)]
fn mbw_mr(
    c: &Comm,
    s: &[u8],
    r: &mut [u8],
    iters: usize,
    warmup: usize,
    window: usize,
    pairs: usize,
    clock: &mut Clock,
) -> fmx::Result<()> {
    let me = c.rank() as usize;
    let mut ack = [0u8; 4];
    for i in 0..iters + warmup {
        clock.tick(i, warmup);
        if me < pairs {
            let to = (me + pairs) as u32;
            c.scope(|sc| {
                for _ in 0..window {
                    let _ = sc.isend(s, to, TAG)?;
                }
                Ok(())
            })?;
            c.recv(&mut ack, to, ACK_TAG)?;
        } else if me < 2 * pairs {
            let from = (me - pairs) as u32;
            for _ in 0..window {
                c.recv(r, from, TAG)?;
            }
            c.send(&ack, from, ACK_TAG)?;
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
