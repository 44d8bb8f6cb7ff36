//! The `fmxrun` command line: exit codes, labels, errors.

use std::process::Command;

fn fmxrun() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fmxrun"))
}

#[test]
fn propagates_the_first_nonzero_exit_code() {
    let out = fmxrun()
        .args(["-n", "3", "--kill-grace", "0.5", "sh", "-c", "if [ \"$FMX_RANK\" = 2 ]; then exit 7; fi; sleep 30"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 2 exited with code 7"), "{err}");
}

#[test]
fn labels_output_with_ranks_and_hands_out_rank_and_size() {
    let out = fmxrun().args(["-n", "3", "-l", "sh", "-c", "echo \"r=$FMX_RANK s=$FMX_SIZE\"; echo oops >&2"]).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for r in 0..3 {
        assert!(stdout.lines().any(|l| l == format!("[{r}] r={r} s=3")), "{stdout}");
    }
    assert_eq!(String::from_utf8_lossy(&out.stderr).matches("] oops").count(), 3);
}

#[test]
fn times_out_with_124() {
    let out = fmxrun().args(["-n", "2", "--timeout", "0.3", "sleep", "30"]).output().unwrap();
    assert_eq!(out.status.code(), Some(124));
}

#[test]
fn bad_arguments_are_named() {
    let out = fmxrun().args(["-n", "x", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'-n <N>': \"x\" is not a number"));
    let out = fmxrun().args(["-n", "2", "--transport", "carrier-pigeon", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown transport \"carrier-pigeon\" (this build has: auto, shm"), "{err}");
    assert!(err.contains("the cargo feature `verbs` adds verbs and shm+verbs, `ofi` adds ofi and shm+ofi"), "{err}");
    // A transport this build lacks: the feature that adds it.
    if !cfg!(feature = "verbs") {
        let out = fmxrun().args(["-n", "2", "--transport", "shm+verbs", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("transport \"shm+verbs\" is not in this build") && err.contains("--features fmx/verbs"), "{err}");
    }
    let out = fmxrun().args(["-n", "2", "/nonexistent/program"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("starting rank 0 (/nonexistent/program)"));
}

#[test]
fn a_lone_process_is_a_world_of_one() {
    // The example run without fmxrun: rank 0 of 1 over loopback.
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_fmxrun")).parent().unwrap().join("examples/hello");
    if !exe.exists() {
        let st = Command::new(env!("CARGO")).args(["build", "-q", "-p", "fmx", "--example", "hello"]).status().unwrap();
        assert!(st.success());
    }
    let out = Command::new(&exe).env_remove("FMX_RENDEZVOUS").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hello from rank 0 of 1 over loopback; sum of ranks = 0");
}

/// Help and version go to stdout with exit code 0; a bad command line is
/// exit code 2 with the problem named (clap's conventions).
#[test]
fn help_version_and_bad_options_follow_the_conventions() {
    for flag in ["--help", "-h", "--version"] {
        let out = fmxrun().arg(flag).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("fmxrun"), "{flag}: {}", String::from_utf8_lossy(&out.stdout));
    }
    for (args, says) in [(&["-n", "2", "--bogus", "true"][..], "'--bogus'"), (&["--label", "true"], "-n <N>"), (&["-n", "2"], "PROGRAM")] {
        let out = fmxrun().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
    }
    // mpiexec's -np, and the program's own options pass through untouched.
    let out = fmxrun().args(["-np", "2", "echo", "-n", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("--help").count(), 2, "{}", String::from_utf8_lossy(&out.stdout));
}

/// Issue 15 item 6: out-of-range numbers are errors naming them, not panics.
#[test]
fn item06_out_of_range_values_are_named_errors() {
    for args in [["--timeout", "1e300"], ["--kill-grace", "1e300"], ["-n", "100000"], ["--timeout", "-1"]] {
        let out = fmxrun().args(args).args(["-n", "1", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(args[0]) && err.contains(args[1]) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Issue 15 items 5 and 18: fmxrun killed with SIGKILL (its own cleanup
/// cannot run) after a reconfiguration request leaves neither the request
/// file nor any shared-memory file of the job: its cleanup helper removes them.
#[test]
fn item05_item18_a_killed_fmxrun_leaves_no_files() {
    use std::io::BufRead;
    let mut child = fmxrun()
        .args(["-n", "1", "sh", "-c", "touch /dev/shm/fmx-$FMX_JOB-0 /dev/shm/fmxofi-$FMX_JOB-0.0; echo $FMX_JOB; exec sleep 30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut job = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut job).unwrap();
    let job = job.trim().to_owned();
    let request = std::env::temp_dir().join(format!("fmx-{job}.reconfig"));
    let files = [request.clone(), format!("/dev/shm/fmx-{job}-0").into(), format!("/dev/shm/fmxofi-{job}-0.0").into()];
    Command::new("kill").args(["-USR1", &child.id().to_string()]).status().unwrap();
    let t = std::time::Instant::now();
    while !request.exists() {
        assert!(t.elapsed().as_secs() < 10, "fmxrun did not write the request");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(files.iter().all(|f| f.exists()), "{files:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let t = std::time::Instant::now();
    while files.iter().any(|f| f.exists()) {
        assert!(t.elapsed().as_secs() < 5, "left behind: {:?}", files.iter().filter(|f| f.exists()).collect::<Vec<_>>());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
