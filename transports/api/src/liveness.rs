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
    }
}
