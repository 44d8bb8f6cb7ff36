//! The local process manager behind `fmxrun` (and `fmx-perf` started alone).
//!
//! Starts N processes of a program on this host, hands each its rank, the
//! job size, a job id and the address of an out-of-band rendezvous server
//! (TCP on 127.0.0.1) in the environment, serves the bootstrap exchange,
//! forwards output (optionally prefixed with `[rank]`), and propagates the
//! first non-zero exit code. When a rank fails, the others get a grace period
//! to report the failure themselves (their operations with it fail within a
//! bounded time), then are killed. Ranks die with the launcher
//! (`PR_SET_PDEATHSIG`), and the job's shared-memory files are removed at the
//! end whatever happened.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::bootstrap::wire::{self, OP_ALLGATHER, OP_BARRIER, OP_FINALIZE, OP_HELLO};
use crate::bootstrap::ENV_RENDEZVOUS;
use crate::error::{Error, Result};

/// Environment variable with the launcher's pid (ranks die with it).
pub const ENV_LAUNCHER_PID: &str = "FMX_LAUNCHER_PID";

/// A job to start.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Number of ranks.
    pub np: u32,
    /// The program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Transport to ask for (`FMX_TRANSPORT`), `None` for automatic.
    pub transport: Option<String>,
    /// Prefix every output line with `[rank] `.
    pub label: bool,
    /// Collect the ranks' output lines into [`Outcome::lines`] instead of printing them.
    pub capture: bool,
    /// How long the other ranks may run after one failed before they are killed.
    pub kill_grace: Duration,
    /// Kill the whole job after this long (exit code 124).
    pub timeout: Option<Duration>,
    /// More environment for the ranks.
    pub env: Vec<(OsString, OsString)>,
    /// Where the rendezvous listens: 127.0.0.1 unless ranks run in other
    /// network namespaces and reach it over a veth (the two-namespace test).
    pub bind: std::net::IpAddr,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The job's exit code: the first non-zero rank exit code (signals as 128+n), 124 on timeout.
    pub code: i32,
    /// The rank that failed first, if any.
    pub failed_rank: Option<u32>,
    /// Whether the job ran into its timeout.
    pub timed_out: bool,
    /// The job id.
    pub job: String,
    /// Shared-memory files removed at the end (left by killed ranks).
    pub files_removed: usize,
    /// With [`Launch::capture`]: every output line as (rank, from stderr, text).
    pub lines: Vec<(u32, bool, String)>,
}

type Captured = std::sync::Arc<std::sync::Mutex<Vec<(u32, bool, String)>>>;

enum Event {
    Exit(u32, ExitStatus),
    Signal(i32),
}

impl Launch {
    /// `np` ranks of `program` with default settings.
    pub fn new(np: u32, program: impl Into<OsString>) -> Self {
        Self {
            np,
            program: program.into(),
            args: Vec::new(),
            transport: None,
            label: false,
            capture: false,
            kill_grace: Duration::from_secs(2),
            timeout: None,
            env: Vec::new(),
            bind: std::net::Ipv4Addr::LOCALHOST.into(),
        }
    }

