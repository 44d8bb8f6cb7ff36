//! Noticing that a peer process on this host is gone: a pidfd per peer, readable once the
//! process has exited (even before its parent reaps it).

use std::os::fd::{FromRawFd, OwnedFd};

/// A handle on a peer process.
#[derive(Debug)]
pub struct PeerWatch {
    pidfd: Option<OwnedFd>,
    pid: u32,
}

impl PeerWatch {
    /// Watches `pid`. Without pidfd support (kernels before 5.3) falls back to `kill(pid, 0)`.
    pub fn new(pid: u32) -> Self {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1;
        // no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let pidfd = (fd >= 0).then(|| {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            unsafe { OwnedFd::from_raw_fd(fd as i32) }
        });
        Self { pidfd, pid }
    }

    /// Whether the process has exited.
    pub fn exited(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                use std::os::fd::AsRawFd;
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, zero timeout.
                let n = unsafe { libc::poll(&raw mut p, 1, 0) };
                n > 0 && p.revents & libc::POLLIN != 0
            }
            None => {
                // SAFETY: signal 0 only checks existence; no memory is passed.
                let rc = unsafe { libc::kill(self.pid as libc::pid_t, 0) };
                rc != 0
            }
        }
    }
}

/// This host's identity for liveness: the kernel's boot id and our PID
/// namespace (equal on both sides: the peer's pid means the same process).
pub fn host_identity() -> [u8; 24] {
    let mut id = [0u8; 24];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let hex: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            id[i] = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("0"), 16).unwrap_or(0);
        }
    }
    if let Ok(meta) = std::fs::metadata("/proc/self/ns/pid") {
        use std::os::unix::fs::MetadataExt;
        id[16..24].copy_from_slice(&meta.ino().to_le_bytes());
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_an_exited_child() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let w = PeerWatch::new(child.id());
        assert!(!w.exited());
        // not reaped yet: a zombie still counts as exited
        std::thread::sleep(std::time::Duration::from_millis(600));
        assert!(w.exited());
        child.wait().unwrap();
        assert!(!PeerWatch::new(std::process::id()).exited());
        assert_ne!(host_identity(), [0; 24], "boot id or pid namespace readable");
    }
}
