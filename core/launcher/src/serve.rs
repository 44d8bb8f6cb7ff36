//! fmxrun's rendezvous servers: one group per world (and one per bridge
//! between two worlds), serving the bootstrap rounds in lock step and
//! carrying the job's failure notice to every member.
//!
//! One thread per group polls the listener and every member's connection
//! (no read ever blocks the group on one rank), so it notices at once a
//! rank that announces its failure ([`wire::OP_ABORT`]), a connection that
//! closes before its rank finalized, a rank that exited without
//! finalizing while others wait for it, a hello with a wrong rank or size,
//! and ranks that disagree on the round. Each is reported to the launcher's
//! main loop, which decides the job's first failure and hands its notice to
//! every group ([`Group::notify`]): members get it at once, a rank that
//! connects later gets it instead of the hello answer.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Event;
use fmx::launch_protocol::{
    self as wire, Notice, OP_ABORT, OP_ALLGATHER, OP_BARRIER, OP_ERROR, OP_FINALIZE, OP_HELLO, OP_NOTICE, OP_SPAWN,
};

/// How long the group waits between looks at exits and notices.
const TICK: Duration = Duration::from_millis(50);
/// A connection that closed before its rank finalized, while its process
/// still runs this long after, is a failure of its own (else the exit says more).
const CLOSED_GRACE: Duration = Duration::from_millis(300);
/// How long a write to one rank may block (a rank that never reads).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A world's request to start another world, as every rank sent it.
pub(crate) struct SpawnAsk {
    /// The asking world's generation.
    pub(crate) parent_generation: u32,
    /// Size of the asking world.
    pub(crate) parent_np: u32,
    /// Size of the new world.
    pub(crate) np: u32,
    /// Connect both worlds through a bridge (intercommunicator mode).
    pub(crate) bridge: bool,
    /// Opaque values for the new world (`FMX_SPAWN_VALUES`).
    pub(crate) values: Vec<u8>,
    /// Where the answer goes: the bridge's address and job id, or why not.
    pub(crate) reply: mpsc::Sender<Result<Option<(String, String)>, String>>,
}

/// A failure the group found (the main loop makes the first one the job's).
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub(crate) generation: u32,
    pub(crate) rank: u32,
    pub(crate) reason: String,
}

/// Decodes a spawn round's body: new size, bridge flag, values.
pub(crate) fn decode_spawn(body: &[u8]) -> Option<(u32, bool, &[u8])> {
    let np = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    let bridge = *body.get(4)? != 0;
    Some((np, bridge, &body[5..]))
}

#[derive(Default)]
struct Member {
    /// The write side of its connection (replies from the group, notices from the main loop).
    writer: Option<TcpStream>,
    connected: bool,
    finalized: bool,
    /// Its process's exit code, once the main loop saw it exit.
    exit: Option<i32>,
    /// When its connection closed before it finalized.
    closed_at: Option<Instant>,
    /// A failure of this member was reported (once is enough).
    reported: bool,
}

#[derive(Default)]
struct State {
    members: Vec<Member>,
    notice: Option<Failure>,
    done: bool,
}

/// One group of ranks served together (a world, or a bridge of two worlds).
pub(crate) struct Group {
    /// (generation, rank) of each member, in group rank order.
    members: Vec<(u32, u32)>,
    /// fmxrun --keep-going: rounds go on without departed members (finalize
    /// completes, the others are refused); otherwise the notice ends them.
    keep_going: bool,
    st: Mutex<State>,
}

