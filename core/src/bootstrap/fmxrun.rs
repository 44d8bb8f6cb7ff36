//! The client side of fmxrun's out-of-band exchange (TCP on 127.0.0.1), and
//! the link through which fmxrun's failure notice reaches the engine.

use std::cell::RefCell;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::launcher::Launcher;
use super::pmi::{SpawnRequest, Watch};
use super::wire::{self, Notice, OP_ABORT, OP_ALLGATHER, OP_BARRIER, OP_ERROR, OP_FINALIZE, OP_HELLO, OP_NOTICE, OP_SPAWN};
use crate::error::{Error, Result};
use crate::failure::Failure;

/// `host:port` of fmxrun's rendezvous server.
pub const ENV_RENDEZVOUS: &str = "FMX_RENDEZVOUS";

/// Seconds a start-up round (hello, address exchange, barrier) may take, and
/// any one answer once it has begun to arrive.
pub const ENV_BOOT_TIMEOUT: &str = "FMX_BOOT_TIMEOUT";
const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest `FMX_BOOT_TIMEOUT` accepted (a day).
const MAX_BOOT_TIMEOUT: f64 = 86_400.0;

pub(crate) struct Client {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) job: String,
    link: Rc<Link>,
    boot_timeout: Duration,
    /// Who serves the group, for messages: fmxrun, or (a bridge under
    /// Hydra) the old world's rank 0.
    server: &'static str,
}

/// The server of a bridge that a PMI process manager's job spawned (`hub`).
pub(crate) const HUB: &str = "the bridge's rendezvous (on the old world's rank 0)";

/// How often a finalize round asks its watch while fmxrun has not answered.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// The connection to fmxrun. Besides the rounds, fmxrun sends the job's
/// first failure on it at any time ([`Link::failure`] looks, never waiting).
pub(crate) struct Link {
    stream: TcpStream,
    /// Who is at the other end (see `Client::server`).
    server: &'static str,
    failure: RefCell<Option<Failure>>,
}

/// A number of the environment, range-checked, with errors naming it.
fn env_u32(name: &str) -> Result<u32> {
    let v = fmx_transport::settings::var(name).ok_or_else(|| Error::Bootstrap(format!("{name} is not set (fmxrun sets it)")))?;
    v.trim().parse().map_err(|_| Error::Bootstrap(format!("{name}={v:?} is not a number from 0 to {}", u32::MAX)))
}

/// `FMX_BOOT_TIMEOUT` in seconds (default 120).
pub(crate) fn boot_timeout() -> Result<Duration> {
    let Some(v) = fmx_transport::settings::var(ENV_BOOT_TIMEOUT) else { return Ok(DEFAULT_BOOT_TIMEOUT) };
    v.trim().parse::<f64>().ok().filter(|s| *s > 0.0 && *s <= MAX_BOOT_TIMEOUT).map(Duration::from_secs_f64).ok_or_else(|| {
        Error::Bootstrap(format!("{ENV_BOOT_TIMEOUT}={v:?} is not a number of seconds above 0 and at most {MAX_BOOT_TIMEOUT}"))
    })
}

impl Client {
    pub(crate) fn connect_from_env() -> Result<Self> {
        let addr = fmx_transport::settings::var(ENV_RENDEZVOUS).unwrap_or_default();
        let rank = env_u32("FMX_RANK")?;
        let size = env_u32("FMX_SIZE")?;
        if size == 0 || rank >= size {
            return Err(Error::Bootstrap(format!("FMX_RANK={rank} is not below FMX_SIZE={size}")));
        }
        let job = fmx_transport::settings::var("FMX_JOB").ok_or_else(|| Error::Bootstrap("FMX_JOB is not set (fmxrun sets it)".into()))?;
        Self::connect(&addr, rank, size, job)
    }

    /// Joins the group served at `addr` as `rank` of `size`.
    pub(crate) fn connect(addr: &str, rank: u32, size: u32, job: String) -> Result<Self> {
        Self::connect_within(addr, rank, size, job, boot_timeout()?, "fmxrun")
    }

    /// Joins the group `server` serves at `addr` (see [`HUB`]).
    pub(crate) fn connect_to(addr: &str, rank: u32, size: u32, job: String, server: &'static str) -> Result<Self> {
        Self::connect_within(addr, rank, size, job, boot_timeout()?, server)
    }

