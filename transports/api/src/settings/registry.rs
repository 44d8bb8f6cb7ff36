//! Every `FMX_*` variable fmx reads, declared once: name, kind, default,
//! scope and what it does. Readers go through [`super::var`], which refuses
//! (in debug builds) a name that is not declared here; `fmx-info` prints the
//! settings in force from this table, and the README's settings table is
//! generated from it (a test fails when they differ).
//!
//! Naming: `FMX_<NAME>` holds for the whole job, `FMX_<TRANSPORT>_<NAME>`
//! for one transport, and where both exist the transport's wins for that
//! transport (`FMX_SHM_POOL_SLOTS` over `FMX_POOL_SLOTS` for shared memory).
//! Byte counts end in `_BYTES`, seconds in `_TIMEOUT`; switches take 0 or 1.

/// What a setting's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A whole number.
    Count,
    /// A number of bytes.
    Bytes,
    /// Seconds (fractions allowed where the reader says so).
    Seconds,
    /// 0 or 1.
    Switch,
    /// One word of a fixed set.
    Choice(&'static [&'static str]),
    /// Free text: a name, a path, a list.
    Text,
}

impl Kind {
    /// How the README and fmx-info name it.
    pub fn describe(self) -> String {
        match self {
            Kind::Count => "count".into(),
            Kind::Bytes => "bytes".into(),
            Kind::Seconds => "seconds".into(),
            Kind::Switch => "0 or 1".into(),
            Kind::Choice(c) => c.join(" \\| "),
            Kind::Text => "text".into(),
        }
    }
}

/// Who sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// The user, for the whole job.
    Job,
    /// The user, for the shared-memory transport.
    Shm,
    /// The user, for the verbs transport.
    Verbs,
    /// The user, for the libfabric transport.
    Ofi,
    /// The user, for fmx-perf's comparisons.
    Tools,
    /// fmxrun, for the ranks it starts (not a knob: shown for diagnosis).
    Launcher,
}

impl Scope {
    /// The heading of its group.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Job => "job",
            Scope::Shm => "shm",
            Scope::Verbs => "verbs",
            Scope::Ofi => "ofi",
            Scope::Tools => "fmx-perf",
            Scope::Launcher => "set by fmxrun",
        }
    }
}

/// One declared variable.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// Its name.
    pub name: &'static str,
    /// What its value is.
    pub kind: Kind,
    /// The value in force when it is unset, in words.
    pub default: &'static str,
    /// Who sets it.
    pub scope: Scope,
    /// What it does.
    pub doc: &'static str,
    /// Names it had before; still read, with a one-time warning.
    pub old_names: &'static [&'static str],
}

const fn s(name: &'static str, kind: Kind, default: &'static str, scope: Scope, doc: &'static str) -> Setting {
    Setting { name, kind, default, scope, doc, old_names: &[] }
}

const fn renamed(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    scope: Scope,
    doc: &'static str,
    old_names: &'static [&'static str],
) -> Setting {
    Setting { name, kind, default, scope, doc, old_names }
}

