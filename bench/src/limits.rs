//! `fmx-perf limits`: the hardware floor fmx is measured against, in the
//! same run. A shared-memory message cannot arrive faster than one cache
//! line moves between the two cores (measured as a ping-pong of one line
//! between two pinned threads), and a single-copy transfer cannot move
//! bytes faster than memcpy does on this host (measured per size).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::cli::{size_range, SizeRange};

/// Options of `fmx-perf limits`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// memcpy sizes: MAX, or MIN:MAX (powers of two between)
    #[arg(short = 'm', long = "message-size", value_name = "[MIN:]MAX", default_value = "8:4M", value_parser = size_range)]
    pub sizes: SizeRange,
    /// Round trips of the cache line per run (five runs; the median is shown)
    #[arg(short = 'i', long = "iterations", default_value_t = 100_000, value_parser = crate::cli::at_least_one)]
    pub iterations: u64,
}

/// One cache line of its own (no false sharing with anything else).
#[repr(align(128))]
struct Line(AtomicU64);

/// Written into the line instead of the next count: the run is over.
const STOP: u64 = u64::MAX;

/// Waits until `line` holds `want` (false: it holds [`STOP`]); yields now
/// and then so that two threads on an oversubscribed host still make progress.
fn wait_for(line: &Line, want: u64) -> bool {
    let mut spins = 0u32;
    loop {
        match line.0.load(Ordering::Acquire) {
            v if v == want => return true,
            STOP => return false,
            _ => {}
        }
        spins += 1;
        if spins % 4096 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Nanoseconds one handoff of a cache line takes between cores 0 and 1
/// (half a round trip), over `round_trips`.
pub fn handoff_ns(round_trips: u64) -> f64 {
    handoff_ns_within(round_trips, None)
}

/// [`handoff_ns`], ending early once `budget` has passed (checked every
/// 256 round trips): on a host whose cores are busy each handoff may wait
/// for a time slice, and a fixed count could take minutes.
pub fn handoff_ns_within(round_trips: u64, budget: Option<std::time::Duration>) -> f64 {
    let line = Line(AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            crate::peers::pin(1);
            for i in 0..round_trips {
                if !wait_for(&line, 2 * i + 1) {
                    return;
                }
                line.0.store(2 * i + 2, Ordering::Release);
            }
        });
        // The timing side is a thread of its own too: pinning the caller
        // would leave it (and every process it starts later) on core 0.
        s.spawn(|| {
            crate::peers::pin(0);
            let t = Instant::now();
            let mut done = round_trips;
            for i in 0..round_trips {
                if i > 0 && i % 256 == 0 && budget.is_some_and(|b| t.elapsed() > b) {
                    // The partner waits for 2i + 1: it reads the stop instead.
                    line.0.store(STOP, Ordering::Release);
                    done = i;
                    break;
                }
                line.0.store(2 * i + 1, Ordering::Release);
                wait_for(&line, 2 * i + 2);
            }
            t.elapsed().as_secs_f64() * 1e9 / (2.0 * done as f64)
        })
        .join()
        .expect("the timing thread does not panic")
    })
}

/// memcpy bandwidth (MB/s, 10^6 B/s) of one `size`-byte copy between two buffers.
pub fn memcpy_mbps(src: &[u8], dst: &mut [u8], size: usize) -> f64 {
    // About 256 MiB per size, at least 16 copies (a few ms even for 4 MiB).
    let reps = ((256usize << 20) / size.max(1)).clamp(16, 1 << 22);
    for _ in 0..reps / 16 + 1 {
        dst[..size].copy_from_slice(black_box(&src[..size]));
    }
    let t = Instant::now();
    for _ in 0..reps {
        dst[..size].copy_from_slice(black_box(&src[..size]));
        black_box(&mut dst[..size]);
    }
    (size * reps) as f64 / t.elapsed().as_secs_f64() / 1e6
}

/// The floor of this host.
#[derive(Clone, Debug)]
pub struct Floor {
    /// Best of five runs: ns per cache-line handoff (a floor is what the
    /// hardware can do; on a shared VM the other runs include waits for a vCPU).
    pub handoff_ns: f64,
    /// Median and highest of the five runs.
    pub handoff_range: (f64, f64),
    /// (size, memcpy MB/s).
    pub memcpy: Vec<(usize, f64)>,
}

/// Measures the floor for memcpy sizes `sizes` and `round_trips` per handoff run.
pub fn measure(sizes: SizeRange, round_trips: u64) -> Floor {
    let mut runs: Vec<f64> = (0..5).map(|_| handoff_ns(round_trips)).collect();
    runs.sort_by(f64::total_cmp);
    let max = sizes.max.max(1);
    let (src, mut dst) = (vec![7u8; max], vec![0u8; max]);
    let mut memcpy = Vec::new();
    let mut s = sizes.min.unwrap_or(1).max(1).next_power_of_two();
    while s <= max {
        memcpy.push((s, memcpy_mbps(&src, &mut dst, s)));
        s *= 2;
    }
    Floor { handoff_ns: runs[0], handoff_range: (runs[2], runs[4]), memcpy }
}

/// The report: the handoff on comment lines, memcpy as OSU's two columns.
pub fn render(f: &Floor) -> String {
    let mut t = format!(
        "# fmx-perf limits: the hardware floor of this host\n# core-to-core cache-line handoff (cores 0 and 1): {:.1} ns \
         (best of 5 runs; median {:.1}, worst {:.1})\n# Size        memcpy (MB/s)\n",
        f.handoff_ns, f.handoff_range.0, f.handoff_range.1
    );
    for (size, mbps) in &f.memcpy {
        t.push_str(&format!("{size:<10}{mbps:>18.2}\n"));
    }
    t
}

/// Entry point of `fmx-perf limits`.
pub fn main(a: &Args) -> Result<(), String> {
    print!("{}", render(&measure(a.sizes, a.iterations)));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_floor_is_measured_not_assumed() {
        // Two threads really hand the line back and forth (a broken wait would hang or return 0).
        let ns = super::handoff_ns(2000);
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        // The caller keeps its cores (processes it starts later inherit them).
        let allowed = || {
            let st = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            st.lines().find(|l| l.starts_with("Cpus_allowed_list")).unwrap().to_owned()
        };
        let before = allowed();
        super::handoff_ns(1000);
        assert_eq!(allowed(), before);
        // A budget ends a long run early, and the partner thread with it (no hang).
        let t = std::time::Instant::now();
        let ns = super::handoff_ns_within(u64::MAX / 4, Some(std::time::Duration::from_millis(50)));
        assert!(ns.is_finite() && ns > 0.0 && t.elapsed() < std::time::Duration::from_secs(30), "{ns}");
        let (src, mut dst) = (vec![5u8; 4096], vec![0u8; 4096]);
        assert!(super::memcpy_mbps(&src, &mut dst, 4096) > 0.0);
        assert_eq!(dst, src, "the copy really happened");
    }
}