    fn connect_within(addr: &str, rank: u32, size: u32, job: String, boot_timeout: Duration, server: &'static str) -> Result<Self> {
        let io = |what: String| move |source| Error::BootstrapIo { what, source };
        let sockaddr: std::net::SocketAddr =
            addr.parse().map_err(|_| Error::Bootstrap(format!("{ENV_RENDEZVOUS}={addr:?} is not an address such as 127.0.0.1:4000")))?;
        let stream = TcpStream::connect_timeout(&sockaddr, boot_timeout).map_err(io(format!("connecting to {server} at {addr}")))?;
        stream.set_nodelay(true).map_err(io("TCP_NODELAY".into()))?;
        stream.set_write_timeout(Some(boot_timeout)).map_err(io("write timeout".into()))?;
        let link = Rc::new(Link { stream, server, failure: RefCell::new(None) });
        let c = Self { rank, size, job, link, boot_timeout, server };
        let mut hello = Vec::new();
        for v in [rank, size, std::process::id()] {
            hello.extend_from_slice(&v.to_le_bytes());
        }
        // Every rank of the group must have arrived within the start-up timeout.
        c.round(OP_HELLO, &hello, "hello", true)?;
        Ok(c)
    }

    /// The link the engine watches for the job's failure notice.
    pub(crate) fn link(&self) -> Rc<Link> {
        self.link.clone()
    }

    /// One round: our frame, then fmxrun's answer (or its failure notice).
    /// `startup` rounds must be answered within the start-up timeout; the
    /// others (finalize, spawn) wait for the slowest rank, however long it
    /// computes, since a failure anywhere ends them with a notice.
    fn round(&self, op: u8, body: &[u8], what: &str, startup: bool) -> Result<Vec<u8>> {
        self.round_watching(op, body, what, startup, None)
    }

