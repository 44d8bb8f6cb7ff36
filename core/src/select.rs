//! Transport selection: the only module of the core that names concrete
//! transports. It maps the user's choice (and what the host has) to a
//! [`Transport`] value, an enum with a variant per transport, so the data path
//! dispatches statically (a `match`, no vtable per message).

#[cfg(feature = "ofi")]
use fmx_ofi::{OfiConfig, OfiEndpoint, OfiSetup};
use fmx_shm::{ShmConfig, ShmEndpoint, ShmSetup};
use fmx_transport::loopback::Loopback;
use fmx_transport::{
    Arrival, Connection, Endpoint, MsgHeader, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome,
    TransportError,
};
#[cfg(feature = "verbs")]
use fmx_verbs::{VerbsConfig, VerbsEndpoint, VerbsSetup};

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::mixed::{Mixed, Side};

/// The transports this build knows, by the names `FMX_TRANSPORT` and
/// `fmxrun --transport` accept.
pub const TRANSPORT_NAMES: &[&str] = &[
    "auto",
    "shm",
    #[cfg(feature = "verbs")]
    "verbs",
    #[cfg(feature = "ofi")]
    "ofi",
    #[cfg(feature = "verbs")]
    "shm+verbs",
    #[cfg(feature = "ofi")]
    "shm+ofi",
];

/// Transports that reach other hosts, in the order `auto` prefers them.
const NETWORK_TRANSPORTS: &[&str] = &[
    #[cfg(feature = "verbs")]
    "verbs",
    #[cfg(feature = "ofi")]
    "ofi",
];

/// A concrete endpoint.
pub(crate) enum Transport {
    /// A world of one.
    Loopback(Loopback),
    /// Processes on one host.
    Shm(ShmEndpoint),
    /// RDMA queue pairs (InfiniBand, RoCE, Soft-RoCE).
    #[cfg(feature = "verbs")]
    Verbs(Box<VerbsEndpoint>),
    /// libfabric RDM endpoints (tcp, shm, verbs;ofi_rxm, efa, ...).
    #[cfg(feature = "ofi")]
    Ofi(Box<OfiEndpoint>),
    /// Shared memory on this node, verbs to the other nodes.
    #[cfg(feature = "verbs")]
    ShmVerbs(Box<Mixed<ShmEndpoint, VerbsEndpoint>>),
    /// Shared memory on this node, libfabric to the other nodes.
    #[cfg(feature = "ofi")]
    ShmOfi(Box<Mixed<ShmEndpoint, OfiEndpoint>>),
    /// The engine's tests: a simulated fabric with a fault schedule.
    #[cfg(test)]
    Sim(Box<crate::engine::sim::SimEndpoint>),
    /// The engine's tests: two simulated fabrics, one per node and one between nodes.
    #[cfg(test)]
    SimMix(Box<Mixed<crate::engine::sim::SimEndpoint, crate::engine::sim::SimEndpoint>>),
}

