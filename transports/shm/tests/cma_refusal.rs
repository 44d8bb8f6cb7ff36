//! A single-copy transfer the kernel refuses names what to do about it:
//! the real setting (`FMX_SHM_CMA=0`) and the kernel setting that allows it.
//!
//! The refusal is real: an unprivileged process reading pid 1's memory
//! (root's) gets EPERM from `process_vm_readv`. Run as root (as CI runs),
//! the test runs itself again as `nobody` through `setpriv`, from a copy of
//! the test binary in a world-readable temporary directory.
#![cfg(not(loom))]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const AS_NOBODY: &str = "FMX_SHM_TEST_AS_NOBODY";
const NAME: &str = "a_refused_single_copy_names_the_setting_that_works";

#[test]
fn a_refused_single_copy_names_the_setting_that_works() {
    if rustix::process::geteuid().is_root() && std::env::var_os(AS_NOBODY).is_none() {
        assert!(rerun_as_nobody(), "the test as nobody failed (output above)");
        return;
    }
    let mut byte = [0u8; 1];
    let e = fmx_shm::cma::read_from(3, 1, 0x1000, &mut byte).expect_err("reading pid 1's memory as an unprivileged user").to_string();
    assert!(e.contains("single-copy transfer to peer 3 (pid 1) refused"), "{e}");
    assert!(e.contains("set FMX_SHM_CMA=0 to move large messages in two copies"), "{e}");
    assert!(e.contains("kernel.yama.ptrace_scope=1"), "{e}");
    // The probe fmx runs at connect takes the same refusal as "no single copy", not as an error.
    assert_eq!(fmx_shm::cma::may_attach(3, 1, 0x1000).map_err(|e| e.to_string()), Ok(false));
}

/// Runs this test again as `nobody`; whether it passed.
fn rerun_as_nobody() -> bool {
    let dir = std::env::temp_dir().join(format!("fmx-cma-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("make a temp dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod the temp dir");
    let exe = dir.join("cma_refusal");
    std::fs::copy(std::env::current_exe().expect("the test binary"), &exe).expect("copy the test binary");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod the copy");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(["--exact", NAME, "--test-threads=1"])
        .env(AS_NOBODY, "1")
        .current_dir(&dir)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("setpriv (util-linux) runs");
    print!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed")
}
