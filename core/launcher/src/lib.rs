//! # fmx-launcher: the local process manager behind `fmxrun`
//!
//! (and behind `fmx-perf` started alone, and the multi-process tests).
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
//!
//! It is also the process manager of malleable jobs: a world's spawn round
//! (`serve`) makes it start another world with its own rendezvous and a
//! bridge rendezvous both worlds join; the job ends when the last process of
//! the last world has exited. SIGUSR1/SIGUSR2 are relayed as reconfiguration
//! requests (`+1`/`-1`) into the file named by [`ENV_RECONFIG_REQUEST`].

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod serve;

use serve::{Failure, Group, SpawnAsk};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

use fmx::{Error, Result};
pub use fmx::{ENV_LAUNCHER_PID, ENV_RECONFIG_REQUEST, ENV_RENDEZVOUS};

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
    /// A failed rank does not end the job (`--keep-going`, as Open MPI's
    /// `--enable-recovery`): the others are neither told nor killed, learn of
    /// it from their own operations (ULFM semantics), and their finalize
    /// completes without it. The job's exit code is still the failure's.
    pub keep_going: bool,
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

/// Most ranks fmxrun starts in one world, and in all worlds of a job at once
/// (each rank costs fmxrun three threads and the host a process).
pub const MAX_RANKS: u32 = 4096;
/// Longest `--timeout` or `--kill-grace` accepted (about 31 years).
pub const MAX_SECONDS: f64 = 1e9;