impl Transport {
    /// Name for reports.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Loopback(_) => "loopback",
            Self::Shm(_) => "shm",
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => "verbs",
            #[cfg(feature = "ofi")]
            Self::Ofi(_) => "ofi",
            #[cfg(feature = "verbs")]
            Self::ShmVerbs(_) => "shm+verbs",
            #[cfg(feature = "ofi")]
            Self::ShmOfi(_) => "shm+ofi",
            #[cfg(test)]
            Self::Sim(_) => "sim",
            #[cfg(test)]
            Self::SimMix(_) => "sim+sim",
        }
    }

    /// The transport that carries messages to world rank `peer`: the
    /// transport's name, or for a mixed one the half that serves `peer`.
    pub(crate) fn name_of(&self, peer: u32) -> &'static str {
        #[cfg_attr(not(any(feature = "verbs", feature = "ofi", test)), allow(dead_code))]
        fn half<L: Endpoint, N: Endpoint>(m: &Mixed<L, N>, peer: u32, local: &'static str, net: &'static str) -> &'static str {
            match m.side(peer) {
                Ok(Side::Local(_)) => local,
                _ => net,
            }
        }
        match self {
            #[cfg(feature = "verbs")]
            Self::ShmVerbs(m) => half(m, peer, "shm", "verbs"),
            #[cfg(feature = "ofi")]
            Self::ShmOfi(m) => half(m, peer, "shm", "ofi"),
            #[cfg(test)]
            Self::SimMix(m) => half(m, peer, "sim-local", "sim-net"),
            _ => {
                let _ = peer;
                self.name()
            }
        }
    }

    /// Every connection this process holds, with the name of the transport
    /// that holds it (a mixed transport's network half connects to every
    /// rank of the job, those of this node too).
    pub(crate) fn connections_by_transport(&self) -> Vec<(&'static str, Connection)> {
        #[cfg_attr(not(any(feature = "verbs", feature = "ofi", test)), allow(dead_code))]
        fn halves<L: Endpoint, N: Endpoint>(m: &Mixed<L, N>, local: &'static str, net: &'static str) -> Vec<(&'static str, Connection)> {
            let [l, n] = m.connections_by_half();
            l.into_iter().map(|c| (local, c)).chain(n.into_iter().map(|c| (net, c))).collect()
        }
        match self {
            #[cfg(feature = "verbs")]
            Self::ShmVerbs(m) => halves(m, "shm", "verbs"),
            #[cfg(feature = "ofi")]
            Self::ShmOfi(m) => halves(m, "shm", "ofi"),
            #[cfg(test)]
            Self::SimMix(m) => halves(m, "sim-local", "sim-net"),
            _ => {
                let name = self.name();
                Endpoint::connections(self).into_iter().map(|c| (name, c)).collect()
            }
        }
    }
}

/// Opens the transport for this process, exchanging addresses through `boot`.
pub(crate) fn open(boot: &mut Bootstrap) -> Result<Transport> {
    let choice = boot.transport_hint().unwrap_or_else(|| "auto".into());
    if let Some(problem) = transport_problem(&choice) {
        return Err(Error::Bootstrap(problem));
    }
    // Read by the network transports only; a bad value is an error on every one.
    fmx_transport::settings::ConnectMode::from_env()?;
    if boot.size() == 1 {
        return Ok(Transport::Loopback(Loopback::new()));
    }
    let nodes = node_map(boot)?;
    boot.refine_nodes(nodes.clone());
    let spread = nodes.iter().any(|&n| n != nodes[0]);
    // auto: shared memory alone on one node; across nodes the first network
    // transport, with shared memory beside it where a node runs several ranks.
    let choice = match NETWORK_TRANSPORTS.first() {
        Some(net) if choice == "auto" && spread => {
            if distinct(&nodes) < nodes.len() {
                format!("shm+{net}")
            } else {
                (*net).to_string()
            }
        }
        _ => choice,
    };
    if spread && (choice == "shm" || choice == "auto") {
        let other = nodes.iter().position(|&n| n != nodes[0]).unwrap_or(0);
        // What would work: this build's network transports, or the features that add them.
        let fix = if NETWORK_TRANSPORTS.is_empty() {
            "build fmx with the `verbs` or `ofi` feature and use FMX_TRANSPORT=auto".to_string()
        } else {
            let nets: Vec<String> = NETWORK_TRANSPORTS.iter().flat_map(|n| [format!("shm+{n}"), (*n).to_string()]).collect();
            format!("use FMX_TRANSPORT=auto or one of {} (this build has them)", nets.join(", "))
        };
        return Err(Error::Bootstrap(format!(
            "the job spans {} nodes (rank 0 on node {}, rank {other} on node {}) but transport {choice:?} reaches only this host; {fix}",
            distinct(&nodes),
            nodes[0],
            nodes[other]
        )));
    }
    let rank = boot.rank();
    let node = nodes[rank as usize];
    // This node's ranks, in world order: the world of its shared-memory endpoint.
    let mine: Vec<u32> = (0..boot.size()).filter(|&r| nodes[r as usize] == node).collect();
    let job = boot.job_id();
    #[cfg(feature = "verbs")]
    if choice == "verbs" {
        return Ok(Transport::Verbs(open_verbs(boot)?));
    }
    #[cfg(feature = "verbs")]
    if choice == "shm+verbs" {
        let shm = open_shm(boot, &mine, &job)?;
        let net = open_verbs(boot)?;
        return Ok(Transport::ShmVerbs(Box::new(Mixed::new(shm, *net, &mine)?)));
    }
    #[cfg(feature = "ofi")]
    if choice == "ofi" {
        return Ok(Transport::Ofi(open_ofi(boot)?));
    }
    #[cfg(feature = "ofi")]
    if choice == "shm+ofi" {
        let shm = open_shm(boot, &mine, &job)?;
        let net = open_ofi(boot)?;
        return Ok(Transport::ShmOfi(Box::new(Mixed::new(shm, *net, &mine)?)));
    }
    let _ = mine;
    // Every rank is on this host: shared memory.
    let all: Vec<u32> = (0..boot.size()).collect();
    Ok(Transport::Shm(open_shm(boot, &all, &job)?))
}

