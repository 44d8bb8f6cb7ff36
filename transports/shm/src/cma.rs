//! Single-copy transfers between processes: Linux cross-memory attach
//! (`process_vm_readv`/`process_vm_writev`). The kernel copies straight from
//! one address space into the other, one copy in all.

use fmx_transport::{PeerId, TransportError};

/// Lets the job's processes attach to this one for single-copy transfers
/// where Yama's `ptrace_scope=1` would refuse them (any process of this user
/// may then attach, as after Open MPI's vader sets up). Without Yama, or under
/// stricter settings, nothing changes: [`may_attach`] tells.
pub fn allow_peers() {
    // SAFETY: prctl with integer arguments only; a kernel without Yama answers
    // EINVAL, which changes nothing.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
}

/// Whether the kernel lets us read process `pid`'s memory: one byte at
/// `probe`, an address the peer named in its address (its segment's base).
/// `Ok(false)` when refused (ptrace rules, seccomp); an error when the peer is gone.
pub fn may_attach(peer: PeerId, pid: u32, probe: u64) -> Result<bool, TransportError> {
    let mut byte = [0u8; 1];
    match read_from(peer, pid, probe, &mut byte) {
        Ok(()) => Ok(true),
        Err(TransportError::Unsupported(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Which way the bytes go.
#[derive(Clone, Copy, Debug)]
pub enum Direction {
    /// From the peer's memory into ours.
    Read,
    /// From ours into the peer's.
    Write,
}

/// Copies `remote..remote+local.len()` of process `pid` into `local`.
pub fn read_from(peer: PeerId, pid: u32, remote: u64, local: &mut [u8]) -> Result<(), TransportError> {
    // SAFETY: `local` is a live, exclusively borrowed buffer of `local.len()` bytes.
    unsafe { transfer(Direction::Read, peer, pid, local.as_mut_ptr(), remote, local.len()) }
}

/// Copies `local` into `remote..remote+local.len()` of process `pid`.
pub fn write_to(peer: PeerId, pid: u32, local: &[u8], remote: u64) -> Result<(), TransportError> {
    // SAFETY: `local` is a live buffer of `local.len()` bytes; a Write only reads it.
    unsafe { transfer(Direction::Write, peer, pid, local.as_ptr().cast_mut(), remote, local.len()) }
}

/// Moves `len` bytes between our `local` address and `remote` in process `pid`,
/// looping over partial transfers.
///
/// The kernel checks the remote range: a bad remote address is `EFAULT`, a
/// process we may not access `EPERM`, a gone process `ESRCH`.
///
/// # Safety
/// `local..local+len` must be memory the caller owns for the call: writable
/// for [`Direction::Read`], readable for [`Direction::Write`].
unsafe fn transfer(dir: Direction, peer: PeerId, pid: u32, local: *mut u8, remote: u64, len: usize) -> Result<(), TransportError> {
    let mut done = 0usize;
    while done < len {
        let liov = libc::iovec {
            // SAFETY: `done < len`, so the pointer stays inside the caller's buffer.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let riov = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: both iovec arrays have one valid element each and live across the
        // call. The local iovec covers memory the caller owns and may write (Read) or
        // read (Write); the remote one is checked by the kernel against the other
        // process's mappings, so a wrong remote address fails with EFAULT instead of
        // touching anything of ours.
        let n = unsafe {
            match dir {
                Direction::Read => libc::process_vm_readv(pid as libc::pid_t, &raw const liov, 1, &raw const riov, 1, 0),
                Direction::Write => libc::process_vm_writev(pid as libc::pid_t, &raw const liov, 1, &raw const riov, 1, 0),
            }
        };
        if n < 0 {
            let source = std::io::Error::last_os_error();
            if source.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(match source.raw_os_error() {
                Some(libc::ESRCH) => {
                    TransportError::PeerGone { peer, reason: format!("process {pid} no longer exists (single-copy transfer)") }
                }
                Some(libc::EPERM | libc::ENOSYS) => TransportError::Unsupported(format!(
                    "single-copy transfer to peer {peer} (pid {pid}) refused: {source}; the kernel forbids \
                     cross-memory attach here (Yama ptrace_scope, seccomp, a container without CAP_SYS_PTRACE): set \
                     FMX_SHM_CMA=0 to move large messages in two copies through the shared segments, or allow it \
                     (kernel.yama.ptrace_scope=1 lets fmx's ranks attach to each other)"
                )),
                _ => TransportError::Io {
                    op: match dir {
                        Direction::Read => "process_vm_readv",
                        Direction::Write => "process_vm_writev",
                    },
                    peer,
                    source,
                },
            });
        }
        if n == 0 {
            return Err(TransportError::Io {
                op: "process_vm_readv",
                peer,
                source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
            });
        }
        done += n as usize;
    }
    Ok(())
}
