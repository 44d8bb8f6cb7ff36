//! Records the git commit fmx-perf was built from (for its `--version` and
//! its JSON metadata), or "unknown" outside a git checkout.

use std::process::Command;

fn main() {
    let hash = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FMX_GIT_HASH={hash}");
    // A new commit or checkout moves HEAD's log; rebuild then, not on every edit.
    for p in ["../.git/HEAD", "../.git/logs/HEAD"] {
        if std::path::Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