/// Which ranks share a host. The launcher's node map, refined, where a
/// network transport is built, by every rank's host identity (boot id, PID
/// namespace, host name): fmxrun and a program's bootstrap see one host,
/// and ranks on other machines (or in other PID or UTS namespaces) are
/// other nodes. A map that differs between ranks is an error on every rank.
fn node_map(boot: &mut Bootstrap) -> Result<Vec<u32>> {
    let launcher = boot.nodes();
    // A program's own bootstrap computes the map on each rank: one that
    // disagrees would split the job into ranks choosing different transports
    // (and waiting for each other). Launchers hand every rank the same map.
    let check = boot.name() == "program";
    if NETWORK_TRANSPORTS.is_empty() && !check {
        return Ok(launcher);
    }
    let mut me = map_digest(&launcher).to_le_bytes().to_vec();
    if !NETWORK_TRANSPORTS.is_empty() {
        // Boot id and PID namespace (what pidfds and cross-memory attach need),
        // and the host name, which tells machines apart where containers share a kernel.
        me.extend_from_slice(&fmx_transport::liveness::host_identity());
        me.extend_from_slice(rustix::system::uname().nodename().to_bytes());
    }
    let ids = boot.allgather("node identities", &me)?;
    if let Some(other) = ids.iter().position(|id| id.get(..8) != Some(&me[..8])) {
        return Err(Error::Bootstrap(format!(
            "the node map disagrees between ranks: rank {} and rank {other} were given different maps (rank {}'s: {launcher:?}); \
             every rank must be given the same node for every rank",
            boot.rank(),
            boot.rank()
        )));
    }
    if NETWORK_TRANSPORTS.is_empty() {
        return Ok(launcher);
    }
    let mut seen: Vec<(u32, &[u8])> = Vec::new();
    Ok(launcher
        .iter()
        .zip(&ids)
        .map(|(&n, id)| match seen.iter().position(|&(m, i)| m == n && i == &id[8..]) {
            Some(k) => k as u32,
            None => {
                seen.push((n, &id[8..]));
                (seen.len() - 1) as u32
            }
        })
        .collect())
}

