//! A malleable job: iterates over a block-distributed array and reconfigures
//! 2 -> 4 -> 3 -> 1 -> 2 ranks during the run, carrying the array and the
//! iteration count across each reconfiguration.
//!
//! `cargo run --release --example malleable_sum` runs the job twice under
//! fmx's launcher (with and without reconfiguration) and checks that both
//! end with exactly the same array and iteration count. Under a launcher
//! (`MALLEABLE_SUM_SIZES=4,3,1,2 mpiexec -n 2 malleable_sum`) it runs the
//! job once and prints its RESULT line; each new world comes from Hydra's
//! PMI spawn. Set
//! `FMX_MALLEABLE_MODE=checkpoint FMX_CHECKPOINT_DIR=DIR` for the
//! checkpoint-restart mode.

use fmx::malleable::{block_range, Malleable, Mode, Policy};
use fmx::Op;

/// Elements of the array (fixed across reconfigurations).
const GLOBAL_N: u64 = 1_000_003;
/// Iterations of the whole run.
const ITERS: u64 = 25;
/// Values stay below this prime, so sums of a million of them fit in u64.
const P: u64 = 1_000_000_007;

fn main() -> fmx::Result<()> {
    if !fmx::started_by_launcher() {
        std::process::exit(drive());
    }
    let mut m = Malleable::init(Mode::from_env()?)?;
    let (me, size) = (m.world().rank(), m.world().size());
    // A spawned world receives its block, the resume point and the running
    // checksum (DMR's restart_func); a fresh launch initializes.
    let restored = m.start(|inbox| Ok((inbox.blocks::<u64>("x", GLOBAL_N)?, inbox.value::<u64>("iter")?, inbox.value::<u64>("sum")?)))?;
    let (mut x, mut iter, mut checksum) = restored.unwrap_or_else(|| (block_range(me, size, GLOBAL_N).collect(), 0, 0));
    let first = block_range(me, size, GLOBAL_N).start;
    if me == 0 {
        eprintln!("world {} of {size} ranks over {} resumes at iteration {iter}", m.reconfig_count(), m.world().transport_name());
    }
    let policy = match std::env::var("MALLEABLE_SUM_SIZES").unwrap_or_default().as_str() {
        "" => Policy::Never,
        s => Policy::Schedule { sizes: s.split(',').map(|v| v.parse().expect("MALLEABLE_SUM_SIZES: a list of sizes")).collect(), every: 5 },
    };
    while iter < ITERS {
        // On a leaving rank: spawn the new world, send the state (DMR's
        // redist_func), then finalize and exit.
        if let Some(departure) = m.check(&policy)? {
            departure.leave(|out| {
                out.blocks("x", &x, GLOBAL_N)?;
                out.value("iter", iter)?;
                out.value("sum", checksum)
            })?;
        }
        // The work: update every element, and reduce the array.
        for (k, v) in x.iter_mut().enumerate() {
            *v = (*v * 3 + (first + k as u64) % 7 + iter) % P;
        }
        let mut total = [0u64];
        m.world().allreduce(&[x.iter().sum::<u64>()], &mut total, Op::Sum)?;
        checksum = (checksum + total[0] % P) % P;
        iter += 1;
    }
    // A digest of the whole array, position-weighted, so any misplaced element shows.
    let digest = x.iter().enumerate().fold(0u64, |d, (k, &v)| (d + v * ((first + k as u64) % 1000 + 1)) % P);
    let mut all = [0u64];
    m.world().allreduce(&[digest], &mut all, Op::Sum)?;
    if me == 0 {
        println!("RESULT iterations={iter} checksum={checksum} digest={} ranks={size} reconfigurations={}", all[0] % P, m.reconfig_count());
    }
    m.finalize()
}

/// Started alone: runs the job with and without reconfiguration and compares.
fn drive() -> i32 {
    let exe = std::env::current_exe().expect("own path");
    let run = |sizes: &str| {
        let mut l = fmx_launcher::Launch::new(2, &exe);
        l.env = vec![("MALLEABLE_SUM_SIZES".into(), sizes.into())];
        l.capture = true;
        l.timeout = Some(std::time::Duration::from_secs(300));
        let o = l.run().expect("launch");
        for (_, is_err, line) in &o.lines {
            if *is_err {
                eprintln!("  {line}");
            }
        }
        let result = o.lines.iter().find(|(_, e, l)| !e && l.starts_with("RESULT")).map(|(_, _, l)| l.clone());
        (o.code, result)
    };
    println!("run without reconfiguration (2 ranks):");
    let (c1, plain) = run("");
    println!("run reconfiguring 2 -> 4 -> 3 -> 1 -> 2:");
    let (c2, malleable) = run("4,3,1,2");
    let key = |r: &Option<String>| r.as_ref().map(|l| l.split(" ranks=").next().unwrap_or_default().to_string());
    println!("  without: {}", plain.as_deref().unwrap_or("(no result)"));
    println!("  with:    {}", malleable.as_deref().unwrap_or("(no result)"));
    let same = c1 == 0 && c2 == 0 && key(&plain).is_some() && key(&plain) == key(&malleable);
    let four = malleable.as_deref().is_some_and(|l| l.ends_with("ranks=2 reconfigurations=4"));
    println!("{}", if same && four { "same array and iteration count: yes" } else { "MISMATCH" });
    if same && four {
        0
    } else {
        1
    }
}