impl Group {
    /// Serves `members` on `listener` from a thread of its own.
    pub(crate) fn start(
        listener: TcpListener,
        members: Vec<(u32, u32)>,
        keep_going: bool,
        events: mpsc::Sender<Event>,
    ) -> std::io::Result<Arc<Self>> {
        listener.set_nonblocking(true)?;
        let st = State { members: members.iter().map(|_| Member::default()).collect(), ..State::default() };
        let g = Arc::new(Self { members, keep_going, st: Mutex::new(st) });
        let me = g.clone();
        std::thread::Builder::new().name("fmxrun-group".into()).spawn(move || me.serve(&listener, &events))?;
        Ok(g)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The group rank of process (`generation`, `rank`), if it is a member.
    pub(crate) fn member_of(&self, generation: u32, rank: u32) -> Option<usize> {
        self.members.iter().position(|&m| m == (generation, rank))
    }

    /// The main loop saw process (`generation`, `rank`) exit with `code`.
    pub(crate) fn exited(&self, generation: u32, rank: u32, code: i32) {
        if let Some(i) = self.member_of(generation, rank) {
            self.state().members[i].exit = Some(code);
        }
    }

    /// Tells every member (and every later one) that the job failed.
    pub(crate) fn notify(&self, f: &Failure) {
        let mut st = self.state();
        if st.notice.is_some() {
            return;
        }
        st.notice = Some(f.clone());
        let body = self.notice_for(f).encode();
        for m in st.members.iter_mut().filter(|m| !m.finalized) {
            if let Some(w) = &mut m.writer {
                let _ = wire::write_frame(w, OP_NOTICE, &body);
            }
        }
    }

    fn notice_for(&self, f: &Failure) -> Notice {
        let member = self.member_of(f.generation, f.rank).map(|m| m as u32);
        Notice { member, generation: f.generation, rank: f.rank, reason: f.reason.clone() }
    }

    /// Ends the group's thread (the job is over) and closes its connections.
    pub(crate) fn close(&self) {
        let mut st = self.state();
        st.done = true;
        for m in &mut st.members {
            m.writer = None;
        }
    }

    fn serve(&self, listener: &TcpListener, events: &mpsc::Sender<Event>) {
        let np = self.members.len();
        let mut readers: Vec<Option<(TcpStream, Vec<u8>)>> = (0..np).map(|_| None).collect();
        // Accepted connections whose hello has not arrived yet.
        let mut unknown: Vec<(TcpStream, Vec<u8>)> = Vec::new();
        let mut pending: Vec<Option<(u8, Vec<u8>)>> = (0..np).map(|_| None).collect();
        let mut hello_answered = false;
        let report = |f: Failure| {
            let _ = events.send(Event::Failed(f));
        };
        loop {
            if self.state().done {
                return;
            }
            wait_readable(listener, readers.iter().flatten().chain(unknown.iter()).map(|(s, _)| s));
            while let Ok((s, _)) = listener.accept() {
                let _ = s.set_nodelay(true);
                let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
                unknown.push((s, Vec::new()));
            }
            // Hellos.
            let mut i = 0;
            while i < unknown.len() {
                let (s, buf) = &mut unknown[i];
                match take_frame(s, buf) {
                    Ok(None) => i += 1,
                    Ok(Some((OP_HELLO, body))) => {
                        let (s, _) = unknown.swap_remove(i);
                        self.admit(s, &body, &mut readers, &report);
                    }
                    Ok(Some(_)) | Err(_) => drop(unknown.swap_remove(i)),
                }
            }
            if !hello_answered && readers.iter().all(Option::is_some) {
                hello_answered = true;
                let mut st = self.state();
                if st.notice.is_none() {
                    for m in &mut st.members {
                        if let Some(w) = &mut m.writer {
                            let _ = wire::write_frame(w, OP_HELLO, &[]);
                        }
                    }
                }
            }
            // Rounds and announcements.
            for r in 0..np {
                let Some((s, buf)) = &mut readers[r] else { continue };
                loop {
                    match take_frame(s, buf) {
                        Ok(None) => break,
                        Ok(Some((OP_ABORT, why))) => {
                            let why = String::from_utf8_lossy(&why).into_owned();
                            let (generation, rank) = self.members[r];
                            self.state().members[r].reported = true;
                            report(Failure { generation, rank, reason: why });
                        }
                        Ok(Some(frame)) => {
                            if pending[r].is_some() {
                                let (generation, rank) = self.members[r];
                                report(Failure { generation, rank, reason: "broke the bootstrap protocol (two rounds at once)".into() });
                            }
                            pending[r] = Some(frame);
                        }
                        Err(_) => {
                            // Closed: fine after finalize; otherwise the rank is going.
                            readers[r] = None;
                            let mut st = self.state();
                            if !st.members[r].finalized {
                                st.members[r].closed_at = Some(Instant::now());
                            }
                            break;
                        }
                    }
                }
            }
            // A round completes when every member that has not departed is in it.
            // (departed members count only under --keep-going)
            let departed = self.departed();
            if pending.iter().any(Option::is_some) && (0..np).all(|r| pending[r].is_some() || departed[r]) {
                let frames: Vec<(usize, (u8, Vec<u8>))> = (0..np).filter_map(|r| pending[r].take().map(|f| (r, f))).collect();
                if let Some(f) = self.mismatch(&frames) {
                    report(f);
                } else if frames.len() == np || frames[0].1 .0 == OP_FINALIZE {
                    // Finalize completes without the departed (fmxrun --keep-going).
                    self.answer(&frames, events);
                } else {
                    self.refuse_round(&frames, departed.iter().position(|&d| d).unwrap_or(0));
                }
            }
            self.check_exits(&report);
        }
    }

    /// Takes a hello: the member's connection joins the group (and gets the
    /// notice at once if the job already failed); a wrong rank or size gets
    /// an error frame and fails the job.
    fn admit(&self, s: TcpStream, body: &[u8], readers: &mut [Option<(TcpStream, Vec<u8>)>], report: &impl Fn(Failure)) {
        let np = self.members.len() as u32;
        let field = |i: usize| body.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        let (Some(rank), Some(size)) = (field(0), field(4)) else {
            let _ = wire::write_frame(&mut &s, OP_ERROR, b"malformed hello");
            return;
        };
        let pid = field(8).unwrap_or(0);
        // The refused process gets `msg`; every rank gets the failure of `blame`.
        let refuse = |msg: String, blame: u32, reason: String| {
            // Reported first: the refused process exits as soon as it reads `msg`.
            let (generation, rank) = self.members[blame.min(np - 1) as usize];
            report(Failure { generation, rank, reason });
            let _ = wire::write_frame(&mut &s, OP_ERROR, msg.as_bytes());
        };
        if size != np {
            let why = format!("said its world has {size} ranks, but fmxrun started {np}: check FMX_SIZE (does a wrapper set it?)");
            refuse(format!("rank {rank} (pid {pid}) {why}"), rank, format!("(pid {pid}) {why}"));
            return;
        }
        if rank >= np {
            let why = format!("a process (pid {pid}) said it is rank {rank}, but the world has ranks 0..{np}: check FMX_RANK");
            refuse(why.clone(), np - 1, format!("was not seen: {why}"));
            return;
        }
        let mut st = self.state();
        let m = &mut st.members[rank as usize];
        if m.connected {
            drop(st);
            let why = format!("is claimed by two processes (the second is pid {pid}): check FMX_RANK (does a wrapper set it?)");
            refuse(format!("rank {rank} {why}"), rank, why);
            return;
        }
        let Ok(writer) = s.try_clone() else { return };
        m.connected = true;
        m.writer = Some(writer);
        let late_notice = st.notice.clone();
        drop(st);
        if let Some(f) = late_notice {
            let _ = wire::write_frame(&mut &s, OP_NOTICE, &self.notice_for(&f).encode());
        }
        readers[rank as usize] = Some((s, Vec::new()));
    }

    /// Ranks in different rounds: the job cannot go on.
    fn mismatch(&self, frames: &[(usize, (u8, Vec<u8>))]) -> Option<Failure> {
        let (first, (op0, _)) = &frames[0];
        let (r, (op, _)) = frames.iter().find(|(_, (op, _))| op != op0)?;
        let (generation, rank) = self.members[*r];
        Some(Failure {
            generation,
            rank,
            reason: format!(
                "entered the bootstrap round {} while rank {first} entered {} (a collective start-up or shutdown call out of order)",
                round_name(*op),
                round_name(*op0)
            ),
        })
    }

    /// Members that exited, or closed their connection, without finalizing
    /// (only with `keep_going`: otherwise the job's notice ends the round).
    fn departed(&self) -> Vec<bool> {
        self.state().members.iter().map(|m| self.keep_going && !m.finalized && (m.exit.is_some() || m.closed_at.is_some())).collect()
    }

    fn answer(&self, frames: &[(usize, (u8, Vec<u8>))], events: &mpsc::Sender<Event>) {
        let op = frames[0].1 .0;
        let reply = match op {
            OP_ALLGATHER => wire::encode_blobs(&frames.iter().map(|(_, (_, b))| b.clone()).collect::<Vec<_>>()),
            OP_SPAWN => spawn_reply(self.members[0].0, self.members.len() as u32, frames, events),
            _ => Vec::new(),
        };
        let mut st = self.state();
        if st.notice.is_some() {
            return; // every member already has the notice instead
        }
        for &(r, _) in frames {
            let m = &mut st.members[r];
            m.finalized |= op == OP_FINALIZE;
            if let Some(w) = &mut m.writer {
                let _ = wire::write_frame(w, op, &reply);
            }
        }
    }

    /// A round that a departed member can never join (fmxrun --keep-going):
    /// the live members get an error naming it instead of waiting.
    fn refuse_round(&self, frames: &[(usize, (u8, Vec<u8>))], gone: usize) {
        let mut st = self.state();
        let how = st.members[gone].exit.map_or_else(|| "closed its connection".to_string(), |c| format!("exited with code {c}"));
        let msg = format!("rank {gone} of this group {how}: the {} round cannot complete", round_name(frames[0].1 .0));
        for &(r, _) in frames {
            if let Some(w) = &mut st.members[r].writer {
                let _ = wire::write_frame(w, OP_ERROR, msg.as_bytes());
            }
        }
    }

    /// Members that left without finalizing while others wait for them.
    fn check_exits(&self, report: &impl Fn(Failure)) {
        let mut st = self.state();
        let anyone_connected = st.members.iter().any(|m| m.connected);
        let mut found = Vec::new();
        for (i, m) in st.members.iter_mut().enumerate() {
            if m.reported || m.finalized {
                continue;
            }
            let why = match (m.exit, m.closed_at) {
                // A failing exit code is the main loop's to report.
                (Some(c), _) if c != 0 => {
                    m.reported = true;
                    None
                }
                (Some(_), _) if m.connected => Some("exited with code 0 without finalizing fmx".to_string()),
                (Some(_), _) if anyone_connected => Some("exited with code 0 before calling fmx::init".to_string()),
                (None, Some(t)) if t.elapsed() >= CLOSED_GRACE => {
                    Some("closed its connection to fmxrun without finalizing (its process still runs)".to_string())
                }
                _ => None,
            };
            if let Some(why) = why {
                m.reported = true;
                found.push((i, why));
            }
        }
        drop(st);
        for (i, reason) in found {
            let (generation, rank) = self.members[i];
            report(Failure { generation, rank, reason });
        }
    }
}

fn round_name(op: u8) -> &'static str {
    match op {
        OP_ALLGATHER => "allgather (address exchange)",
        OP_BARRIER => "barrier",
        OP_FINALIZE => "finalize",
        OP_SPAWN => "spawn_world",
        OP_HELLO => "hello",
        _ => "unknown",
    }
}