/// A digest of a node map (FNV-1a over its numbers), compared between ranks.
fn map_digest(nodes: &[u32]) -> u64 {
    nodes.iter().flat_map(|n| n.to_le_bytes()).fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// Shared memory among the world ranks `ranks` (ours among them), as a world
/// of their own: its files are named after `job`.
fn open_shm(boot: &mut Bootstrap, ranks: &[u32], job: &str) -> Result<ShmEndpoint> {
    let me = ranks.iter().position(|&r| r == boot.rank()).ok_or_else(|| Error::Bootstrap("this rank is not on its own node".into()))?;
    let cfg = ShmConfig { file_ids: ranks.to_vec(), ..ShmConfig::from_env(job, me as u32, ranks.len() as u32)? };
    let own_file = cfg.segment_file(cfg.rank);
    let setup = ShmSetup::create(cfg)?;
    let connected = (|| {
        let all = boot.allgather("shared-memory addresses", &setup.address())?;
        let addresses: Vec<Vec<u8>> = ranks.iter().map(|&r| all[r as usize].clone()).collect();
        let mut ep = setup.connect(&addresses)?;
        // Everyone has mapped everyone's segment: the files can go.
        boot.barrier()?;
        ep.unlink();
        Ok(ep)
    })();
    if connected.is_err() {
        // A launcher other than fmxrun will not sweep /dev/shm after us.
        let _ = std::fs::remove_file(&own_file);
    }
    connected
}

#[cfg(feature = "verbs")]
fn open_verbs(boot: &mut Bootstrap) -> Result<Box<VerbsEndpoint>> {
    let setup = VerbsSetup::create(VerbsConfig::from_env(boot.rank(), boot.size())?)?;
    let addresses = boot.allgather("verbs addresses", &setup.address())?;
    let ep = setup.connect(&addresses)?;
    // Every queue pair is ready to receive before anyone sends.
    boot.barrier()?;
    Ok(Box::new(ep))
}

#[cfg(feature = "ofi")]
fn open_ofi(boot: &mut Bootstrap) -> Result<Box<OfiEndpoint>> {
    let cfg = OfiConfig { job: Some(boot.job_id()), ..OfiConfig::from_env(boot.rank(), boot.size())? };
    let setup = OfiSetup::create(cfg)?;
    let addresses = boot.allgather("ofi addresses", &setup.address()?)?;
    let ep = setup.connect(&addresses)?;
    // Every address vector is filled and every receive slot posted before anyone sends.
    boot.barrier()?;
    Ok(Box::new(ep))
}

fn distinct(nodes: &[u32]) -> usize {
    let mut v = nodes.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// The directories a job's files may be in: fmx's shared-memory directory
/// (`FMX_SHM_DIR`) and POSIX shared memory's. The names follow
/// `fmx_transport::sweep`'s convention, whichever transports the ranks had.
fn job_file_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs = vec![fmx_shm::shm_dir()];
    let posix = std::path::PathBuf::from(fmx_transport::sweep::SHM_DIR);
    if !dirs.contains(&posix) {
        dirs.push(posix);
    }
    dirs
}

/// Shell globs for the files a job of the given id may leave.
pub fn job_file_globs(job: &str) -> Vec<String> {
    job_file_dirs().iter().map(|d| fmx_transport::sweep::job_files_glob(d, job)).collect()
}

/// Removes whatever files a job of the given id may have left (launchers call this).
pub fn cleanup_job(job: &str) -> usize {
    job_file_dirs().iter().map(|d| fmx_transport::sweep::remove_job_files(d, job)).sum()
}

macro_rules! dispatch {
    ($self:ident, $ep:ident => $e:expr) => {
        match $self {
            Transport::Loopback($ep) => $e,
            Transport::Shm($ep) => $e,
            #[cfg(feature = "verbs")]
            Transport::Verbs($ep) => $e,
            #[cfg(feature = "ofi")]
            Transport::Ofi($ep) => $e,
            #[cfg(feature = "verbs")]
            Transport::ShmVerbs($ep) => $e,
            #[cfg(feature = "ofi")]
            Transport::ShmOfi($ep) => $e,
            #[cfg(test)]
            Transport::Sim($ep) => $e,
            #[cfg(test)]
            Transport::SimMix($ep) => $e,
        }
    };
}

impl Endpoint for Transport {
    fn local_id(&self) -> PeerId {
        dispatch!(self, ep => ep.local_id())
    }
    fn num_peers(&self) -> u32 {
        dispatch!(self, ep => ep.num_peers())
    }
    fn max_eager(&self) -> usize {
        dispatch!(self, ep => ep.max_eager())
    }
    #[inline]
    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        dispatch!(self, ep => ep.try_send(peer, header, payload))
    }
    fn credit(&mut self, peer: PeerId) -> SendOutcome {
        dispatch!(self, ep => ep.credit(peer))
    }
    #[inline]
    fn arrivals(&mut self, max: usize, out: &mut Vec<Arrival>) -> Result<usize, TransportError> {
        dispatch!(self, ep => ep.arrivals(max, out))
    }
    #[inline]
    fn payload(&self, arrival: &Arrival) -> &[u8] {
        dispatch!(self, ep => ep.payload(arrival))
    }
    #[inline]
    fn release(&mut self, arrival: Arrival) -> Result<(), TransportError> {
        dispatch!(self, ep => ep.release(arrival))
    }
    #[allow(unsafe_code)]
    unsafe fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        dispatch!(self, ep => unsafe { ep.expose(buf) })
    }
    #[allow(unsafe_code)]
    unsafe fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        dispatch!(self, ep => unsafe { ep.expose_mut(buf) })
    }
    #[allow(unsafe_code)]
    unsafe fn expose_to(&mut self, peer: PeerId, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        dispatch!(self, ep => unsafe { ep.expose_to(peer, buf) })
    }
    #[allow(unsafe_code)]
    unsafe fn expose_mut_to(&mut self, peer: PeerId, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        dispatch!(self, ep => unsafe { ep.expose_mut_to(peer, buf) })
    }
    fn revoke(&mut self, key: &RemoteKey) {
        dispatch!(self, ep => ep.revoke(key));
    }
    #[allow(unsafe_code)]
    unsafe fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        dispatch!(self, ep => unsafe { ep.read(peer, remote, local) })
    }
    #[allow(unsafe_code)]
    unsafe fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        // SAFETY: the caller's promise (see the trait) is passed on unchanged.
        dispatch!(self, ep => unsafe { ep.write(peer, local, remote) })
    }
    fn abandon(&mut self, why: &str) -> bool {
        dispatch!(self, ep => ep.abandon(why))
    }
    fn large_message_path(&self) -> String {
        dispatch!(self, ep => ep.large_message_path())
    }
    fn poll_ops<F>(&mut self, done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        dispatch!(self, ep => ep.poll_ops(done))
    }
    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        dispatch!(self, ep => ep.peer_state(peer))
    }
    fn reallocate_credits(&mut self) -> Result<(), TransportError> {
        dispatch!(self, ep => ep.reallocate_credits())
    }
    fn receive_memory(&self) -> ReceiveMemory {
        dispatch!(self, ep => ep.receive_memory())
    }
    fn connections(&self) -> Vec<Connection> {
        dispatch!(self, ep => ep.connections())
    }
    fn connects_on_demand(&self, peer: PeerId) -> bool {
        dispatch!(self, ep => ep.connects_on_demand(peer))
    }
    fn preconnect(&mut self, peer: PeerId) -> Result<bool, TransportError> {
        dispatch!(self, ep => ep.preconnect(peer))
    }
    fn publish_receive_shares(&mut self, weights: &[u64]) -> Result<bool, TransportError> {
        dispatch!(self, ep => ep.publish_receive_shares(weights))
    }
    fn adopt_receive_shares(&mut self) {
        dispatch!(self, ep => ep.adopt_receive_shares());
    }
    fn settle_receive_shares(&mut self) -> bool {
        dispatch!(self, ep => ep.settle_receive_shares())
    }
    fn split_rendezvous(&self) -> bool {
        dispatch!(self, ep => ep.split_rendezvous())
    }
    fn split_rendezvous_to(&self, peer: PeerId) -> bool {
        dispatch!(self, ep => ep.split_rendezvous_to(peer))
    }
    fn register_owned(&mut self, region: &[u8]) -> Result<(), TransportError> {
        dispatch!(self, ep => ep.register_owned(region))
    }
    fn deregister_owned(&mut self, region: &[u8]) {
        dispatch!(self, ep => ep.deregister_owned(region));
    }
    fn registration_stats(&self) -> RegistrationStats {
        dispatch!(self, ep => ep.registration_stats())
    }
    fn finalize(&mut self) -> Result<(), TransportError> {
        dispatch!(self, ep => ep.finalize())
    }
}

