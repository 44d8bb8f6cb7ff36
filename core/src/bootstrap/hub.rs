//! A bridge group's rendezvous where no fmxrun serves one: under a process
//! manager such as Hydra, the spawning world's rank 0 serves the bridge of
//! the old and the new world itself, in a thread, speaking fmxrun's protocol
//! (`wire`) so that every member joins with the same `fmxrun::Client`.
//!
//! It serves the rounds a group runs (hello, allgather, barrier, finalize) in
//! lock step. A member whose connection ends before it finalized, or that
//! announces it is failing, is a failure of the group: every other member
//! gets a notice naming it (their engines watch for one), the process
//! manager is asked to end the job (as fmxrun ends it: Hydra does not end a
//! job for a spawned world's failed rank by itself), and the hub ends.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::wire::{self, Notice, OP_ABORT, OP_ALLGATHER, OP_BARRIER, OP_ERROR, OP_FINALIZE, OP_HELLO, OP_NOTICE};

/// Who the members are: the old world's `old` ranks (world `generation`)
/// first, then the new world's (world `generation + 1`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Group {
    pub(crate) old: u32,
    pub(crate) new: u32,
    pub(crate) generation: u32,
}

impl Group {
    fn size(self) -> u32 {
        self.old + self.new
    }

    /// Bridge rank `r` as (world, rank in it).
    fn origin(self, r: u32) -> (u32, u32) {
        if r < self.old {
            (self.generation, r)
        } else {
            (self.generation + 1, r - self.old)
        }
    }
}

/// How long after a member's failure the job is ended.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// What ends the job when a member fails: exit code, reason.
pub(crate) type Abort = Box<dyn FnOnce(i32, &str) + Send>;

/// Starts serving `group` on `bind` (a free port); returns the address
/// members connect to and the serving thread. Every member must have said hello within `timeout`;
/// the rounds after that wait as long as the slowest member.
pub(crate) fn serve(
    bind: std::net::IpAddr,
    group: Group,
    timeout: Duration,
    abort: Abort,
) -> io::Result<(String, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind((bind, 0))?;
    let addr = listener.local_addr()?.to_string();
    let hub = std::thread::Builder::new().name("fmx-bridge-hub".into()).spawn(move || match run(&listener, group, timeout) {
        Err(Ended::Failed(why)) => {
            // The members were told; the failed rank's own last words (its
            // stderr, through the process manager) go first, then the
            // process manager ends the job, as fmxrun does after its grace.
            std::thread::sleep(ABORT_GRACE);
            abort(1, &why);
        }
        Err(Ended::Io(e)) => tracing::debug!("the bridge's rendezvous ended: {e}"),
        Ok(()) => {}
    })?;
    Ok((addr, hub))
}

/// How serving ended early.
enum Ended {
    /// A member failed: the job must end.
    Failed(String),
    /// The hub could not go on (the members were told, or will find it closed).
    Io(io::Error),
}

impl From<io::Error> for Ended {
    fn from(e: io::Error) -> Self {
        Ended::Io(e)
    }
}