/// Waits until the listener or a connection is readable, or a tick passed.
fn wait_readable<'a>(listener: &TcpListener, conns: impl Iterator<Item = &'a TcpStream>) {
    use rustix::event::{PollFd, PollFlags};
    let mut fds = vec![PollFd::new(listener, PollFlags::IN)];
    fds.extend(conns.map(|c| PollFd::new(c, PollFlags::IN)));
    let tick = rustix::event::Timespec { tv_sec: 0, tv_nsec: TICK.as_nanos() as i64 };
    let _ = rustix::event::poll(&mut fds, Some(&tick));
}

/// Reads what has arrived on `s` (never blocks) into `buf` and takes one
/// complete frame out of it. `Err` when the connection closed or sent garbage.
fn take_frame(s: &TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    if let Some(f) = frame_in(buf)? {
        return Ok(Some(f));
    }
    let mut chunk = [0u8; 64 << 10];
    match rustix::net::recv(s.as_fd(), &mut chunk, rustix::net::RecvFlags::DONTWAIT) {
        Ok((0, _)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok((n, _)) => buf.extend_from_slice(&chunk[..n]),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    frame_in(buf)
}

/// One complete frame at the start of `buf`, removed from it.
fn frame_in(buf: &mut Vec<u8>) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let Some(prefix) = buf.get(..4) else { return Ok(None) };
    let len = wire::frame_len(prefix.try_into().expect("4 bytes"))?;
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let frame: Vec<u8> = buf.drain(..4 + len).skip(4).collect();
    Ok(Some((frame[0], frame[1..].to_vec())))
}

/// Asks the launcher's main loop to start the world; the reply is a status
/// byte (0 ok, 1 error) then the bridge's address and job, or the error text.
fn spawn_reply(generation: u32, np: u32, frames: &[(usize, (u8, Vec<u8>))], events: &mpsc::Sender<Event>) -> Vec<u8> {
    let fail = |msg: String| {
        let mut v = vec![1u8];
        v.extend_from_slice(msg.as_bytes());
        v
    };
    if let Some((r, _)) = frames.iter().find(|(_, (_, b))| b != &frames[0].1 .1) {
        return fail(format!("spawn: ranks {} and {r} asked for different worlds (a spawn is collective and must agree)", frames[0].0));
    }
    let Some((new_np, bridge, values)) = decode_spawn(&frames[0].1 .1) else {
        return fail("spawn: malformed request".into());
    };
    let (tx, rx) = mpsc::channel();
    let ask = SpawnAsk { parent_generation: generation, parent_np: np, np: new_np, bridge, values: values.to_vec(), reply: tx };
    if events.send(Event::Spawn(ask)).is_err() {
        return fail("spawn: fmxrun is shutting down".into());
    }
    match rx.recv() {
        Ok(Ok(Some((addr, job)))) => {
            let mut v = vec![0u8];
            v.extend_from_slice(&wire::encode_blobs(&[addr.into_bytes(), job.into_bytes()]));
            v
        }
        Ok(Ok(None)) => vec![0u8],
        Ok(Err(e)) => fail(e),
        Err(_) => fail("spawn: fmxrun is shutting down".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10^6 mutated byte streams as a rank could send them (FMX_FUZZ_ITERS
    /// for more): the server's framing and spawn decoding never panic, and a
    /// frame is taken only whole.
    #[test]
    fn fuzz_what_ranks_send() {
        let mut corpus = Vec::new();
        for (op, body) in [
            (OP_HELLO, vec![1, 0, 0, 0, 4, 0, 0, 0, 9, 9, 0, 0]),
            (OP_SPAWN, vec![3, 0, 0, 0, 1, b'k', b'=', b'v']),
            (OP_ABORT, b"panicked".to_vec()),
        ] {
            let mut f = Vec::new();
            wire::write_frame(&mut f, op, &body).unwrap();
            corpus.push(f);
        }
        let corpus: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        let mut m = fmx_transport::mutate::Mutator::new(7);
        let mut input = Vec::new();
        let iters = fmx_transport::mutate::iterations(1_000_000);
        for _ in 0..iters {
            m.mutate(&corpus, &mut input);
            let mut buf = input.clone();
            while let Ok(Some((op, body))) = frame_in(&mut buf) {
                if op == OP_SPAWN {
                    let _ = decode_spawn(&body);
                }
            }
        }
    }

    #[test]
    fn frames_are_taken_whole_from_a_buffer() {
        let mut b = Vec::new();
        wire::write_frame(&mut b, OP_BARRIER, b"").unwrap();
        wire::write_frame(&mut b, OP_ALLGATHER, b"abc").unwrap();
        let mut part = b[..3].to_vec();
        assert_eq!(frame_in(&mut part).unwrap(), None, "a partial prefix is no frame");
        let mut all = b.clone();
        assert_eq!(frame_in(&mut all).unwrap(), Some((OP_BARRIER, vec![])));
        let mut half = all[..5].to_vec();
        assert_eq!(frame_in(&mut half).unwrap(), None, "a partial body is no frame");
        assert_eq!(frame_in(&mut all).unwrap(), Some((OP_ALLGATHER, b"abc".to_vec())));
        assert!(all.is_empty());
        assert!(frame_in(&mut vec![0, 0, 0, 0]).is_err(), "an empty frame is garbage");
    }
}