    /// [`Client::round`] that, while fmxrun has not answered, asks `watch`
    /// every [`WATCH_EVERY`] whether to give up (and lets it progress the
    /// transport: peers may need an answer from us to reach the same round).
    fn round_watching(&self, op: u8, body: &[u8], what: &str, startup: bool, watch: Option<&mut Watch>) -> Result<Vec<u8>> {
        if let Some(f) = self.link.failure.borrow().as_ref() {
            return Err(f.error(&format!("the {what} round with {}", self.server)));
        }
        let io = |source: std::io::Error| {
            let hint = match source.kind() {
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                    format!(
                        "no answer within {:?} ({ENV_BOOT_TIMEOUT}; did every rank start? is {} answering?)",
                        self.boot_timeout, self.server
                    )
                }
                _ => format!("{} closed the connection (it died, or refused us)", self.server),
            };
            Error::BootstrapIo { what: format!("{what} round with {}: {hint}", self.server), source }
        };
        wire::write_frame(&mut &self.link.stream, op, body).map_err(io)?;
        if let Some(watch) = watch {
            loop {
                self.link.stream.set_read_timeout(Some(WATCH_EVERY)).map_err(io)?;
                match self.link.stream.peek(&mut [0u8; 1]) {
                    Ok(_) => break, // an answer, or the end: the read below says which
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => return Err(io(e)),
                }
                if let Some(e) = watch() {
                    return Err(e);
                }
            }
        }
        let first_byte_by = startup.then(|| Instant::now() + self.boot_timeout);
        let (rop, reply) = wire::read_frame_by(&self.link.stream, first_byte_by, self.boot_timeout).map_err(io)?;
        match rop {
            _ if rop == op => Ok(reply),
            OP_NOTICE => {
                let f = Failure::from_notice(&reply, self.server)
                    .ok_or_else(|| Error::Bootstrap(format!("{} sent a malformed failure notice during {what}", self.server)))?;
                let e = f.error(&format!("the {what} round with {}", self.server));
                *self.link.failure.borrow_mut() = Some(f);
                Err(e)
            }
            OP_ERROR => Err(Error::Bootstrap(format!("{} refused our {what}: {}", self.server, String::from_utf8_lossy(&reply)))),
            _ => Err(Error::Bootstrap(format!("{} answered op {rop:?} to {what}", self.server))),
        }
    }

    pub(crate) fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        let reply = self.round(OP_ALLGATHER, blob, "allgather", true)?;
        let blobs = wire::decode_blobs(&reply).ok_or_else(|| Error::Bootstrap("malformed allgather reply".into()))?;
        if blobs.len() != self.size as usize {
            return Err(Error::Bootstrap(format!("allgather returned {} blobs for {} ranks", blobs.len(), self.size)));
        }
        Ok(blobs)
    }

    pub(crate) fn barrier(&mut self) -> Result<()> {
        self.round(OP_BARRIER, &[], "barrier", true).map(drop)
    }

    pub(crate) fn finalize(&mut self) -> Result<()> {
        self.round(OP_FINALIZE, &[], "finalize", false).map(drop)
    }

    /// [`Client::finalize`], asking `watch` meanwhile.
    pub(crate) fn finalize_watching(&mut self, mut watch: Watch) -> Result<()> {
        self.round_watching(OP_FINALIZE, &[], "finalize", false, Some(&mut watch)).map(drop)
    }

    /// Tells fmxrun that this process is failing (best effort, never blocks
    /// long): every rank learns it at once, before this process has exited.
    pub(crate) fn abort(&self, why: &str) {
        let _ = self.link.stream.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = wire::write_frame(&mut &self.link.stream, OP_ABORT, why.as_bytes());
    }

    /// Asks fmxrun (with every rank of the world) to start a world of `np`
    /// ranks; with `bridge`, the answer is the bridge's address and job id.
    pub(crate) fn spawn_world(&mut self, np: u32, bridge: bool, values: &str) -> Result<Option<(String, String)>> {
        let mut body = np.to_le_bytes().to_vec();
        body.push(u8::from(bridge));
        body.extend_from_slice(values.as_bytes());
        let reply = self.round(OP_SPAWN, &body, "spawn", false)?;
        match reply.split_first() {
            Some((0, rest)) if !bridge => rest.is_empty().then_some(None).ok_or_else(|| Error::Bootstrap("malformed spawn reply".into())),
            Some((0, rest)) => match wire::decode_blobs(rest).as_deref() {
                Some([addr, job]) => Ok(Some((String::from_utf8_lossy(addr).into_owned(), String::from_utf8_lossy(job).into_owned()))),
                _ => Err(Error::Bootstrap("malformed spawn reply".into())),
            },
            Some((_, msg)) => Err(Error::Launch(String::from_utf8_lossy(msg).into_owned())),
            None => Err(Error::Bootstrap("empty spawn reply".into())),
        }
    }
}

impl Link {
    /// The job's first failure, if fmxrun has told it (or has gone). Looks at
    /// the socket without waiting: call it while idle, not per message.
    pub(crate) fn failure(&self) -> Option<Failure> {
        if let Some(f) = self.failure.borrow().as_ref() {
            return Some(f.clone());
        }
        let f = self.look()?;
        *self.failure.borrow_mut() = Some(f.clone());
        Some(f)
    }

    /// A complete notice waiting on the socket (taken), or the end of the connection.
    fn look(&self) -> Option<Failure> {
        use rustix::net::{recv, RecvFlags};
        let peek = RecvFlags::PEEK | RecvFlags::DONTWAIT;
        let mut prefix = [0u8; 4];
        match recv(self.stream.as_fd(), &mut prefix, peek) {
            Ok((0, _)) => return Some(Failure::LauncherGone(self.server)),
            Ok((4, _)) => {}
            Ok(_) | Err(_) => return None, // nothing (or not all of it) yet
        }
        let len = wire::frame_len(prefix).ok()?;
        let mut frame = vec![0u8; 4 + len];
        match recv(self.stream.as_fd(), &mut frame, peek) {
            Ok((n, _)) if n == frame.len() => {}
            _ => return None,
        }
        // The whole frame is there: take it (a read that cannot block).
        let (op, body) = wire::read_frame(&mut &self.stream).ok()?;
        match op {
            OP_NOTICE => Failure::from_notice(&body, self.server),
            _ => None, // nothing else arrives outside a round
        }
    }
}