pub(crate) enum Event {
    /// Process number (across every world) exited.
    Exit(usize, ExitStatus),
    Signal(i32),
    /// A world asks for another world.
    Spawn(SpawnAsk),
    /// A group found a failure that no exit code shows (see `serve`).
    Failed(Failure),
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
            keep_going: false,
        }
    }

    fn check(&self) -> Result<()> {
        if self.np == 0 {
            return Err(Error::Launch("the number of ranks must be at least 1".into()));
        }
        if self.np > MAX_RANKS {
            return Err(Error::Launch(format!("-n {}: fmxrun starts at most {MAX_RANKS} ranks on one host", self.np)));
        }
        if let Some(t) = &self.transport {
            if let Some(problem) = fmx::transport_problem(t) {
                return Err(Error::Launch(problem));
            }
        }
        for (what, d) in [("kill grace", Some(self.kill_grace)), ("timeout", self.timeout)] {
            if d.is_some_and(|d| d.as_secs_f64() > MAX_SECONDS) {
                return Err(Error::Launch(format!("{what} of {:?} is out of range (at most {MAX_SECONDS} s)", d.unwrap_or_default())));
            }
        }
        Ok(())
    }

    /// Runs the job to its end: the first world, and every world it (or a
    /// later one) spawns; the job ends when the last process has exited.
    ///
    /// The job's first failure (a rank that exits non-zero, is killed,
    /// panics, or leaves without finalizing while others wait for it) is
    /// sent to every rank at once as a notice, so that ranks blocked on live
    /// peers stop waiting with an error naming it; the others get
    /// `kill_grace` to report it, then are killed.
    pub fn run(&self) -> Result<Outcome> {
        self.check()?;
        let job = new_job_id();
        let (tx, rx) = mpsc::channel();
        let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2])
            .map_err(|e| Error::Launch(format!("installing signal handlers: {e}")))?;
        let sig_handle = signals.handle();
        {
            let tx = tx.clone();
            let mut signals = signals;
            spawn_thread("fmxrun-signals", move || {
                for s in signals.forever() {
                    if tx.send(Event::Signal(s)).is_err() {
                        break;
                    }
                }
            })?;
        }
        let request_file = std::env::temp_dir().join(format!("fmx-{job}.reconfig"));
        let mut st = JobState {
            guardian: Guardian::start(&request_file),
            request_file,
            job,
            procs: Vec::new(),
            jobs: Vec::new(),
            groups: Vec::new(),
            forwarders: Vec::new(),
            captured: self.capture.then(Captured::default),
            generation: 0,
            events: tx,
            failure: None,
        };
        let first = self.start_world(&mut st, self.np, &[]);
        let mut spawn_err = first.err();
        let started = Instant::now();
        let mut kill_at: Option<Instant> = spawn_err.as_ref().map(|_| Instant::now());
        let mut timed_out = false;
        let mut signalled = None;
        while st.running() > 0 {
            let now = Instant::now();
            let deadline = self.timeout.and_then(|t| started.checked_add(t));
            if deadline.is_some_and(|d| !timed_out && now >= d) {
                timed_out = true;
                eprintln!("fmxrun: job timed out after {:?}; killing every rank", self.timeout.unwrap_or_default());
                st.kill_all(rustix::process::Signal::KILL);
            }
            if kill_at.is_some_and(|k| now >= k) {
                st.kill_all(rustix::process::Signal::KILL);
                kill_at = None;
            }
            let mut wake = now + Duration::from_millis(200);
            for t in [kill_at, deadline].into_iter().flatten() {
                wake = wake.min(t);
            }
            let ending = timed_out || signalled.is_some();
            match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Event::Exit(idx, status)) => {
                    st.procs[idx].pid = None;
                    let code = exit_code(status);
                    let (g, rank) = (st.procs[idx].generation, st.procs[idx].rank);
                    st.procs[idx].code = Some(code);
                    for grp in &st.groups {
                        grp.exited(g, rank, code);
                    }
                    if code != 0 && !ending {
                        self.fail(&mut st, Failure { generation: g, rank, reason: describe_exit(status) }, &mut kill_at);
                    }
                }
                Ok(Event::Failed(f)) => {
                    if !ending {
                        self.fail(&mut st, f, &mut kill_at);
                    }
                }
                Ok(Event::Spawn(ask)) => {
                    let answer = if st.failure.is_some() || ending {
                        Err("spawn: the job is ending (a rank failed or fmxrun was signalled)".to_string())
                    } else {
                        self.spawn_world(&mut st, &ask).map_err(|e| e.to_string())
                    };
                    if let Err(e) = &answer {
                        eprintln!("fmxrun: {e}");
                    }
                    let _ = ask.reply.send(answer);
                }
                Ok(Event::Signal(s)) if s == SIGUSR1 || s == SIGUSR2 => {
                    // Relayed as a reconfiguration request: one rank more, or one fewer.
                    let req = if s == SIGUSR1 { "+1" } else { "-1" };
                    if let Err(e) = write_request(&st.request_file, req) {
                        eprintln!("fmxrun: relaying a reconfiguration request: {e}");
                    }
                }
                Ok(Event::Signal(s)) => {
                    signalled = Some(s);
                    st.kill_all(rustix::process::Signal::TERM);
                    kill_at.get_or_insert(Instant::now() + self.kill_grace);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        sig_handle.close();
        for g in &st.groups {
            g.close();
        }
        for f in st.forwarders.drain(..) {
            let _ = f.join();
        }
        let files_removed = st.jobs.iter().map(|j| fmx::cleanup_job(j)).sum();
        let _ = std::fs::remove_file(&st.request_file);
        drop(st.guardian.take()); // nothing left for it to remove
        if let Some(e) = spawn_err.take() {
            return Err(e);
        }
        let failed = st.failure.as_ref().map(|(f, _)| (f.generation, f.rank));
        let code = if timed_out {
            124
        } else if let Some(s) = signalled {
            128 + s
        } else if failed.is_some() {
            // The failed process's own code, else the first failing code, else 1
            // (a rank that exited 0 without finalizing failed the job all the same).
            let of_failed = st.procs.iter().find(|p| Some((p.generation, p.rank)) == failed).and_then(|p| p.code).filter(|&c| c != 0);
            of_failed.or_else(|| st.procs.iter().filter_map(|p| p.code).find(|&c| c != 0)).unwrap_or(1)
        } else {
            0
        };
        let lines =
            st.captured.map(|c| std::mem::take(&mut *c.lock().unwrap_or_else(std::sync::PoisonError::into_inner))).unwrap_or_default();
        Ok(Outcome { code, failed_rank: failed.map(|(_, r)| r), timed_out, job: st.job, files_removed, lines })
    }

    /// Records the job's first failure: every rank is told, the others get
    /// the kill grace before they are killed. Later failures are its
    /// consequences. With `keep_going` it is only recorded.
    fn fail(&self, st: &mut JobState, f: Failure, kill_at: &mut Option<Instant>) {
        if st.failure.is_some() {
            return;
        }
        let who = if f.generation == 0 { format!("rank {}", f.rank) } else { format!("rank {} of world {}", f.rank, f.generation) };
        if self.keep_going {
            eprintln!("fmxrun: {who} {}; --keep-going: the others go on", f.reason);
        } else {
            for g in &st.groups {
                g.notify(&f);
            }
            if st.running() > 0 {
                let grace = self.kill_grace;
                eprintln!("fmxrun: {who} {}; every rank is told, and the others get {grace:?} to end, then are killed", f.reason);
                *kill_at = Some(Instant::now() + grace);
            } else {
                eprintln!("fmxrun: {who} {}", f.reason);
            }
        }
        st.failure = Some((f, Instant::now()));
    }

    /// Starts a world of `np` ranks with its own rendezvous; `extra` is more environment.
    fn start_world(&self, st: &mut JobState, np: u32, extra: &[(String, String)]) -> Result<()> {
        let g = st.generation;
        let job = if g == 0 { st.job.clone() } else { format!("{}g{g}", st.job) };
        let addr = self.listen(st, (0..np).map(|r| (g, r)).collect())?;
        st.add_job(&job);
        for rank in 0..np {
            let mut child = self.start_rank(rank, np, &job, &addr, extra, &st.request_file)?;
            let idx = st.procs.len();
            st.procs.push(Proc { pid: Some(child.id()), generation: g, rank, code: None });
            let label = if g == 0 { format!("[{rank}] ") } else { format!("[{g}:{rank}] ") };
            if let Some(out) = child.stdout.take() {
                st.forwarders.push(forward(out, rank, label.clone(), false, st.captured.clone())?);
            }
            if let Some(err) = child.stderr.take() {
                st.forwarders.push(forward(err, rank, label, true, st.captured.clone())?);
            }
            let tx = st.events.clone();
            spawn_thread("fmxrun-wait", move || {
                if let Ok(status) = child.wait() {
                    let _ = tx.send(Event::Exit(idx, status));
                }
            })?;
        }
        Ok(())
    }

    /// A new world asked for by a running one: its processes, and (in
    /// intercommunicator mode) the bridge both worlds join.
    fn spawn_world(&self, st: &mut JobState, ask: &SpawnAsk) -> Result<Option<(String, String)>> {
        if ask.np == 0 {
            return Err(Error::Launch("spawn: the new world needs at least one rank (asked for 0)".into()));
        }
        let running = st.running() as u64;
        if running + u64::from(ask.np) > u64::from(MAX_RANKS) {
            return Err(Error::Launch(format!(
                "spawn: a world of {} ranks beside the {running} running would exceed fmxrun's limit of {MAX_RANKS} processes on one host",
                ask.np
            )));
        }
        let values = String::from_utf8(ask.values.clone())
            .ok()
            .filter(|v| !v.contains('\0'))
            .ok_or_else(|| Error::Launch("spawn: the values must be UTF-8 without NUL".into()))?;
        st.generation += 1;
        let g = st.generation;
        let mut extra = vec![
            ("FMX_RECONFIG_COUNT".to_string(), g.to_string()),
            ("FMX_PARENT_SIZE".to_string(), ask.parent_np.to_string()),
            ("FMX_SPAWN_VALUES".to_string(), values),
        ];
        let bridge = if ask.bridge {
            let job = format!("{}b{g}", st.job);
            // The asking world's ranks first, then the new world's.
            let members = (0..ask.parent_np).map(|r| (ask.parent_generation, r)).chain((0..ask.np).map(|r| (g, r))).collect();
            let addr = self.listen(st, members)?;
            st.add_job(&job);
            extra.push(("FMX_BRIDGE_RENDEZVOUS".into(), addr.clone()));
            extra.push(("FMX_BRIDGE_JOB".into(), job.clone()));
            Some((addr, job))
        } else {
            None
        };
        if let Err(e) = self.start_world(st, ask.np, &extra) {
            // Half a world would wait for its missing ranks until the bootstrap timeout.
            st.kill(rustix::process::Signal::KILL, |p| p.generation == g);
            return Err(e);
        }
        Ok(bridge)
    }

    /// A rendezvous server for a group of (generation, rank) members; its address.
    fn listen(&self, st: &mut JobState, members: Vec<(u32, u32)>) -> Result<String> {
        let listener =
            TcpListener::bind((self.bind, 0)).map_err(|e| Error::Launch(format!("binding the rendezvous socket on {}: {e}", self.bind)))?;
        let addr = listener.local_addr().map_err(|e| Error::Launch(format!("rendezvous address: {e}")))?;
        let group = Group::start(listener, members, self.keep_going, st.events.clone())
            .map_err(|e| Error::Launch(format!("starting the rendezvous server: {e}")))?;
        st.groups.push(group);
        Ok(addr.to_string())
    }

    fn start_rank(
        &self,
        rank: u32,
        np: u32,
        job: &str,
        addr: &str,
        extra: &[(String, String)],
        request_file: &std::path::Path,
    ) -> Result<Child> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .env("FMX_RANK", rank.to_string())
            .env("FMX_SIZE", np.to_string())
            .env("FMX_LOCAL_RANK", rank.to_string())
            .env("FMX_LOCAL_SIZE", np.to_string())
            .env("FMX_JOB", job)
            .env(ENV_RENDEZVOUS, addr)
            .env(ENV_LAUNCHER_PID, std::process::id().to_string())
            .env(ENV_RECONFIG_REQUEST, request_file);
        if let Some(t) = &self.transport {
            cmd.env("FMX_TRANSPORT", t);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in extra {
            cmd.env(k, v);
        }
        if rank != 0 || !extra.is_empty() {
            cmd.stdin(Stdio::null());
        }
        // Each rank leads its own process group, so that killing a rank also
        // kills whatever it started (a shell's children would keep our pipes open).
        cmd.process_group(0);
        if self.label || self.capture {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        cmd.spawn().map_err(|e| Error::Launch(format!("starting rank {rank} ({}): {e}", self.program.to_string_lossy())))
    }
}