    /// Runs the job to its end.
    pub fn run(&self) -> Result<Outcome> {
        if self.np == 0 {
            return Err(Error::Launch("the number of ranks must be at least 1".into()));
        }
        if let Some(t) = &self.transport {
            if !crate::TRANSPORT_NAMES.contains(&t.as_str()) {
                return Err(Error::Launch(format!("unknown transport {t:?} (known: {})", crate::TRANSPORT_NAMES.join(", "))));
            }
        }
        let listener =
            TcpListener::bind((self.bind, 0)).map_err(|e| Error::Launch(format!("binding the rendezvous socket on {}: {e}", self.bind)))?;
        let addr = listener.local_addr().map_err(|e| Error::Launch(format!("rendezvous address: {e}")))?;
        let job = new_job_id();
        let (tx, rx) = mpsc::channel();
        let np = self.np;
        std::thread::spawn(move || serve(&listener, np));
        let signals =
            signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP])
                .map_err(|e| Error::Launch(format!("installing signal handlers: {e}")))?;
        let sig_handle = signals.handle();
        {
            let tx = tx.clone();
            let mut signals = signals;
            std::thread::spawn(move || {
                for s in signals.forever() {
                    if tx.send(Event::Signal(s)).is_err() {
                        break;
                    }
                }
            });
        }
        let mut pids = Vec::new();
        let mut forwarders = Vec::new();
        let captured: Option<Captured> = self.capture.then(Captured::default);
        let mut spawn_err = None;
        for rank in 0..self.np {
            match self.spawn(rank, &job, &addr.to_string()) {
                Ok(mut child) => {
                    pids.push(Some(child.id()));
                    if let Some(out) = child.stdout.take() {
                        forwarders.push(forward(out, rank, false, captured.clone()));
                    }
                    if let Some(err) = child.stderr.take() {
                        forwarders.push(forward(err, rank, true, captured.clone()));
                    }
                    let tx = tx.clone();
                    std::thread::spawn(move || {
                        if let Ok(st) = child.wait() {
                            let _ = tx.send(Event::Exit(rank, st));
                        }
                    });
                }
                Err(e) => {
                    spawn_err = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let started = Instant::now();
        let mut running = pids.iter().filter(|p| p.is_some()).count();
        let mut first_failure: Option<(u32, i32)> = None;
        let mut kill_at: Option<Instant> = spawn_err.as_ref().map(|_| Instant::now());
        let mut timed_out = false;
        let mut signalled = None;
        while running > 0 {
            let now = Instant::now();
            if let Some(t) = self.timeout {
                if !timed_out && now >= started + t {
                    timed_out = true;
                    eprintln!("fmxrun: job timed out after {t:?}; killing every rank");
                    kill_all(&pids, rustix::process::Signal::KILL);
                }
            }
            if kill_at.is_some_and(|k| now >= k) {
                kill_all(&pids, rustix::process::Signal::KILL);
                kill_at = None;
            }
            let mut wake = now + Duration::from_millis(200);
            if let Some(k) = kill_at {
                wake = wake.min(k);
            }
            if let Some(t) = self.timeout {
                wake = wake.min(started + t);
            }
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Event::Exit(rank, st)) => {
                    running -= 1;
                    pids[rank as usize] = None;
                    let code = exit_code(st);
                    if code != 0 && first_failure.is_none() && !timed_out && signalled.is_none() {
                        first_failure = Some((rank, code));
                        if running > 0 {
                            eprintln!(
                                "fmxrun: rank {rank} exited with code {code}; the other ranks get {:?} to notice, then are killed",
                                self.kill_grace
                            );
                            kill_at = Some(Instant::now() + self.kill_grace);
                        }
                    }
                }
                Ok(Event::Signal(s)) => {
                    signalled = Some(s);
                    kill_all(&pids, rustix::process::Signal::TERM);
                    kill_at.get_or_insert(Instant::now() + self.kill_grace);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        sig_handle.close();
        for f in forwarders {
            let _ = f.join();
        }
        let files_removed = crate::select::cleanup_job(&job);
        if let Some(e) = spawn_err {
            return Err(e);
        }
        let code = if timed_out {
            124
        } else if let Some(s) = signalled {
            128 + s
        } else {
            first_failure.map_or(0, |(_, c)| c)
        };
        let lines = captured.map(|c| std::mem::take(&mut *c.lock().unwrap_or_else(std::sync::PoisonError::into_inner))).unwrap_or_default();
        Ok(Outcome { code, failed_rank: first_failure.map(|(r, _)| r), timed_out, job, files_removed, lines })
    }

    fn spawn(&self, rank: u32, job: &str, addr: &str) -> Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .env("FMX_RANK", rank.to_string())
            .env("FMX_SIZE", self.np.to_string())
            .env("FMX_LOCAL_RANK", rank.to_string())
            .env("FMX_LOCAL_SIZE", self.np.to_string())
            .env("FMX_JOB", job)
            .env(ENV_RENDEZVOUS, addr)
            .env(ENV_LAUNCHER_PID, std::process::id().to_string());
        if let Some(t) = &self.transport {
            cmd.env("FMX_TRANSPORT", t);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        if rank != 0 {
            cmd.stdin(Stdio::null());
        }
        // Each rank leads its own process group, so that killing a rank also
        // kills whatever it started (a shell's children would keep our pipes open).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        if self.label || self.capture {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        cmd.spawn().map_err(|e| Error::Launch(format!("starting rank {rank} ({}): {e}", self.program.to_string_lossy())))
    }
}

fn exit_code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

fn kill_all(pids: &[Option<u32>], sig: rustix::process::Signal) {
    for pid in pids.iter().flatten() {
        if let Some(p) = rustix::process::Pid::from_raw(*pid as i32) {
            let _ = rustix::process::kill_process_group(p, sig);
            let _ = rustix::process::kill_process(p, sig);
        }
    }
}

fn new_job_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{}x{nanos}", std::process::id())
}

fn forward(stream: impl std::io::Read + Send + 'static, rank: u32, is_err: bool, capture: Option<Captured>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if let Some(c) = &capture {
                        let text = String::from_utf8_lossy(&line).trim_end_matches('\n').to_owned();
                        c.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((rank, is_err, text));
                        continue;
                    }
                    let mut out = Vec::with_capacity(line.len() + 8);
                    out.extend_from_slice(format!("[{rank}] ").as_bytes());
                    out.extend_from_slice(&line);
                    if !out.ends_with(b"\n") {
                        out.push(b'\n');
                    }
                    let _ = if is_err { std::io::stderr().lock().write_all(&out) } else { std::io::stdout().lock().write_all(&out) };
                }
            }
        }
    })
}

