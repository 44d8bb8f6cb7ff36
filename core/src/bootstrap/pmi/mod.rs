//! PMI clients: the wire protocols that MPICH's Hydra (`mpiexec`, PMI-1) and
//! Slurm (`srun --mpi=pmi2`, PMI-2) speak over the socket they hand each
//! process as `PMI_FD`. No libpmi: both are small text protocols.
//!
//! What fmx uses: rank and size, the job's key-value space (put, fence,
//! get) to exchange endpoint addresses, `PMI_process_mapping` for which
//! rank runs on which node, and `spawn` to start a new world.

mod fd;
mod hierarchy;
mod mapping;
pub(crate) mod spawn_world;
mod wire;

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use wire::Msg;

use crate::error::{Error, Result};

/// Which protocol to speak: `1` (Hydra), `2` (Slurm); unset picks PMI-2 when
/// Slurm started us (`PMI_JOBID` or `SLURM_STEP_ID` set), else PMI-1.
pub const ENV_PMI: &str = "FMX_PMI";
/// Seconds one PMI request may wait for its answer (a fence waits for the
/// slowest rank): 120 unless set.
pub const ENV_PMI_TIMEOUT: &str = "FMX_PMI_TIMEOUT";

/// PMI-2 has no `get_maxes`; its specification fixes values at 1024 bytes.
const PMI2_VALUE_MAX: usize = 1024;
/// Room kept for the rest of a PMI-1 `put` line (command, kvsname, key):
/// old servers read lines of at most 1024 bytes.
const LINE_OVERHEAD: usize = 224;

/// The protocol version spoken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

impl Version {
    fn name(self) -> &'static str {
        match self {
            Self::V1 => "PMI-1",
            Self::V2 => "PMI-2",
        }
    }
}

/// What the environment told us before the first request.
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvHints {
    pub(crate) rank: Option<u32>,
    pub(crate) size: Option<u32>,
    /// Slurm's `PMI_JOBID`, which its `fullinit` requires.
    pub(crate) jobid: Option<String>,
    /// Started by Slurm (`SLURM_STEP_ID` set).
    pub(crate) slurm: bool,
    /// Set by Hydra in the processes it spawns (`PMI_SPAWNED=1`).
    pub(crate) spawned: bool,
}

/// A new world to start through the process manager.
#[derive(Clone, Debug)]
pub struct SpawnRequest {
    /// The program (a path the process manager can execute).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// How many processes.
    pub nprocs: u32,
    /// Key-value pairs the new world reads with `Fmx::parent_value`
    /// (values may not contain spaces, `;` or newlines).
    pub values: Vec<(String, String)>,
}

/// Sends PMI's abort on `conn` (see [`Client::abort`]).
fn abort_on(conn: &wire::Deadlined, version: Version, rank: u32, code: i32, why: &str) {
    // Neither form can carry a ';' or a newline inside a value.
    let why: String = why.chars().map(|c| if matches!(c, ';' | '\n' | '\r') { ',' } else { c }).collect();
    let bytes = match version {
        Version::V1 => Msg::new("abort").with("exitcode", code).to_v1().into_bytes(),
        Version::V2 => Msg::new("abort").with("isworld", "TRUE").with("msg", &why).to_v2(),
    };
    eprintln!("fmx: rank {rank} aborts the job (exit code {code}): {why}");
    let _ = conn.send_now(&bytes);
}

/// A connected PMI client.
pub(crate) struct Client {
    version: Version,
    conn: BufReader<wire::Deadlined>,
    timeout: Duration,
    pub(crate) rank: u32,
    pub(crate) size: u32,
    /// The key-value space name (PMI-1 kvsname, PMI-2 jobid): unique per job.
    pub(crate) job: String,
    /// Node index of every rank.
    pub(crate) nodes: Vec<u32>,
    pub(crate) spawned: bool,
    slurm: bool,
    /// Exchange addresses one value per node (see `hierarchy`).
    by_node: bool,
    value_max: usize,
    rounds: u32,
    /// While set (the finalize barrier), replies may take as long as the
    /// slowest rank's work: no deadline, but this is asked every second
    /// whether a peer died meanwhile.
    watch: Option<Watch>,
    /// The rendezvous this rank serves for bridges to worlds it spawned.
    hubs: Vec<std::thread::JoinHandle<()>>,
}

