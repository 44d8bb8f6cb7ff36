//! `fmx-perf redistribute`: the DMR guide's block redistribution, timed. An
//! old world of N ranks spawns M new ranks and moves a block-distributed
//! array of `--n` doubles (default 8*10^7) over the intercommunicator; fmx
//! with `fmx::malleable::send_blocks`/`recv_blocks`, the MPI peers with the
//! guide's own C code (`peers/redistribute_peer.c`: `MPI_Comm_spawn`, then
//! `MPI_Send`/`MPI_Recv`), in the same run. The time is from a barrier across
//! both worlds to the next one, best and median of `--reps` rounds after a
//! warm-up; every round's array is checked (outside the timed region).
//! With `--update-readme FILE` the table replaces the block between
//! `<!-- redistribute-table:begin -->` and `<!-- redistribute-table:end -->`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::peers::Mpi;
use fmx::malleable::{block_range, recv_blocks, send_blocks};

/// Best and median seconds of one configuration, or why there is none.
type Timing = Result<(f64, f64), String>;

/// One rank of either world (`fmx-perf redistribute-rank N_GLOBAL M REPS`, under fmxrun).
pub fn rank_main(a: &RankArgs) -> Result<(), String> {
    let args = &a.args;
    let num = |i: usize| args.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or("usage: redistribute-rank N_GLOBAL M REPS");
    let (n, m, reps) = (num(0)?, u32::try_from(num(1)?).map_err(|e| e.to_string())?, num(2)? as usize);
    let fmx = fmx::init().map_err(|e| e.to_string())?;
    let w = fmx.world();
    let e2s = |e: fmx::Error| e.to_string();
    let parent = fmx.parent().map_err(e2s)?;
    let old = parent.is_none();
    // Old ranks on the first cores, new ranks after them (wrapping around).
    crate::peers::pin(if old { w.rank() } else { fmx.parent_size().unwrap_or(0) + w.rank() });
    let local: Vec<f64> = if old { block_range(w.rank(), w.size(), n).map(|i| i as f64).collect() } else { Vec::new() };
    let ic = match parent {
        Some(ic) => ic,
        None => fmx.spawn_world(m, "redistribute").map_err(e2s)?,
    };
    let mut times = Vec::new();
    for _ in 0..=reps {
        ic.barrier().map_err(e2s)?;
        let t = Instant::now();
        let got = if old {
            send_blocks(&ic, &local, n).map_err(e2s)?;
            Vec::new()
        } else {
            recv_blocks::<f64>(&ic, n).map_err(e2s)?
        };
        ic.barrier().map_err(e2s)?;
        times.push(t.elapsed().as_secs_f64());
        let r = block_range(w.rank(), w.size(), n);
        if !old {
            if let Some(k) = got.iter().zip(r.clone()).position(|(&v, i)| v != i as f64) {
                return Err(format!("new rank {}: element {} is wrong", w.rank(), r.start + k as u64));
            }
        }
    }
    if old && w.rank() == 0 {
        let mut t = times[1..].to_vec();
        t.sort_by(f64::total_cmp);
        println!("seconds {:.6} {:.6}", t[0], t[t.len() / 2]);
    }
    ic.free().map_err(e2s)?;
    fmx.finalize().map_err(e2s)
}

fn seconds(text: &str) -> Timing {
    let line = text.lines().find(|l| l.starts_with("seconds ")).ok_or_else(|| format!("no timing in {text:?}"))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    match v[..] {
        [best, median] => Ok((best, median)),
        _ => Err(format!("bad timing line {line:?}")),
    }
}

/// A peer's stdout; on failure the last line of its output (an MPI error
/// stack ends with what failed), for the table.
fn output(cmd: &mut Command) -> Result<String, String> {
    crate::peers::run(cmd).map_err(|e| e.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string())
}

fn fmx_run(exe: &Path, old: u32, new: u32, n: u64, reps: usize) -> Timing {
    let mut l = fmx_launcher::Launch::new(old, exe);
    l.args = ["redistribute-rank".to_string(), n.to_string(), new.to_string(), reps.to_string()].into_iter().map(Into::into).collect();
    l.capture = true;
    l.timeout = Some(std::time::Duration::from_secs(600));
    let o = l.run().map_err(|e| e.to_string())?;
    let out: String = o.lines.iter().map(|(_, _, t)| format!("{t}\n")).collect();
    if o.code != 0 {
        return Err(format!("fmx ranks failed ({}): {out}", o.code));
    }
    seconds(&out)
}

/// MPICH: the guide's code with `MPI_Comm_spawn`; where that fails (ch4:ucx
/// has no dynamic processes) the same code over an intercommunicator from
/// `MPI_Intercomm_create` between the two halves of one N+M job. The
/// second value is the spawn's error, if it failed.
fn mpich(old: u32, new: u32, n: u64, reps: usize) -> (Timing, Option<String>) {
    let run = |np: u32, extra: &[&str]| -> Timing {
        let bin = Mpi::Mpich.build("redistribute_peer", &[])?;
        let text = output(
            Mpi::Mpich
                .launcher()?
                .args(["-n", &np.to_string(), "-bind-to", "core"])
                .arg(bin)
                .args([n.to_string(), new.to_string(), reps.to_string()])
                .args(extra),
        )?;
        seconds(&text)
    };
    match run(old, &[]) {
        Ok(t) => (Ok(t), None),
        Err(spawn_error) => (run(old + new, &["static"]), Some(spawn_error)),
    }
}

