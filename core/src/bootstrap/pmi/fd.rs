//! Taking ownership of the socket a process manager handed us by number.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;

use crate::error::{Error, Result};

/// The socket whose number is in `var`, checked to be an open socket first.
pub(crate) fn inherited_socket(var: &str) -> Result<UnixStream> {
    let text = std::env::var(var).map_err(|_| Error::Bootstrap(format!("{var} is not set")))?;
    let fd: i32 = text
        .trim()
        .parse()
        .ok()
        .filter(|&fd: &i32| fd >= 0)
        .ok_or_else(|| Error::Bootstrap(format!("{var}={text:?} is not a file descriptor number")))?;
    let kind = match std::fs::metadata(format!("/proc/self/fd/{fd}")) {
        Err(_) => return Err(Error::Bootstrap(format!("{var}={fd} is not an open file descriptor of this process"))),
        Ok(m) => m.file_type(),
    };
    if !kind.is_socket() {
        let what = if kind.is_file() {
            "a regular file"
        } else if kind.is_fifo() {
            "a pipe"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "not a socket"
        };
        return Err(Error::Bootstrap(format!("{var}={fd} is not a socket (it is {what}): was this process started by a process manager?")));
    }
    #[allow(unsafe_code)]
    // SAFETY: `fd` is open in this process and is a socket (checked just above);
    // the process manager handed it to this process for the PMI connection
    // alone, and `init` runs once per process (guarded by INITIALIZED), so no
    // other owner of this descriptor exists and none will be created.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // Programs that exec children must not hand them our PMI connection.
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| Error::Bootstrap(format!("{var}={fd}: marking the PMI socket close-on-exec: {e}")))?;
    Ok(UnixStream::from(owned))
}