/// Answers the error to give up with when a peer is gone, else `None`.
pub(crate) type Watch = Box<dyn FnMut() -> Option<Error>>;

/// How often a patient wait asks its watch.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// A number of the environment: fmx's own through the settings registry, the PMI's as they are.
fn env_u32(name: &str) -> Result<Option<u32>> {
    let v = if name.starts_with("FMX_") { fmx_transport::settings::var(name) } else { std::env::var(name).ok() };
    match v {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| Error::Bootstrap(format!("{name}={v:?} is not a number"))),
    }
}

/// How long one request to the process manager may wait (`FMX_PMI_TIMEOUT`, PMIx's too).
pub(crate) fn timeout_from_env() -> Result<Duration> {
    match env_u32(ENV_PMI_TIMEOUT)? {
        Some(0) => Err(Error::Bootstrap(format!("{ENV_PMI_TIMEOUT}=0: the timeout must be at least 1 second"))),
        Some(s) => Ok(Duration::from_secs(s.into())),
        None => Ok(Duration::from_secs(120)),
    }
}

/// The version to speak, from `FMX_PMI` or the launcher's variables.
fn version_from_env() -> Result<Version> {
    match fmx_transport::settings::var(ENV_PMI).as_deref().map(str::trim) {
        Some("1") => Ok(Version::V1),
        Some("2") => Ok(Version::V2),
        Some("" | "auto") | None => {
            let slurm = std::env::var_os("PMI_JOBID").is_some() || std::env::var_os("SLURM_STEP_ID").is_some();
            Ok(if slurm { Version::V2 } else { Version::V1 })
        }
        Some(other) => Err(Error::Bootstrap(format!("{ENV_PMI}={other:?}: expected 1 (Hydra), 2 (Slurm) or auto"))),
    }
}

