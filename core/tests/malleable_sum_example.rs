//! Runs `examples/malleable_sum.rs` (built by `cargo test` with the tests)
//! in both modes: it reconfigures 2 -> 4 -> 3 -> 1 -> 2 and must end with the
//! same array and iteration count as a run without reconfiguration.

use std::path::PathBuf;
use std::process::Command;

fn example() -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/malleable_sum
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("examples").join("malleable_sum");
    assert!(p.exists(), "{} is missing: cargo test builds the examples with the tests", p.display());
    p
}

fn run(env: &[(&str, &str)]) -> String {
    let out = Command::new(example()).envs(env.iter().copied()).output().expect("run the example");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn intercomm_mode_gives_the_result_of_a_run_without_reconfiguration() {
    let text = run(&[("FMX_MALLEABLE_MODE", "intercomm")]);
    assert!(text.contains("same array and iteration count: yes"), "{text}");
    assert!(text.contains("with:    RESULT iterations=25 ") && text.contains("ranks=2 reconfigurations=4"), "{text}");
}

#[test]
fn checkpoint_mode_gives_the_result_of_a_run_without_reconfiguration() {
    let dir = std::env::temp_dir().join(format!("fmx-sum-ckpt-{}", std::process::id()));
    let text = run(&[("FMX_MALLEABLE_MODE", "checkpoint"), ("FMX_CHECKPOINT_DIR", dir.to_str().unwrap())]);
    assert!(text.contains("same array and iteration count: yes"), "{text}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "checkpoint files left in {}", dir.display());
    std::fs::remove_dir(&dir).unwrap();
}