/// Open MPI: the guide's code with `MPI_Comm_spawn`.
fn open_mpi(old: u32, new: u32, n: u64, reps: usize) -> Timing {
    let bin = Mpi::OpenMpi.build("redistribute_peer", &[])?;
    let text = output(
        Mpi::OpenMpi
            .launcher()?
            .args(["--oversubscribe", "-n", &old.to_string(), "--bind-to", "core:overload-allowed"])
            // vader cannot reach a spawned job: tcp (on loopback) carries what it cannot.
            .args(["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"])
            .arg(bin)
            .args([n.to_string(), new.to_string(), reps.to_string()]),
    )?;
    seconds(&text)
}

/// Options of `fmx-perf redistribute`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Doubles in the global array
    #[arg(long = "n", value_name = "DOUBLES", default_value_t = 80_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    n: u64,
    /// Rounds per pair (the best and the median are shown)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// OLD:NEW rank counts, comma-separated
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "2:4,4:2", value_parser = pair)]
    pairs: Vec<(u32, u32)>,
    /// Replace the table between <!-- redistribute-table:begin --> and <!-- redistribute-table:end --> in FILE
    #[arg(long, value_name = "FILE")]
    update_readme: Option<std::path::PathBuf>,
}

/// The hidden rank subcommand's arguments, passed through as its parent wrote them.
#[derive(clap::Args, Debug)]
pub struct RankArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// `OLD:NEW`, both at least 1.
fn pair(p: &str) -> Result<(u32, u32), String> {
    let (a, b) = p.split_once(':').ok_or(format!("{p:?} is not OLD:NEW"))?;
    let num = |s: &str| s.parse::<u32>().ok().filter(|&x| x >= 1).ok_or(format!("{s:?} is not a rank count of at least 1"));
    Ok((num(a)?, num(b)?))
}

/// Entry point of `fmx-perf redistribute`.
pub fn main(a: &Args) -> Result<(), String> {
    let (n, pairs, reps, readme) = (a.n, a.pairs.clone(), a.reps as usize, a.update_readme.clone());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let gb = n as f64 * 8.0 / 1e9;
    let mut text = format!(
        "{} doubles ({gb:.2} GB) per redistribution; best of {reps} rounds after a warm-up (median in brackets); \
         GB/s = array bytes / best time.\n\n\
         | old -> new | fmx (s) | fmx GB/s | MPICH (s) | MPICH GB/s | MPICH / fmx time | Open MPI (s) | Open MPI GB/s | Open MPI / fmx time |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        n
    );
    let mut failures = Vec::new();
    let mut notes = std::collections::BTreeSet::new();
    for &(a, b) in &pairs {
        let f = fmx_run(&exe, a, b, n, reps);
        let o = open_mpi(a, b, n, reps);
        let (m, spawn_error) = mpich(a, b, n, reps);
        let cell = |t: &Timing| t.as_ref().map_or("failed".to_string(), |(best, med)| format!("{best:.3} ({med:.3})"));
        let rate = |t: &Timing| t.as_ref().map_or("–".to_string(), |(best, _)| format!("{:.2}", gb / best));
        let ratio = |t: &Timing| match (&f, t) {
            (Ok((fb, _)), Ok((pb, _))) => format!("{:.2}x", pb / fb),
            _ => "–".into(),
        };
        let star = if spawn_error.is_some() { "*" } else { "" };
        text.push_str(&format!(
            "| {a} -> {b} | {} | {} | {}{star} | {} | {} | {} | {} | {} |\n",
            cell(&f),
            rate(&f),
            cell(&m),
            rate(&m),
            ratio(&m),
            cell(&o),
            rate(&o),
            ratio(&o)
        ));
        if let Some(e) = spawn_error {
            notes.insert(format!("\n\\* MPICH's `MPI_Comm_spawn` failed ({e}), so MPICH ran the same code between the two halves of one job of old + new ranks, joined by `MPI_Intercomm_create`.\n"));
        }
        for (name, t) in [("MPICH", &m), ("Open MPI", &o)] {
            if let Err(e) = t {
                notes.insert(format!("\n{name} {a} -> {b} failed: {e}\n"));
            }
        }
        if let Err(e) = &f {
            failures.push(format!("fmx {a}->{b}: {e}"));
        }
    }
    text.push_str("\nAbove 1 means fmx moved the array faster than the MPI running the guide's C code.\n");
    for n in notes {
        text.push_str(&n);
    }
    print!("{text}");
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    if let Some(path) = readme {
        crate::report::update_readme(&path, "redistribute-table", &text)?;
    }
    Ok(())
}