impl Client {
    pub(crate) fn version_name(&self) -> &'static str {
        self.version.name()
    }

    /// Connects through the inherited `PMI_FD`.
    pub(crate) fn connect_from_env() -> Result<Self> {
        let version = version_from_env()?;
        let stream = fd::inherited_socket("PMI_FD")?;
        let timeout = timeout_from_env()?;
        let hints = EnvHints {
            rank: env_u32("PMI_RANK")?,
            size: env_u32("PMI_SIZE")?,
            jobid: std::env::var("PMI_JOBID").ok(),
            slurm: std::env::var_os("SLURM_STEP_ID").is_some(),
            spawned: std::env::var("PMI_SPAWNED").is_ok_and(|v| v.trim() == "1"),
        };
        Self::connect(stream, version, timeout, &hints)
    }

    /// Runs the handshake on an already connected socket.
    pub(crate) fn connect(stream: UnixStream, version: Version, timeout: Duration, hints: &EnvHints) -> Result<Self> {
        let io = |source| Error::BootstrapIo { what: "setting the PMI socket's timeout".into(), source };
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let mut c = Self {
            version,
            conn: BufReader::new(wire::Deadlined::new(stream)),
            timeout,
            rank: 0,
            size: 0,
            job: String::new(),
            nodes: Vec::new(),
            spawned: hints.spawned,
            slurm: hints.slurm,
            by_node: false,
            value_max: PMI2_VALUE_MAX,
            rounds: 0,
            watch: None,
            hubs: Vec::new(),
        };
        c.handshake(hints)?;
        if c.size == 0 || c.rank >= c.size {
            return Err(Error::Bootstrap(format!("{}: rank {} is not below size {}", version.name(), c.rank, c.size)));
        }
        c.nodes = c.process_mapping()?;
        c.by_node = hierarchy::wanted(&c.nodes)?;
        Ok(c)
    }

    fn handshake(&mut self, hints: &EnvHints) -> Result<()> {
        let (v, sub) = match self.version {
            Version::V1 => (1, 1),
            Version::V2 => (2, 0),
        };
        // The version handshake is a PMI-1 line in both protocols.
        let init = Msg::new("init").with("pmi_version", v).with("pmi_subversion", sub);
        self.send_bytes(init.to_v1().as_bytes(), "init")?;
        let reply = self.read_reply(Version::V1, "init")?;
        self.check(&reply, "response_to_init", "init")?;
        if reply.get("pmi_version").is_some_and(|got| got != v.to_string()) {
            return Err(Error::Bootstrap(format!(
                "asked the process manager for PMI-{v} and it answered {reply:?}; set {ENV_PMI}=1 or 2 to pick the other"
            )));
        }
        match self.version {
            Version::V1 => {
                let missing = |n: &str| Error::Bootstrap(format!("{n} is not set (Hydra sets it with PMI_FD): cannot learn our rank"));
                self.rank = hints.rank.ok_or_else(|| missing("PMI_RANK"))?;
                self.size = hints.size.ok_or_else(|| missing("PMI_SIZE"))?;
                let maxes = self.call(&Msg::new("get_maxes"), "maxes")?;
                self.value_max = maxes.get("vallen_max").and_then(|v| v.parse().ok()).unwrap_or(256);
                let name = self.call(&Msg::new("get_my_kvsname"), "my_kvsname")?;
                self.job = Self::required(&name, "kvsname")?;
            }
            Version::V2 => {
                let mut req = Msg::new("fullinit");
                if let Some(j) = &hints.jobid {
                    req = req.with("pmijobid", j);
                }
                if let Some(r) = hints.rank {
                    req = req.with("pmirank", r);
                }
                // One thread talks to the manager at a time (Slurm requires the field).
                req = req.with("threaded", "FALSE");
                let init = self.call(&req, "fullinit-response")?;
                self.rank = Self::number(&init, "rank")?;
                self.size = Self::number(&init, "size")?;
                self.spawned |= init.get("spawner-jobid").is_some_and(|j| !j.is_empty() && j != "NULL");
                for (name, hint, got) in [("PMI_RANK", hints.rank, self.rank), ("PMI_SIZE", hints.size, self.size)] {
                    if let Some(h) = hint.filter(|&h| h != got) {
                        return Err(Error::Bootstrap(format!(
                            "mismatched sizes: {name}={h} but the process manager's fullinit says {}={got}",
                            if name == "PMI_RANK" { "rank" } else { "size" }
                        )));
                    }
                }
                let id = self.call(&Msg::new("job-getid"), "job-getid-response")?;
                self.job = Self::required(&id, "jobid")?;
            }
        }
        Ok(())
    }

    /// Where each rank runs, from the process manager's `PMI_process_mapping`;
    /// every rank on one node when the manager publishes none.
    fn process_mapping(&mut self) -> Result<Vec<u32>> {
        let value = match self.version {
            Version::V1 => self.lookup(None, "PMI_process_mapping")?,
            Version::V2 => {
                let r = self.call(&Msg::new("info-getjobattr").with("key", "PMI_process_mapping"), "info-getjobattr-response")?;
                r.get("value").filter(|_| r.get("found") == Some("TRUE")).map(str::to_string)
            }
        };
        match value {
            // Hydra 4.0 gives a spawned world the mapping of the slots it
            // fills, not of its ranks (a world of 1 on a host of 2 slots:
            // `(vector,(1,1,2))`): there the ranks take the first places.
            Some(text) if self.spawned => {
                mapping::parse_first(&text, self.size).map_err(|e| Error::Bootstrap(format!("mismatched sizes: {e}")))
            }
            Some(text) => mapping::parse(&text, self.size).map_err(|e| Error::Bootstrap(format!("mismatched sizes: {e}"))),
            None => Ok(vec![0; self.size as usize]),
        }
    }

    /// Everyone's blob, in rank order: each rank puts its own, one fence,
    /// then everyone reads everyone's (by node when `by_node`).
    pub(crate) fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        let round = self.rounds;
        self.rounds += 1;
        if self.by_node {
            return self.allgather_by_node(round, blob);
        }
        self.put_blob(&format!("fmx-{round}-{}", self.rank), blob)?;
        self.fence()?;
        (0..self.size).map(|r| self.get_blob(r, &format!("fmx-{round}-{r}"))).collect()
    }

    /// The node's leader gathers its node's blobs from files and puts them as
    /// one value; everyone gets one value per node.
    fn allgather_by_node(&mut self, round: u32, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        let node = self.nodes[self.rank as usize];
        let leader_of = |n: u32, nodes: &[u32]| nodes.iter().position(|&m| m == n).unwrap_or(0) as u32;
        if leader_of(node, &self.nodes) == self.rank {
            let others: Vec<u32> = (0..self.size).filter(|&r| r != self.rank && self.nodes[r as usize] == node).collect();
            let mut mine = vec![(self.rank, blob.to_vec())];
            mine.extend(hierarchy::collect(&self.job, round, &others, self.timeout, self.watch.as_mut())?);
            self.put_blob(&format!("fmx-{round}-n{node}"), &hierarchy::pack(&mine))?;
        } else {
            hierarchy::leave(&self.job, round, self.rank, blob)?;
        }
        self.fence()?;
        let mut distinct = self.nodes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut out: Vec<Option<Vec<u8>>> = vec![None; self.size as usize];
        for n in distinct {
            let leader = leader_of(n, &self.nodes);
            let packed = self.get_blob(leader, &format!("fmx-{round}-n{n}"))?;
            for (r, b) in hierarchy::unpack(&packed).ok_or_else(|| Self::malformed(leader, "node value"))? {
                if self.nodes.get(r as usize) != Some(&n) {
                    return Err(Error::Bootstrap(format!(
                        "node {n}'s PMI value carries rank {r}, which the process mapping puts elsewhere"
                    )));
                }
                out[r as usize] = Some(b);
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(r, b)| b.ok_or_else(|| Error::Bootstrap(format!("rank {r}'s address is missing from its node's PMI value"))))
            .collect()
    }

    /// Puts `blob` as hex under `prefix-0`, `prefix-1`, ... (as many keys as
    /// the value length needs; the first also says how many).
    fn put_blob(&mut self, prefix: &str, blob: &[u8]) -> Result<()> {
        let text = wire::hex(blob);
        let chunk = (self.value_max.min(1024).saturating_sub(LINE_OVERHEAD).max(64)) & !1;
        let pieces: Vec<&str> = if text.is_empty() {
            vec![""]
        } else {
            text.as_bytes().chunks(chunk).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect()
        };
        for (i, piece) in pieces.iter().enumerate() {
            // A value is never empty: the first starts with the count.
            let value = if i == 0 { format!("{}:{piece}", pieces.len()) } else { (*piece).to_string() };
            self.put(&format!("{prefix}-{i}"), &value)?;
        }
        Ok(())
    }

    /// Reads back what [`Client::put_blob`] wrote (`rank` put it).
    fn get_blob(&mut self, rank: u32, prefix: &str) -> Result<Vec<u8>> {
        let first = self.get(rank, &format!("{prefix}-0"))?;
        let (n, head) = first.split_once(':').ok_or_else(|| Self::malformed(rank, &first))?;
        let n: usize = n.parse().map_err(|_| Self::malformed(rank, &first))?;
        let mut text = head.to_string();
        for i in 1..n {
            text.push_str(&self.get(rank, &format!("{prefix}-{i}"))?);
        }
        wire::unhex(&text).ok_or_else(|| Self::malformed(rank, &text))
    }

    fn malformed(rank: u32, value: &str) -> Error {
        let shown: String = value.chars().take(40).collect();
        Error::Bootstrap(format!("rank {rank}'s address in the PMI key-value space is malformed ({shown:?}...)"))
    }

    fn put(&mut self, key: &str, value: &str) -> Result<()> {
        match self.version {
            Version::V1 => {
                let m = Msg::new("put").with("kvsname", self.job.clone()).with("key", key).with("value", value);
                self.call(&m, "put_result").map(drop)
            }
            Version::V2 => self.call(&Msg::new("kvs-put").with("key", key).with("value", value), "kvs-put-response").map(drop),
        }
    }

    fn get(&mut self, rank: u32, key: &str) -> Result<String> {
        self.lookup(Some(rank), key)?
            .ok_or_else(|| Error::Bootstrap(format!("key {key} of rank {rank} is missing from the PMI key-value space after the fence")))
    }

    /// A value the spawning world left for us (`SpawnRequest::values`).
    pub(crate) fn parent_value(&mut self, key: &str) -> Result<Option<String>> {
        self.lookup(None, key)
    }

    /// The value of `key` in our key-value space (`None` if absent); `put_by`
    /// is the rank that put it, a hint PMI-2 passes on.
    fn lookup(&mut self, put_by: Option<u32>, key: &str) -> Result<Option<String>> {
        match self.version {
            Version::V1 => {
                let r = self.request(&Msg::new("get").with("kvsname", self.job.clone()).with("key", key), "get_result")?;
                Ok(r.get("value").filter(|_| r.get("rc") == Some("0")).map(str::to_string))
            }
            Version::V2 => {
                let mut m = Msg::new("kvs-get").with("jobid", self.job.clone());
                if let Some(r) = put_by {
                    m = m.with("srcid", r);
                }
                let r = self.call(&m.with("key", key), "kvs-get-response")?;
                Ok(r.get("value").filter(|_| r.get("found") == Some("TRUE")).map(str::to_string))
            }
        }
    }

    /// Every rank has arrived. PMI-1's `barrier_in` is one; PMI-2's
    /// `kvs-fence` need not be (Hydra answers it at once and delays the
    /// gets that follow instead), so there every rank's key is read back.
    pub(crate) fn barrier(&mut self) -> Result<()> {
        match self.version {
            Version::V1 => self.fence(),
            Version::V2 => self.allgather(&[]).map(drop),
        }
    }

    /// Everyone's puts before it are visible to everyone's gets after it.
    fn fence(&mut self) -> Result<()> {
        match self.version {
            Version::V1 => self.call(&Msg::new("barrier_in"), "barrier_out").map(drop),
            Version::V2 => self.call(&Msg::new("kvs-fence"), "kvs-fence-response").map(drop),
        }
    }

    /// [`Pmi::finalize`] for ranks that finish at different times: its
    /// barrier waits for the slowest rank however long it works (MPI_Finalize
    /// does too), asking `watch` every second whether a peer died instead.
    pub(crate) fn finalize_watching(&mut self, watch: Watch) -> Result<()> {
        self.watch = Some(watch);
        let r = self.finalize();
        self.watch = None;
        r
    }

    /// A barrier, then the finalize handshake.
    pub(crate) fn finalize(&mut self) -> Result<()> {
        self.let_hubs_end();
        self.barrier()?;
        match self.version {
            Version::V1 => self.call(&Msg::new("finalize"), "finalize_ack").map(drop),
            Version::V2 => self.call(&Msg::new("finalize"), "finalize-response").map(drop),
        }
    }

    /// Asks the process manager to start a new world (one caller, not collective).
    pub(crate) fn spawn(&mut self, req: &SpawnRequest) -> Result<()> {
        self.refuse_spawn_under_slurm()?;
        let mut req = req.clone();
        if !req.values.iter().any(|(k, _)| k == spawn_world::KEY_LINEAGE) {
            // The new world is a program of its own, no world of fmx's (see KEY_LINEAGE).
            req.values.push((spawn_world::KEY_LINEAGE.to_string(), "-".to_string()));
        }
        let req = &req;
        for (k, v) in req.args.iter().map(|a| ("argument", a)).chain(req.values.iter().map(|(_, v)| ("value", v))) {
            if v.is_empty() || v.contains([' ', '\n', ';', '\t']) {
                return Err(Error::Launch(format!(
                    "spawn: {k} {v:?} is empty or holds a space, tab, ';' or newline (PMI cannot carry it)"
                )));
            }
        }
        match self.version {
            Version::V1 => {
                let mut m = Msg::new("spawn")
                    .with("nprocs", req.nprocs)
                    .with("execname", &req.program)
                    .with("totspawns", 1)
                    .with("spawnssofar", 1)
                    .with("argcnt", req.args.len());
                for (i, a) in req.args.iter().enumerate() {
                    m = m.with(&format!("arg{}", i + 1), a);
                }
                m = m.with("preput_num", req.values.len());
                for (i, (k, v)) in req.values.iter().enumerate() {
                    m = m.with(&format!("preput_key_{i}"), k).with(&format!("preput_val_{i}"), v);
                }
                m = m.with("info_num", 0);
                self.send_bytes(m.to_v1_multiline().as_bytes(), "spawn")?;
                let reply = self.read_reply(Version::V1, "spawn")?;
                self.check(&reply, "spawn_result", "spawn")
            }
            Version::V2 => {
                let mut m = Msg::new("spawn").with("ncmds", 1).with("preputcount", req.values.len());
                for (i, (k, v)) in req.values.iter().enumerate() {
                    m = m.with(&format!("ppkey{i}"), k).with(&format!("ppval{i}"), v);
                }
                m = m.with("subcmd", &req.program).with("maxprocs", req.nprocs).with("argc", req.args.len());
                for (i, a) in req.args.iter().enumerate() {
                    m = m.with(&format!("argv{i}"), a);
                }
                m = m.with("infokeycount", 0);
                self.call(&m, "spawn-response").map(drop)
            }
        }
    }

    fn refuse_spawn_under_slurm(&self) -> Result<()> {
        if self.slurm {
            // Tried with Slurm 22.05: srun runs the new world as a step of the
            // current allocation, and when the allocation has no free CPUs the
            // step fails by cancelling the whole job, not with an error reply.
            return Err(Error::Launch(
                "spawn is not supported under Slurm's PMI-2 (srun --mpi=pmi2): Slurm would start the new world as a step of this \
                 allocation and cancels the whole job when that step cannot start; launch with Hydra (mpiexec) to spawn"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Asks the process manager to end the whole job (`PMI_Abort`): Hydra kills
    /// every rank, on every node, and mpiexec exits with `code`. Without it a
    /// rank that fails leaves the job waiting on ranks that wait on it, or on
    /// a node that is gone. Best effort: no reply is read.
    pub(crate) fn abort(&self, code: i32, why: &str) {
        abort_on(self.conn.get_ref(), self.version, self.rank, code, why);
    }

    /// What aborts the job from another thread (the bridge's rendezvous,
    /// when a member fails): a second handle on the PMI connection.
    pub(crate) fn aborter(&self) -> std::io::Result<impl FnOnce(i32, &str) + Send + 'static> {
        let (conn, version, rank) = (self.conn.get_ref().try_clone()?, self.version, self.rank);
        Ok(move |code: i32, why: &str| abort_on(&conn, version, rank, code, why))
    }

    /// Sends a request and checks the reply's command and `rc`.
    fn call(&mut self, msg: &Msg, expect: &str) -> Result<Msg> {
        let what = msg.cmd.clone();
        let reply = self.request(msg, expect)?;
        self.check(&reply, expect, &what)?;
        Ok(reply)
    }

    /// Sends a request and reads its reply, checking only the command name.
    fn request(&mut self, msg: &Msg, expect: &str) -> Result<Msg> {
        let what = msg.cmd.clone();
        match self.version {
            Version::V1 => self.send_bytes(msg.to_v1().as_bytes(), &what)?,
            Version::V2 => self.send_bytes(&msg.to_v2(), &what)?,
        }
        let reply = self.read_reply(self.version, &what)?;
        if reply.cmd != expect {
            return Err(Error::Bootstrap(format!("the process manager answered {:?} to {what} (expected {expect})", reply.cmd)));
        }
        Ok(reply)
    }

    fn check(&self, reply: &Msg, expect: &str, what: &str) -> Result<()> {
        if reply.cmd != expect {
            return Err(Error::Bootstrap(format!("the process manager answered {:?} to {what} (expected {expect})", reply.cmd)));
        }
        match reply.get("rc") {
            None | Some("0") => Ok(()),
            Some(rc) => {
                let why = reply.get("msg").or_else(|| reply.get("errmsg")).unwrap_or("no message");
                Err(Error::Bootstrap(format!("{} {what} failed on the process manager: rc={rc} ({why})", self.version.name())))
            }
        }
    }

    fn required(reply: &Msg, key: &str) -> Result<String> {
        reply
            .get(key)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| Error::Bootstrap(format!("the process manager's {} carries no {key}", reply.cmd)))
    }

    fn number(reply: &Msg, key: &str) -> Result<u32> {
        let v = Self::required(reply, key)?;
        v.parse().map_err(|_| Error::Bootstrap(format!("the process manager's {} has {key}={v:?}, not a number", reply.cmd)))
    }

    fn send_bytes(&mut self, bytes: &[u8], what: &str) -> Result<()> {
        wire::send(self.conn.get_mut(), bytes).map_err(|e| self.io_error(e, what))
    }

    fn read_reply(&mut self, version: Version, what: &str) -> Result<Msg> {
        if self.watch.is_some() {
            self.await_reply(what)?;
        }
        // The whole reply within the timeout: a server that trickles bytes
        // cannot stretch it byte by byte.
        self.conn.get_mut().deadline = Some(std::time::Instant::now() + self.timeout);
        let r = match version {
            Version::V1 => wire::read_v1(&mut self.conn),
            Version::V2 => wire::read_v2(&mut self.conn),
        };
        r.map_err(|e| self.io_error(e, what))
    }

    /// Waits without a deadline for the first byte of a reply, asking the
    /// watch every second whether a peer died.
    fn await_reply(&mut self, what: &str) -> Result<()> {
        if !self.conn.buffer().is_empty() {
            return Ok(());
        }
        loop {
            match self.conn.get_ref().readable_within(WATCH_EVERY) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.io_error(e, what)),
            }
            if let Some(e) = self.watch.as_mut().and_then(|w| w()) {
                return Err(e);
            }
        }
    }

    fn io_error(&self, e: std::io::Error, what: &str) -> Error {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        if matches!(e.kind(), WouldBlock | TimedOut) {
            return Error::Bootstrap(format!(
                "no answer to {what} from the process manager within {:?} (a rank may have died or never started; {ENV_PMI_TIMEOUT} sets the limit in seconds)",
                self.timeout
            ));
        }
        Error::BootstrapIo { what: format!("{} {what} (rank {} of {})", self.version.name(), self.rank, self.size), source: e }
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

super::launcher::user_bootstrap_of_backend!(Client, nodes: |c| c.nodes.clone(), job_id: |c| super::launcher::job_id_from("pmi", &c.job));

impl super::launcher::Launcher for Client {
    fn name(&self) -> &'static str {
        self.version_name()
    }
    fn finalize(&mut self) -> Result<()> {
        Client::finalize(self)
    }
    fn finalize_watching(&mut self, watch: Watch) -> Result<()> {
        Client::finalize_watching(self, watch)
    }
    fn spawned(&self) -> bool {
        self.spawned
    }
    fn spawn(&mut self, req: &SpawnRequest) -> Result<()> {
        Client::spawn(self, req)
    }
    fn spawn_world(&mut self, np: u32, bridge: bool, values: &str, generation: u32) -> Result<Option<(String, String)>> {
        Client::spawn_world(self, np, bridge, values, generation)
    }
    fn abort(&self, code: i32, why: &str) {
        Client::abort(self, code, why);
    }
    fn parent_value(&mut self, key: &str) -> Result<Option<String>> {
        Client::parent_value(self, key)
    }
}