/// Why transport `choice` cannot be used in this build, and what would add
/// it; `None` when it can.
pub fn transport_problem(choice: &str) -> Option<String> {
    if TRANSPORT_NAMES.contains(&choice) {
        return None;
    }
    let known = TRANSPORT_NAMES.join(", ");
    let feature = if choice.contains("verbs") {
        Some("verbs")
    } else if choice.contains("ofi") {
        Some("ofi")
    } else {
        None
    };
    Some(match feature {
        Some(f) if ["verbs", "ofi", "shm+verbs", "shm+ofi"].contains(&choice) => format!(
            "transport {choice:?} is not in this build (it has: {known}); rebuild with the cargo feature `{f}` \
             (cargo build --features fmx/{f}; it needs {})",
            if f == "verbs" { "libibverbs-dev" } else { "libfabric-dev" }
        ),
        _ => format!(
            "unknown transport {choice:?} (this build has: {known}; the cargo feature `verbs` adds verbs and shm+verbs, \
             `ofi` adds ofi and shm+ofi)"
        ),
    })
}

/// A transport fmx knows, as `fmx-info` shows it.
#[derive(Clone, Debug)]
pub struct TransportInfo {
    /// Its `FMX_TRANSPORT` name.
    pub name: &'static str,
    /// Whether this build carries it.
    pub built: bool,
    /// What adds it to a build that lacks it.
    pub how_to_build: &'static str,
    /// What it finds on this host (devices, providers), when built and it looks.
    pub found: Option<std::result::Result<Vec<String>, String>>,
}