/// Starts a named thread; running out of threads is an error, not a panic.
fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| Error::Launch(format!("starting a thread ({name}): {e} (too many ranks for this host?)")))
}

/// How a process ended, in words.
fn describe_exit(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => {
            let name = match s {
                6 => " (SIGABRT: an abort, or a panic with panic=abort)",
                7 => " (SIGBUS: a bus error, often a full /dev/shm)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                _ => "",
            };
            format!("was killed by signal {s}{name}")
        }
        (None, None) => "ended for an unknown reason".into(),
    }
}

/// A helper process that removes the job's files when fmxrun goes, however
/// it goes: it waits for the end of its input, which the kernel closes when
/// fmxrun exits, even by SIGKILL (fmxrun's own cleanup cannot run then).
/// fmxrun sends it a shell glob for every file it may have to remove, one per line.
struct Guardian(Child);

impl Guardian {
    const SCRIPT: &'static str = "set -f; globs=; while IFS= read -r g; do globs=\"$globs\n$g\"; done; set +f; IFS='\n'; \
                                  for f in $globs; do [ -e \"$f\" ] && rm -f -- \"$f\"; done";

    fn start(request_file: &std::path::Path) -> Option<Self> {
        let child = Command::new("/bin/sh")
            .args(["-c", Self::SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        let mut g = match child {
            Ok(c) => Self(c),
            Err(e) => {
                eprintln!("fmxrun: no cleanup helper ({e}): files of a killed fmxrun may stay behind");
                return None;
            }
        };
        // The request file, and the names take_request and write_request give it on the way.
        if let (Some(dir), Some(stem)) = (request_file.parent(), request_file.file_stem()) {
            g.watch(&format!("{}/{}.*", dir.display(), stem.to_string_lossy()));
        }
        Some(g)
    }

    /// Removes the files matching the shell glob `glob` when fmxrun goes.
    fn watch(&mut self, glob: &str) {
        if let Some(w) = self.0.stdin.as_mut() {
            let _ = writeln!(w, "{glob}");
        }
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        drop(self.0.stdin.take()); // end of input: it removes what is left, then exits
        let _ = self.0.wait();
    }
}

/// Writes a request atomically (a reader never sees half of it).
fn write_request(path: &std::path::Path, req: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("reconfig.tmp");
    std::fs::write(&tmp, req)?;
    std::fs::rename(&tmp, path)
}

/// One process of the job.
struct Proc {
    pid: Option<u32>,
    generation: u32,
    rank: u32,
    /// Its exit code once it exited (signals as 128+n).
    code: Option<i32>,
}

/// Everything a running job owns.
struct JobState {
    job: String,
    procs: Vec<Proc>,
    /// Every job id handed out (worlds and bridges): their files go at the end.
    jobs: Vec<String>,
    /// The rendezvous servers of every world and bridge.
    groups: Vec<std::sync::Arc<Group>>,
    forwarders: Vec<std::thread::JoinHandle<()>>,
    captured: Option<Captured>,
    generation: u32,
    events: mpsc::Sender<Event>,
    request_file: std::path::PathBuf,
    /// The job's first failure and when it happened.
    failure: Option<(Failure, Instant)>,
    guardian: Option<Guardian>,
}

impl JobState {
    fn running(&self) -> usize {
        self.procs.iter().filter(|p| p.pid.is_some()).count()
    }

    fn add_job(&mut self, job: &str) {
        self.jobs.push(job.to_owned());
        if let Some(g) = &mut self.guardian {
            for glob in fmx::job_file_globs(job) {
                g.watch(&glob);
            }
        }
    }

    fn kill_all(&self, sig: rustix::process::Signal) {
        self.kill(sig, |_| true);
    }

    fn kill(&self, sig: rustix::process::Signal, which: impl Fn(&Proc) -> bool) {
        for pid in self.procs.iter().filter(|p| which(p)).filter_map(|p| p.pid) {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process_group(p, sig);
                let _ = rustix::process::kill_process(p, sig);
            }
        }
    }
}

fn exit_code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

fn new_job_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{}x{nanos}", std::process::id())
}

fn forward(
    stream: impl std::io::Read + Send + 'static,
    rank: u32,
    label: String,
    is_err: bool,
    capture: Option<Captured>,
) -> Result<std::thread::JoinHandle<()>> {
    spawn_thread("fmxrun-output", move || {
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
                    out.extend_from_slice(label.as_bytes());
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
