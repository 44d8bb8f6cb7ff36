//! fmx-perf as scripts and users meet it: help and errors with OSU's and
//! clap's exit codes, OSU's columns read by a parser written as OSU users
//! write them, and JSON / CSV that parse, for one iteration too.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clap::CommandFactory;

/// Runs fmx-perf with `args`, killed after two minutes (a hang is a failure).
fn perf(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fmx-perf"))
        .args(args)
        .env_remove("FMX_RANK")
        .env_remove("FMX_TRANSPORT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fmx-perf starts");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            r.read_to_end(&mut v).expect("read a pipe");
            v
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("fmx-perf {args:?} ran past 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_and_version_print_to_stdout_and_exit_0_for_every_subcommand() {
    let o = perf(&["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("Usage: fmx-perf <COMMAND>"), "{}", text(&o.stdout));
    let o = perf(&["--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).starts_with(&format!("fmx-perf {}", env!("CARGO_PKG_VERSION"))), "{}", text(&o.stdout));
    let cli = fmx_bench::cli::Cli::command();
    let subs: Vec<String> = cli.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    assert!(subs.len() >= 9, "{subs:?}");
    for s in &subs {
        let o = perf(&[s, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{s} --help: {}", text(&o.stderr));
        assert!(text(&o.stdout).contains(&format!("Usage: fmx-perf {s}")), "{s} --help printed:\n{}", text(&o.stdout));
    }
}

#[test]
fn bad_arguments_exit_2_with_an_error_that_names_them() {
    for (args, says) in [
        (&["latency", "--bogus"][..], "'--bogus'"),
        (&["latency", "-i", "0"], "at least 1"),
        (&["latency", "--json", "--iters", "0"], "at least 1"),
        (&["latency", "-m", "1M:8"], "the smallest size 1048576 is above the largest 8"),
        (&["latency", "-m", "4X"], "\"4X\" is not a size"),
        (&["bw", "-W", "0"], "at least 1"),
        (&["bw", "--json", "--csv"], "cannot be used with"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (&["compare", "--sizes", "8,x"], "\"x\" is not a size"),
        (&["redistribute", "--pairs", "2-4"], "\"2-4\" is not OLD:NEW"),
    ] {
        let o = perf(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(text(&o.stderr).contains(says), "{args:?} should say {says:?}, said:\n{}", text(&o.stderr));
        assert!(o.stdout.is_empty(), "{args:?} printed {}", text(&o.stdout));
    }
    // A contradiction only fmx-perf can see: an error, not a run.
    let o = perf(&["latency", "--min-size", "64", "--max-size", "8"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o.stderr).contains("the smallest size 64 is above the largest 8"), "{}", text(&o.stderr));
}

/// What OSU users' scripts do (`awk '!/^#/ { print $1, $2 }'`): skip
/// comment lines, two whitespace-separated numbers per line.
fn osu_rows(out: &str) -> Vec<(u64, f64)> {
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 2, "an OSU row has two columns: {l:?}");
            (f[0].parse().expect("size"), f[1].parse().expect("value"))
        })
        .collect()
}

#[test]
fn default_output_is_osus_two_columns() {
    // Bandwidth from 4 KiB: two decimals of MB/s never round to 0 there, even on a loaded host.
    for (test, unit, range, sizes) in [
        ("latency", "# Size          Latency (us)", "8:64", [8, 16, 32, 64]),
        ("bw", "# Size      Bandwidth (MB/s)", "4K:32K", [4096, 8192, 16384, 32768]),
    ] {
        let o = perf(&[test, "-m", range, "-i", "20", "-x", "2", "-W", "4"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let out = text(&o.stdout);
        assert!(out.lines().any(|l| l == unit), "{out}");
        let rows = osu_rows(&out);
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), sizes, "{out}");
        assert!(rows.iter().all(|r| r.1.is_finite() && r.1 > 0.0), "{out}");
    }
}

#[test]
fn full_and_perftest_statistics_are_consistent_columns() {
    let o = perf(&["latency", "-m", "8:16", "-i", "50", "-x", "5", "-f"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rows: Vec<Vec<f64>> = text(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        // size, avg, min, max, iterations
        assert_eq!(r.len(), 5, "{r:?}");
        assert!(r[2] <= r[1] + 0.01 && r[1] <= r[3] + 0.01 && r[4] == 50.0, "{r:?}");
    }
    let o = perf(&["latency", "-m", "8:16", "-i", "200", "-x", "5", "--stats"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("t_typical[usec]") && out.contains("99.9% percentile[usec]"), "{out}");
    let rows: Vec<Vec<f64>> = out
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with('#'))
        .map(|l| l.split_whitespace().map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        // bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, p99, p99.9
        assert_eq!(r.len(), 9, "{r:?}");
        let (min, max, typ, p99, p999) = (r[2], r[3], r[4], r[7], r[8]);
        assert!(min <= typ && typ <= p99 && p99 <= p999 && p999 <= max && min > 0.0, "{r:?}");
    }
}

#[test]
fn json_is_valid_with_metadata_for_one_iteration() {
    let o = perf(&["latency", "-m", "8", "-i", "1", "-x", "0", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)));
    let meta = &v["meta"];
    for key in ["fmx_version", "git", "transport", "pair_transport", "date", "iterations", "unit"] {
        assert!(meta[key].is_string(), "meta.{key} in {meta}");
    }
    assert_eq!(meta["ranks"], 2);
    assert_eq!(meta["hosts"].as_array().map(Vec::len), Some(2));
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.iter().map(|r| r["size"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 4, 8]);
    for r in results {
        assert_eq!(r["iterations"], 1);
        assert!(r["value"].as_f64().is_some_and(f64::is_finite), "{r}");
        for s in ["min", "max", "typical", "avg", "stdev", "p99", "p999"] {
            assert!(r["stats"][s].as_f64().is_some_and(f64::is_finite), "{s} in {r}");
        }
    }
}

#[test]
fn csv_has_a_header_and_finite_rows_in_the_asked_unit() {
    let o = perf(&["bw", "-m", "4K:8K", "-i", "3", "-x", "1", "-W", "4", "--csv", "--report_gbits"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let mut r = csv::Reader::from_reader(&o.stdout[..]);
    let h = r.headers().unwrap().clone();
    assert_eq!(&h[1], "size");
    let rows: Vec<csv::StringRecord> = r.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert_eq!(&row[5], "Gb/s");
        for (i, f) in row.iter().enumerate().skip(4).filter(|(i, _)| *i != 5) {
            assert!(f.parse::<f64>().is_ok_and(f64::is_finite), "column {} = {f:?}", &h[i]);
        }
    }
}

#[test]
fn mbw_mr_limits_and_all_report_osu_rows_and_the_floor() {
    let o = perf(&["mbw_mr", "--pairs", "2", "-m", "8:16", "-i", "5", "-x", "1", "-W", "8"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains("# pairs: 2, all at once")
            && out.contains("# streams (world rank, node): 0 (node 0) -> 2 (node 0), 1 (node 0) -> 3 (node 0)")
            && out.contains("Messages/s"),
        "{out}"
    );
    let rows: Vec<Vec<f64>> =
        out.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().map(|v| v.parse().unwrap()).collect()).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for r in &rows {
        // size, MB/s, messages/s: bytes per second / size is the message rate.
        assert_eq!(r.len(), 3, "{r:?}");
        // (MB/s is printed to two decimals, so compare within that rounding.)
        let want = r[2] * r[0] / 1e6;
        assert!(r[2] > 0.0 && (r[1] - want).abs() <= 0.005 + want * 1e-3, "{r:?}");
    }
    let o = perf(&["all", "-m", "8:16", "-i", "10"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for section in [
        "# fmx-perf latency",
        "# fmx-perf bw",
        "# fmx-perf bibw",
        "# fmx-perf mbw_mr",
        "# fmx-perf limits",
        "| latency (us) | 8 B |",
        "| bw (MB/s) | 16 B |",
    ] {
        assert!(out.contains(section), "no {section:?} in:\n{out}");
    }
}

/// The progress line is drawn on a terminal (here a pseudo-terminal from
/// `script`, with the quiet period set to 0 s), and never into a pipe.
#[test]
fn progress_shows_on_a_terminal_and_never_in_a_pipe() {
    let exe = env!("CARGO_BIN_EXE_fmx-perf");
    let o = Command::new("script")
        .args(["-qec", &format!("{exe} latency -m 8:64 -i 50 -x 5"), "/dev/null"])
        .env("FMX_PERF_PROGRESS", "tty:0")
        .env_remove("FMX_RANK")
        .output()
        .expect("script (util-linux) runs");
    let tty = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{tty}");
    assert!(tty.contains("fmx-perf latency [") && tty.contains("/4 "), "no progress line on the terminal:\n{tty:?}");
    let o = perf(&["latency", "-m", "8:64", "-i", "50", "-x", "5"]);
    assert!(!text(&o.stderr).contains('[') && !text(&o.stdout).contains("fmx-perf latency ["), "{}", text(&o.stderr));
}

/// Under a launcher fmx-perf measures with the launcher's ranks, never a job
/// of its own: one table, between the `--pair` asked (here ranks 2 and 0 of
/// 3), named in the header; a bad pair is an error naming it.
#[test]
fn under_a_launcher_the_pair_is_the_launchers_ranks_and_is_named() {
    let run = |args: &[&str]| {
        let mut l = fmx_launcher::Launch::new(3, env!("CARGO_BIN_EXE_fmx-perf"));
        l.args = args.iter().map(Into::into).collect();
        l.capture = true;
        l.timeout = Some(Duration::from_secs(120));
        l.run().expect("fmxrun starts the ranks")
    };
    let o = run(&["latency", "-m", "8", "-i", "20", "-x", "2", "--pair", "2,0"]);
    let out: Vec<&str> = o.lines.iter().filter(|(_, err, _)| !err).map(|(_, _, l)| l.as_str()).collect();
    assert_eq!(o.code, 0, "{:?}", o.lines);
    assert_eq!(out.iter().filter(|l| l.starts_with("# fmx-perf latency")).count(), 1, "one table: {out:?}");
    assert!(out.contains(&"# rank 2 (node 0) to rank 0 (node 0): shm"), "{out:?}");
    assert!(o.lines.iter().filter(|(_, err, _)| !err).all(|(r, _, _)| *r == 2), "only rank 2 reports: {:?}", o.lines);
    assert_eq!(osu_rows(&out.join("\n")).len(), 4, "{out:?}");
    let o = run(&["latency", "-m", "8", "-i", "1", "--pair", "0,3"]);
    assert_ne!(o.code, 0);
    assert!(o.lines.iter().any(|(_, _, l)| l.contains("--pair 0,3: rank 3 is not in the world of 3 ranks")), "{:?}", o.lines);
}

/// `compare --json` (fmx alone here; the peers run in `fmx-perf compare`
/// where MPICH and Open MPI are installed): one valid document with the
/// metadata, a row per test and size, and every sweep.
#[test]
fn compare_json_is_one_valid_document() {
    let o = perf(&["compare", "--json", "--no-peers", "--sizes", "8", "--reps", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)));
    assert_eq!(v["meta"]["tool"], "fmx-perf compare");
    assert!(v["meta"]["peers"].as_array().is_some_and(Vec::is_empty), "{v}");
    let rows = v["results"].as_array().expect("results");
    assert_eq!(
        rows.iter().map(|r| (r["test"].as_str().unwrap(), r["size"].as_u64().unwrap())).collect::<Vec<_>>(),
        [("bw", 8), ("latency", 8)]
    );
    for r in rows {
        assert!(r["values"]["fmx"].as_f64().is_some_and(|x| x.is_finite() && x > 0.0), "{r}");
    }
    let sweeps = v["sweeps"].as_array().expect("sweeps");
    assert_eq!(sweeps.len(), 2, "{v}");
    assert!(sweeps.iter().all(|s| s["who"] == "fmx" && s["points"].as_array().is_some_and(|p| p.len() == 4)), "{v}");
}

/// `compare` runs every side `--reps` times and shows each cell as the
/// median with its range; the smallest latency is held against one
/// cache-line handoff measured in the same run.
#[test]
fn compare_shows_medians_of_interleaved_runs_and_the_floor() {
    let o = perf(&["compare", "--no-peers", "--sizes", "8", "--reps", "3"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("3 interleaved runs per side: median [range]."), "{out}");
    let row = out.lines().find(|l| l.starts_with("| latency (us) | 8 B | ")).unwrap_or_else(|| panic!("no 8 B latency row:\n{out}"));
    // "| latency (us) | 8 B | 0.21 [0.19-0.40] |": the median lies within its range.
    let cell = row.split('|').nth(3).unwrap().trim();
    let nums: Vec<f64> = cell.split(|c: char| c == ' ' || c == '[' || c == ']' || c == '-').filter_map(|x| x.parse().ok()).collect();
    assert_eq!(nums.len(), 3, "{row}");
    assert!(nums[1] <= nums[0] && nums[0] <= nums[2] && nums[1] > 0.0, "{row}");
    let floor = out.lines().find(|l| l.starts_with("8 B latency: fmx is ")).unwrap_or_else(|| panic!("no floor line:\n{out}"));
    assert!(floor.contains("one cache-line handoff between cores 0 and 1") && floor.contains("the best of 9 runs"), "{floor}");
    assert!(floor.ends_with("target at most 3x: met.") || floor.ends_with("target at most 3x: not met."), "{floor}");
}

#[test]
fn scale_model_prints_a_row_per_mode_and_size_and_measures_only_rdma_jobs() {
    let o = perf(&["scale-model", "--ranks", "100,100000", "--degree", "6"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("| 100 |") || l.starts_with("| 100000 |")).collect();
    assert_eq!(rows.len(), 6, "{out}");
    // At 10^5 ranks and degree 6, lazy keeps 6 queue pairs; eager has one per other rank.
    assert!(rows.iter().any(|r| r.starts_with("| 100000 | fmx-lazy | 6 |")), "{out}");
    assert!(rows.iter().any(|r| r.starts_with("| 100000 | fmx-eager | 99999 |")), "{out}");
    // Alone, fmx-perf is a world of one over no RDMA transport: the check refuses and says why.
    let o = perf(&["scale-model", "--measure"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("the scale model is of the RDMA transports"), "{}", text(&o.stderr));
}