/// The transports, whether this build has each, and what each finds here.
pub fn transport_report() -> Vec<TransportInfo> {
    let shm_dir = fmx_transport::settings::var("FMX_SHM_DIR").unwrap_or_else(|| fmx_shm::segment::DEFAULT_DIR.into());
    let shm = if std::path::Path::new(&shm_dir).is_dir() {
        Ok(vec![format!("segments in {shm_dir}")])
    } else {
        Err(format!("{shm_dir} is not a directory (set FMX_SHM_DIR to a tmpfs directory)"))
    };
    #[cfg(feature = "verbs")]
    let verbs = (true, Some(fmx_verbs::info::describe()));
    #[cfg(not(feature = "verbs"))]
    let verbs = (false, None);
    #[cfg(feature = "ofi")]
    let ofi = (
        true,
        Some(fmx_ofi::info::describe().map(|mut v| {
            v.insert(0, format!("libfabric {} (built against)", fmx_ofi::LIBFABRIC_VERSION));
            v
        })),
    );
    #[cfg(not(feature = "ofi"))]
    let ofi = (false, None);
    vec![
        TransportInfo { name: "shm", built: true, how_to_build: "always built", found: Some(shm) },
        TransportInfo {
            name: "verbs",
            built: verbs.0,
            how_to_build: "the cargo feature `verbs` (fmx/verbs; needs libibverbs-dev)",
            found: verbs.1,
        },
        TransportInfo { name: "ofi", built: ofi.0, how_to_build: "the cargo feature `ofi` (fmx/ofi; needs libfabric-dev)", found: ofi.1 },
    ]
}