/// Serves the bootstrap rounds in lock step; on any failure closes every
/// connection, so that ranks waiting in a round get an error instead of hanging.
fn serve(listener: &TcpListener, np: u32) {
    let mut conns: Vec<Option<TcpStream>> = (0..np).map(|_| None).collect();
    for _ in 0..np {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let _ = s.set_nodelay(true);
        let Ok((OP_HELLO, body)) = wire::read_frame(&mut s) else {
            return;
        };
        let Some(rank) = body.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))) else {
            return;
        };
        let size = body.get(4..8).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
        if rank >= np || size != Some(np) || conns[rank as usize].is_some() {
            return;
        }
        conns[rank as usize] = Some(s);
    }
    let mut conns: Vec<TcpStream> = conns.into_iter().flatten().collect();
    if conns.iter_mut().any(|c| wire::write_frame(c, OP_HELLO, &[]).is_err()) {
        return;
    }
    loop {
        let mut op = None;
        let mut blobs = Vec::with_capacity(np as usize);
        for c in &mut conns {
            match wire::read_frame(c) {
                Ok((o, body)) if op.is_none_or(|p| p == o) => {
                    op = Some(o);
                    blobs.push(body);
                }
                _ => return, // a rank died or disagreed: dropping `conns` closes them all
            }
        }
        let op = op.expect("np >= 1");
        let reply = match op {
            OP_ALLGATHER => wire::encode_blobs(&blobs),
            OP_BARRIER | OP_FINALIZE => Vec::new(),
            _ => return,
        };
        for c in &mut conns {
            let _ = wire::write_frame(c, op, &reply);
        }
        if op == OP_FINALIZE {
            return;
        }
    }
}

/// In a rank: die with the launcher (no orphans), and refuse to start if it is already gone.
pub(crate) fn watch_launcher() -> Result<()> {
    let Ok(pid) = std::env::var(ENV_LAUNCHER_PID) else {
        return Ok(());
    };
    let Ok(pid) = pid.parse::<i32>() else {
        return Err(Error::Bootstrap(format!("{ENV_LAUNCHER_PID}={pid:?} is not a pid")));
    };
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| Error::Bootstrap(format!("PR_SET_PDEATHSIG: {e}")))?;
    if rustix::process::getppid().map(rustix::process::Pid::as_raw_nonzero).map(i32::from) != Some(pid) {
        return Err(Error::Bootstrap(format!("the launcher (pid {pid}) is gone")));
    }
    Ok(())
}
