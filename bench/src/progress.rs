//! A progress line for runs longer than a few seconds, on a terminal only.
//! The ranks' stderr goes through fmxrun's relay, not to the terminal, so
//! fmx-perf started alone tells its rank 0 (`FMX_PERF_PROGRESS=tty`) to draw
//! on `/dev/tty` when its own stderr is a terminal; steps run by the parent
//! process (`all`, `compare`) draw on its stderr. Nothing is drawn when
//! stderr is not a terminal, so logs and pipes stay clean.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Runs shorter than this never show the line.
const QUIET_FOR: Duration = Duration::from_secs(3);

/// The variable rank 0 reads: `tty`, or `tty:SECS` for another quiet period.
pub const ENV: &str = "FMX_PERF_PROGRESS";

/// Whether this process's stderr is a terminal (then the ranks it starts may draw).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// A line that appears once `quiet_for` has passed.
pub struct Progress {
    bar: Option<ProgressBar>,
    target: Option<fn() -> Option<ProgressDrawTarget>>,
    started: Instant,
    quiet_for: Duration,
}

fn tty_target() -> Option<ProgressDrawTarget> {
    let tty = std::fs::File::options().read(true).write(true).open("/dev/tty").ok()?;
    let term = console::Term::read_write_pair(tty.try_clone().ok()?, tty);
    Some(ProgressDrawTarget::term(term, 10))
}

fn stderr_target() -> Option<ProgressDrawTarget> {
    Some(ProgressDrawTarget::stderr())
}

impl Progress {
    /// For rank 0 of a test: draws on `/dev/tty` when asked through [`ENV`].
    /// `tty:SECS` sets the quiet period (the tests use `tty:0`).
    pub fn for_rank(steps: usize, what: &str) -> Self {
        let v = fmx_transport_var(ENV).unwrap_or_default();
        let (wanted, secs) = match v.split_once(':') {
            Some(("tty", s)) => (true, s.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0)),
            _ => (v == "tty", None),
        };
        let mut p = Self::new(steps, what, wanted.then_some(tty_target as fn() -> _));
        if let Some(s) = secs {
            p.quiet_for = Duration::from_secs_f64(s.min(3600.0));
        }
        p
    }

    /// For steps of this process: draws on stderr when it is a terminal.
    pub fn for_steps(steps: usize, what: &str) -> Self {
        Self::new(steps, what, stderr_is_terminal().then_some(stderr_target as fn() -> _))
    }

    fn new(steps: usize, what: &str, target: Option<fn() -> Option<ProgressDrawTarget>>) -> Self {
        let bar = target.map(|_| {
            let b = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::hidden());
            b.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            b.set_prefix(what.to_owned());
            b
        });
        Self { bar, target, started: Instant::now(), quiet_for: QUIET_FOR }
    }

    /// Says what runs now; the line appears once the run has taken `QUIET_FOR`.
    pub fn step(&mut self, msg: String) {
        let Some(bar) = &self.bar else { return };
        if self.started.elapsed() >= self.quiet_for {
            if let Some(t) = self.target.take().and_then(|f| f()) {
                bar.set_draw_target(t);
            }
        }
        bar.set_message(msg);
    }

    /// One step done.
    pub fn inc(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// `FMX_PERF_PROGRESS` (bench reads its own variable directly; it is declared in the registry).
fn fmx_transport_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