fn run(listener: &TcpListener, group: Group, timeout: Duration) -> Result<(), Ended> {
    let members = hellos(listener, group.size(), timeout)?;
    for mut s in &members {
        wire::write_frame(&mut s, OP_HELLO, &[])?;
    }
    loop {
        let mut frames: Vec<Option<(u8, Vec<u8>)>> = vec![None; members.len()];
        while frames.iter().any(Option::is_none) {
            let waiting: Vec<usize> = (0..members.len()).filter(|&r| frames[r].is_none()).collect();
            for r in readable(&members, &waiting)? {
                let frame = wire::read_frame(&mut &members[r]);
                match frame {
                    Ok((OP_ABORT, why)) => return fail(&members, r, group, &String::from_utf8_lossy(&why)),
                    Ok(f) => frames[r] = Some(f),
                    Err(_) => return fail(&members, r, group, "left the bridge without finalizing (its connection closed)"),
                }
            }
        }
        let (ops, bodies): (Vec<u8>, Vec<Vec<u8>>) = frames.into_iter().flatten().unzip();
        let op = ops[0];
        if let Some(r) = ops.iter().position(|&o| o != op) {
            return refuse_all(
                &members,
                format!("the bridge's members disagree on the round: rank 0 sent {:?}, rank {r} {:?}", op as char, ops[r] as char),
            );
        }
        let reply = match op {
            OP_ALLGATHER => wire::encode_blobs(&bodies),
            OP_BARRIER | OP_FINALIZE => Vec::new(),
            _ => return refuse_all(&members, format!("the bridge's rendezvous serves no round {:?}", op as char)),
        };
        for mut s in &members {
            wire::write_frame(&mut s, op, &reply)?;
        }
        if op == OP_FINALIZE {
            return Ok(());
        }
    }
}

/// Accepts the members: each says hello with its rank and the group's size;
/// a wrong one is refused (`OP_ERROR`) and not counted.
fn hellos(listener: &TcpListener, size: u32, timeout: Duration) -> io::Result<Vec<TcpStream>> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    let mut members: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    while members.iter().any(Option::is_none) {
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<String> = (0..size).filter(|&r| members[r as usize].is_none()).map(|r| r.to_string()).collect();
                    return Err(io::Error::new(io::ErrorKind::TimedOut, format!("bridge ranks {} never arrived", missing.join(", "))));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(e),
        };
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        let Ok((OP_HELLO, body)) = wire::read_frame(&mut s) else { continue };
        let at = |i: usize| body.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let refuse = |s: &mut TcpStream, why: String| {
            let _ = wire::write_frame(s, OP_ERROR, why.as_bytes());
        };
        match (at(0), at(4)) {
            (Some(rank), Some(n)) if n == size && rank < size && members[rank as usize].is_none() => {
                s.set_read_timeout(None)?;
                members[rank as usize] = Some(s);
            }
            (Some(rank), Some(n)) if n != size => refuse(&mut s, format!("rank {rank} says the bridge has {n} members; it has {size}")),
            (Some(rank), _) => refuse(&mut s, format!("rank {rank} is not a free place in a bridge of {size}")),
            _ => refuse(&mut s, "a malformed hello".into()),
        }
    }
    Ok(members.into_iter().flatten().collect())
}

/// The members among `waiting` with something to read (a frame or the end).
fn readable(members: &[TcpStream], waiting: &[usize]) -> io::Result<Vec<usize>> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds: Vec<PollFd<'_>> = waiting.iter().map(|&r| PollFd::new(&members[r], PollFlags::IN)).collect();
    loop {
        match poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(waiting.iter().zip(&fds).filter(|(_, f)| !f.revents().is_empty()).map(|(&r, _)| r).collect())
}

/// Tells every member that the round cannot be served (`why`), and ends.
fn refuse_all(members: &[TcpStream], why: String) -> Result<(), Ended> {
    for mut s in members {
        let _ = wire::write_frame(&mut s, OP_ERROR, why.as_bytes());
    }
    Err(Ended::Io(io::Error::new(io::ErrorKind::InvalidData, why)))
}

/// Tells every member but `r` that bridge rank `r` failed, and ends.
fn fail(members: &[TcpStream], r: usize, group: Group, why: &str) -> Result<(), Ended> {
    // Bridge ranks are below the group's size, a u32.
    let member = u32::try_from(r).expect("a bridge rank fits in u32");
    let (generation, rank) = group.origin(member);
    let notice = Notice { member: Some(member), generation, rank, reason: why.to_string() }.encode();
    for (k, mut s) in members.iter().enumerate() {
        if k != r {
            let _ = wire::write_frame(&mut s, OP_NOTICE, &notice);
        }
    }
    Err(Ended::Failed(format!("rank {rank} of world {generation} (bridge rank {r}) {why}")))
}
