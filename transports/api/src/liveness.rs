//! Noticing that a peer process on this host is gone: a pidfd per peer, readable once the
//! process has exited (even before its parent reaps it).

use std::os::fd::{FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

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

/// How often an idle peer on another host is probed (a 0-byte RDMA WRITE on verbs, an 8-byte `fi_read` on libfabric).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What an RDMA endpoint knows about one peer's life: a pidfd watch when the
/// peer is on this host, the failure the device or provider reported, and the
/// probe that finds a silent peer elsewhere dead (a failed probe reports it).
#[derive(Debug)]
pub struct PeerLife {
    watch: Option<PeerWatch>,
    /// Why the peer is dead, and whether that is only a consequence (a
    /// flushed request) that a real cause reported later replaces.
    dead: Option<(String, bool)>,
    last_probe: Instant,
    probing: bool,
    /// Since when every attempt to post a probe was refused.
    refused_since: Option<Instant>,
}

impl PeerLife {
    /// A live peer with process `pid` on host `peer_host` ([`host_identity`]);
    /// watched when that is this host (`mine`).
    pub fn new(pid: u32, peer_host: &[u8; 24], mine: &[u8; 24]) -> Self {
        let watch = (peer_host == mine && *peer_host != [0; 24]).then(|| PeerWatch::new(pid));
        Self { watch, dead: None, last_probe: Instant::now(), probing: false, refused_since: None }
    }

    /// Why the peer is dead, as reported.
    pub fn failure(&self) -> Option<&str> {
        self.dead.as_ref().map(|(why, _)| why.as_str())
    }

    /// A failure was reported, or the watched process exited.
    pub fn is_dead(&self) -> bool {
        self.dead.is_some() || self.watch.as_ref().is_some_and(PeerWatch::exited)
    }

    /// Records a failure. The first cause stays, except that a real cause
    /// replaces a `consequence` (a request flushed after an earlier failure).
    /// Ends any probe: it will not complete normally.
    pub fn mark_dead(&mut self, why: String, consequence: bool) {
        if self.dead.as_ref().is_none_or(|(_, was_consequence)| *was_consequence && !consequence) {
            self.dead = Some((why, consequence));
        }
        self.probing = false;
    }

    /// A probe should be posted now: the peer is elsewhere (no watch), not
    /// known dead, no probe is in flight and the last one is [`PROBE_EVERY`] old.
    pub fn probe_due(&self) -> bool {
        self.watch.is_none() && self.dead.is_none() && !self.probing && self.last_probe.elapsed() >= PROBE_EVERY
    }

    /// A probe was posted.
    pub fn probe_posted(&mut self) {
        self.probing = true;
        self.last_probe = Instant::now();
        self.refused_since = None;
    }

    /// The provider refused to post a probe (try again later); returns how
    /// long every probe has been refused. A connection-based provider whose
    /// peer is gone can refuse for ever (rxm retries the connection and
    /// answers EAGAIN), so a long refusal is itself a sign of death.
    pub fn probe_refused(&mut self) -> Duration {
        self.refused_since.get_or_insert_with(Instant::now).elapsed()
    }

    /// The probe (or a request that stands for it) completed.
    pub fn probe_answered(&mut self) {
        self.probing = false;
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

    #[test]
    fn peer_life_keeps_the_first_real_cause_and_probes_only_peers_elsewhere() {
        let (here, elsewhere) = (host_identity(), [7u8; 24]);
        let mut local = PeerLife::new(std::process::id(), &here, &here);
        assert!(!local.is_dead() && !local.probe_due(), "a watched peer is never probed");
        local.mark_dead("flushed".into(), true);
        local.mark_dead("retry exceeded".into(), false);
        local.mark_dead("flushed".into(), true);
        local.mark_dead("remote access error".into(), false);
        assert_eq!(local.failure(), Some("retry exceeded"));
        assert!(local.is_dead());

        let mut remote = PeerLife::new(1, &elsewhere, &here);
        remote.last_probe -= PROBE_EVERY;
        assert!(remote.probe_due());
        remote.probe_posted();
        assert!(!remote.probe_due(), "one probe at a time, then a pause");
        remote.probe_answered();
        assert!(!remote.probe_due());
        assert!(remote.probe_refused() < PROBE_EVERY, "the first refusal starts the clock");
        remote.refused_since = Some(Instant::now() - 3 * PROBE_EVERY);
        assert!(remote.probe_refused() >= 3 * PROBE_EVERY, "refusals count from the first");
        remote.probe_posted();
        assert!(remote.refused_since.is_none(), "a posted probe ends the refusals");
        remote.probe_answered();
        remote.last_probe -= PROBE_EVERY;
        assert!(remote.probe_due());
        remote.mark_dead("probe failed".into(), false);
        assert!(!remote.probe_due() && remote.is_dead());
        // An unknown host identity is never taken for this host.
        assert!(PeerLife::new(1, &[0; 24], &[0; 24]).watch.is_none());
    }
}