/// The table, grouped by scope.
pub const SETTINGS: &[Setting] = &[
    s("FMX_TRANSPORT", Kind::Choice(&["auto", "shm", "verbs", "ofi", "shm+verbs", "shm+ofi"]), "auto", Scope::Job,
      "Transport of the job: auto picks shm on one node and shm+verbs (else shm+ofi) across nodes"),
    s("FMX_CONNECT", Kind::Choice(&["lazy", "eager"]), "lazy", Scope::Job,
      "When network connections are made: lazy at the first message between two ranks, eager to every peer at init"),
    s("FMX_POOL_SLOTS", Kind::Count, "64", Scope::Job, "Eager receive slots per process, shared among its peers by FM's credits"),
    s("FMX_SLOT_BYTES", Kind::Bytes, "8192 (verbs, ofi)", Scope::Job, "Bytes per eager slot, header included: messages up to this size go eagerly"),
    s("FMX_CONNECTION_SLOTS", Kind::Count, "8", Scope::Job,
      "Connections made on demand: eager slots granted each new connection while FMX_POOL_SLOTS has room (beyond it, the newcomer credits)"),
    s("FMX_SPIN_POLLS", Kind::Count, "128 (2 with more ranks on the host than cores)", Scope::Job,
      "Empty polls a waiting call spins before it starts yielding the core between polls"),
    s("FMX_NEWCOMER_CREDITS", Kind::Count, "2", Scope::Job, "Credits a process grants a peer that has not yet spoken to it (FM's newcomer rule)"),
    s("FMX_CREDIT_THRESHOLD", Kind::Count, "half a peer's share", Scope::Job, "Consumed credits after which a receiver returns them explicitly"),
    s("FMX_CHECK", Kind::Choice(&["off", "none", "collectives"]), "off", Scope::Job, "collectives: check that every rank calls the same collective with matching arguments"),
    s("FMX_LOG", Kind::Text, "off", Scope::Job,
      "Log filter for fmx's events on stderr: info, debug, trace, or module=level,... (fmx, fmx_verbs, fmx_ofi)"),
    s("FMX_BOOT_TIMEOUT", Kind::Seconds, "120", Scope::Job, "Seconds a start-up round under fmxrun may take"),
    s("FMX_PMI", Kind::Choice(&["auto", "1", "2"]), "auto", Scope::Job, "PMI version under a PMI process manager (1: Hydra, 2: Slurm)"),
    s("FMX_PMI_TIMEOUT", Kind::Seconds, "120", Scope::Job, "Seconds one PMI request may wait for its answer"),
    s("FMX_BRIDGE_ADDR", Kind::Text, "127.0.0.1", Scope::Job,
      "Under Hydra: where a world's rank 0 serves the bridge to a world it spawns: an IP address of its host, or hostname (what the host's name resolves to)"),
    s("FMX_PMI_HIERARCHY", Kind::Choice(&["auto", "on", "off"]), "auto (on from 64 ranks with 4 per node)", Scope::Job,
      "Exchange addresses through one leader per node"),
    s("FMX_MALLEABLE_MODE", Kind::Choice(&["intercomm", "checkpoint"]), "intercomm", Scope::Job,
      "How a reconfiguration moves data: over an intercommunicator, or through checkpoint files"),
    s("FMX_CHECKPOINT_DIR", Kind::Text, "none", Scope::Job, "Directory of the checkpoint files (FMX_MALLEABLE_MODE=checkpoint)"),
    s("FMX_SHM_POOL_SLOTS", Kind::Count, "64", Scope::Shm, "Eager slots per process on shared memory (over FMX_POOL_SLOTS)"),
    s("FMX_SHM_SLOT_BYTES", Kind::Bytes, "16384", Scope::Shm, "Bytes per shared-memory slot (over FMX_SLOT_BYTES)"),
    s("FMX_SHM_CMA", Kind::Switch, "1", Scope::Shm, "0: never use cross-memory attach; large messages go in two copies through the segments"),
    s("FMX_SHM_DIR", Kind::Text, "/dev/shm", Scope::Shm, "Directory of the shared-memory segment files"),
    s("FMX_VERBS_DEVICE", Kind::Text, "the first device with an active port", Scope::Verbs,
      "RDMA device, or a comma-separated list taken by rank (rank r uses entry r mod length)"),
    s("FMX_VERBS_PORT", Kind::Count, "the first active port", Scope::Verbs, "Port of the device"),
    s("FMX_VERBS_GID_INDEX", Kind::Count, "an IPv4-mapped RoCE v2 GID, else the first valid", Scope::Verbs, "GID table index (RoCE)"),
    s("FMX_VERBS_SRQ", Kind::Switch, "1", Scope::Verbs, "0: one receive queue per queue pair instead of a shared receive queue"),
    renamed("FMX_VERBS_INLINE_BYTES", Kind::Bytes, "256", Scope::Verbs, "Largest send posted inline", &["FMX_VERBS_INLINE"]),
    renamed("FMX_VERBS_BOUNCE_BYTES", Kind::Bytes, "65536", Scope::Verbs,
      "Largest unregistered buffer copied through a bounce buffer rather than registered per operation", &["FMX_VERBS_BOUNCE_MAX"]),
    renamed("FMX_VERBS_ACK_TIMEOUT_EXP", Kind::Count, "14 (67 ms)", Scope::Verbs,
      "Local ACK timeout of a queue pair: 4.096 us x 2^value (0 to 31)", &["FMX_VERBS_TIMEOUT"]),
    renamed("FMX_VERBS_RETRY_COUNT", Kind::Count, "6", Scope::Verbs, "Transport retries before a queue pair fails (0 to 7)", &["FMX_VERBS_RETRY"]),
    s("FMX_VERBS_DEBUG", Kind::Switch, "unset", Scope::Verbs, "Replaced by FMX_LOG=fmx_verbs=debug (still works, with a warning)"),
    s("FMX_OFI_PROVIDER", Kind::Text, "libfabric's first RDM provider", Scope::Ofi, "libfabric provider (tcp;ofi_rxm, shm, verbs;ofi_rxm, efa, ...)"),
    s("FMX_OFI_DOMAIN", Kind::Text, "the provider's first", Scope::Ofi, "libfabric domain, or a comma-separated list taken by rank"),
    renamed("FMX_OFI_PIECE_BYTES", Kind::Bytes, "4194304", Scope::Ofi, "Largest piece of a one-sided operation (at least 4096)", &["FMX_OFI_PIECE"]),
    s("FMX_OFI_RMA", Kind::Switch, "1", Scope::Ofi, "0: large messages by two-sided pieces instead of RDMA reads"),
    s("FMX_OFI_CTRL_SLOTS", Kind::Count, "4 per peer + 64", Scope::Ofi, "Receive slots for control messages when FMX_OFI_RMA=0"),
    s("FMX_OFI_PEER_TIMEOUT", Kind::Seconds, "5", Scope::Ofi, "Seconds without progress after which an unreachable peer is an error"),
    s("FMX_OFI_DEBUG", Kind::Switch, "unset", Scope::Ofi, "Replaced by FMX_LOG=fmx_ofi=debug (still works, with a warning)"),
    s("FMX_MPICH_CC", Kind::Text, "mpicc.mpich", Scope::Tools, "MPICH's compiler for fmx-perf's peers"),
    s("FMX_MPICH_RUN", Kind::Text, "mpiexec.hydra", Scope::Tools, "MPICH's launcher for fmx-perf's peers"),
    s("FMX_OPENMPI_CC", Kind::Text, "mpicc.openmpi", Scope::Tools, "Open MPI's compiler for fmx-perf's peers"),
    s("FMX_OPENMPI_RUN", Kind::Text, "mpirun.openmpi", Scope::Tools, "Open MPI's launcher for fmx-perf's peers"),
    s("FMX_PEER_SRC", Kind::Text, "the copies inside fmx-perf", Scope::Tools, "Directory of the peers' C sources"),
    s("FMX_PERF_PROGRESS", Kind::Text, "unset", Scope::Tools,
      "tty (set by fmx-perf for its rank 0 when its stderr is a terminal): draw the progress line on /dev/tty after 3 s; tty:SECS after SECS"),
    s("FMX_RENDEZVOUS", Kind::Text, "unset", Scope::Launcher, "fmxrun's bootstrap address (its presence means: started by fmxrun)"),
    s("FMX_RANK", Kind::Count, "unset", Scope::Launcher, "This rank"),
    s("FMX_SIZE", Kind::Count, "unset", Scope::Launcher, "Ranks in the world"),
    s("FMX_LOCAL_RANK", Kind::Count, "unset", Scope::Launcher, "This rank's index on its node"),
    s("FMX_LOCAL_SIZE", Kind::Count, "unset", Scope::Launcher, "Ranks on this node"),
    s("FMX_JOB", Kind::Text, "unset", Scope::Launcher, "The job's id (names its shared-memory files)"),
    s("FMX_LAUNCHER_PID", Kind::Count, "unset", Scope::Launcher, "fmxrun's pid: ranks end when it does"),
    s("FMX_RECONFIG_REQUEST", Kind::Text, "unset", Scope::Launcher, "File a reconfiguration request is read from"),
    s("FMX_RECONFIG_COUNT", Kind::Count, "0", Scope::Launcher, "Reconfigurations so far"),
    s("FMX_PARENT_SIZE", Kind::Count, "unset", Scope::Launcher, "Ranks of the world that spawned this one"),
    s("FMX_SPAWN_VALUES", Kind::Text, "unset", Scope::Launcher, "What a spawning world passed to the new one"),
    s("FMX_BRIDGE_RENDEZVOUS", Kind::Text, "unset", Scope::Launcher, "Bootstrap address of the bridge to the spawning world"),
    s("FMX_BRIDGE_JOB", Kind::Text, "unset", Scope::Launcher, "Job id of the bridge to the spawning world"),
    s("FMX_PMIX_PARENT_VALUES", Kind::Text, "unset", Scope::Launcher, "What a world spawned through PMIx_Spawn gets from its parent (NAME=value lines)"),
];

/// The declared setting called `name` (its current name).
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// The README's settings table: one row per setting a user sets.
pub fn markdown_table() -> String {
    let mut t = String::from("| variable | scope | value | default | what it does |\n|---|---|---|---|---|\n");
    for s in SETTINGS.iter().filter(|s| s.scope != Scope::Launcher) {
        let old = if s.old_names.is_empty() { String::new() } else { format!(" (was `{}`)", s.old_names.join("`, `")) };
        t.push_str(&format!("| `{}`{old} | {} | {} | {} | {} |\n", s.name, s.scope.name(), s.kind.describe(), s.default, s.doc));
    }
    t
}