impl Failure {
    fn from_notice(body: &[u8], server: &'static str) -> Option<Self> {
        Notice::decode(body).map(|n| Failure::Notice(n, server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A fake fmxrun on 127.0.0.1 that reads one hello and then does `then`.
    fn fake_fmxrun(then: impl FnOnce(std::net::TcpStream) + Send + 'static) -> (String, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 17];
            s.read_exact(&mut hello).unwrap();
            then(s);
        });
        (addr, server)
    }

    /// A fake fmxrun answering the hello with a truncated frame, an
    /// oversized one, another op, an unknown op, a malformed notice or a
    /// refusal: each is an error that says what was wrong, never a panic.
    #[test]
    fn bad_answers_from_a_fake_fmxrun_are_named_errors() {
        let cases: [(&[u8], &str); 6] = [
            (&[10, 0, 0, 0, OP_HELLO, 1], "closed the connection"),
            (&[255, 255, 255, 255, OP_HELLO], "bootstrap frame of 4294967295 bytes"),
            (&[1, 0, 0, 0, OP_BARRIER], "answered op"),
            (&[1, 0, 0, 0, b'?'], "answered op"),
            (&[3, 0, 0, 0, OP_NOTICE, 1, 2], "malformed failure notice"),
            (&[6, 0, 0, 0, OP_ERROR, b'n', b'o', b'p', b'e', b'!'], "refused our hello: nope!"),
        ];
        for (answer, expect) in cases {
            let (addr, server) = fake_fmxrun(move |mut s| s.write_all(answer).unwrap());
            let e =
                Client::connect_within(&addr, 0, 2, "j".into(), Duration::from_secs(2), "fmxrun").err().expect("a bad answer").to_string();
            assert!(e.contains(expect), "{answer:?}: {e}");
            server.join().unwrap();
        }
    }

    /// Item 17 of issue 15: a rendezvous that accepts and never answers, or
    /// answers one byte at a time, is an error within the start-up timeout.
    #[test]
    fn item17_a_silent_or_trickling_rendezvous_times_out() {
        for trickle in [false, true] {
            let (addr, server) = fake_fmxrun(move |mut s| {
                if trickle {
                    let mut reply = Vec::new();
                    wire::write_frame(&mut reply, OP_HELLO, &[]).unwrap();
                    for b in reply {
                        if s.write_all(&[b]).is_err() {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(400));
                    }
                } else {
                    std::thread::sleep(Duration::from_millis(1500));
                }
            });
            let t = Instant::now();
            let e = Client::connect_within(&addr, 0, 2, "j".into(), Duration::from_secs(1), "fmxrun").err().expect("no answer");
            let took = t.elapsed();
            assert!(took < Duration::from_millis(2500), "trickle={trickle}: {took:?}");
            assert!(e.to_string().contains(ENV_BOOT_TIMEOUT), "trickle={trickle}: {e}");
            server.join().unwrap();
        }
    }
}

// fmxrun starts every rank on this host.
super::launcher::user_bootstrap_of_backend!(Client, nodes: |c| vec![0; c.size as usize], job_id: |c| c.job.clone());

impl Launcher for Client {
    fn name(&self) -> &'static str {
        "fmxrun"
    }
    fn finalize(&mut self) -> Result<()> {
        Client::finalize(self)
    }
    fn finalize_watching(&mut self, watch: Watch) -> Result<()> {
        Client::finalize_watching(self, watch)
    }
    fn spawn(&mut self, _req: &SpawnRequest) -> Result<()> {
        Err(Error::Launch(
            "spawn: under fmxrun a new world of this program comes from Fmx::spawn_world (connected by an intercommunicator); \
             Fmx::spawn (any program, PMI values) needs Hydra (mpiexec)"
                .into(),
        ))
    }
    fn spawn_world(&mut self, np: u32, bridge: bool, values: &str, _generation: u32) -> Result<Option<(String, String)>> {
        // fmxrun counts the worlds it started itself.
        Client::spawn_world(self, np, bridge, values)
    }
    fn link(&self) -> Option<Rc<Link>> {
        Some(Client::link(self))
    }
    fn abort(&self, _code: i32, why: &str) {
        Client::abort(self, why);
    }
}
