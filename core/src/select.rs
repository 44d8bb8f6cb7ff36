//! Transport selection: the only module of the core that names concrete
//! transports. It maps the user's choice (and what the host has) to a
//! [`Transport`] value, an enum with a variant per transport, so the data path
//! dispatches statically (a `match`, no vtable per message).

#[cfg(feature = "ofi")]
use fmx_ofi::{OfiConfig, OfiEndpoint, OfiSetup};
use fmx_shm::{ShmConfig, ShmEndpoint, ShmSetup};
use fmx_transport::loopback::Loopback;
use fmx_transport::{
    Endpoint, MsgHeader, OpStatus, PeerId, PeerState, ReceiveMemory, RegistrationStats, RemoteKey, SendOutcome, TransportError,
};
#[cfg(feature = "verbs")]
use fmx_verbs::{VerbsConfig, VerbsEndpoint, VerbsSetup};

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// The transports this build knows, by the names `FMX_TRANSPORT` and
/// `fmxrun --transport` accept.
pub const TRANSPORT_NAMES: &[&str] = &[
    "auto",
    "shm",
    #[cfg(feature = "verbs")]
    "verbs",
    #[cfg(feature = "ofi")]
    "ofi",
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
    /// The engine's tests: a simulated fabric with a fault schedule.
    #[cfg(test)]
    Sim(Box<crate::engine::sim::SimEndpoint>),
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
            #[cfg(test)]
            Self::Sim(_) => "sim",
        }
    }
}

/// Opens the transport for this process, exchanging addresses through `boot`.
pub(crate) fn open(boot: &mut Bootstrap) -> Result<Transport> {
    let choice = boot.transport_hint().unwrap_or_else(|| "auto".into());
    if !TRANSPORT_NAMES.contains(&choice.as_str()) {
        return Err(Error::Bootstrap(format!("transport {choice:?} is not known to this build (known: {})", TRANSPORT_NAMES.join(", "))));
    }
    if boot.size() == 1 {
        return Ok(Transport::Loopback(Loopback::new()));
    }
    let nodes = boot.nodes();
    let spread = nodes.iter().any(|&n| n != nodes[0]);
    let choice = match NETWORK_TRANSPORTS.first() {
        Some(net) if choice == "auto" && spread => (*net).to_string(),
        _ => choice,
    };
    if spread && !NETWORK_TRANSPORTS.contains(&choice.as_str()) {
        let other = nodes.iter().position(|&n| n != nodes[0]).unwrap_or(0);
        return Err(Error::Bootstrap(format!(
            "the job spans {} nodes (rank 0 on node {}, rank {other} on node {}) but transport {choice:?} reaches only this host; \
             build fmx with the `verbs` or `ofi` feature and use FMX_TRANSPORT=verbs, ofi or auto",
            distinct(&nodes),
            nodes[0],
            nodes[other]
        )));
    }
    #[cfg(feature = "verbs")]
    if choice == "verbs" {
        let setup = VerbsSetup::create(VerbsConfig::from_env(boot.rank(), boot.size())?)?;
        let addresses = boot.allgather(&setup.address())?;
        let ep = setup.connect(&addresses)?;
        // Every queue pair is ready to receive before anyone sends.
        boot.barrier()?;
        return Ok(Transport::Verbs(Box::new(ep)));
    }
    #[cfg(feature = "ofi")]
    if choice == "ofi" {
        let cfg = OfiConfig { job: Some(boot.job_id()), ..OfiConfig::from_env(boot.rank(), boot.size())? };
        let setup = OfiSetup::create(cfg)?;
        let addresses = boot.allgather(&setup.address()?)?;
        let ep = setup.connect(&addresses)?;
        // Every address vector is filled and every receive slot posted before anyone sends.
        boot.barrier()?;
        return Ok(Transport::Ofi(Box::new(ep)));
    }
    // Every rank is on this host: shared memory.
    let cfg = ShmConfig::from_env(&boot.job_id(), boot.rank(), boot.size())?;
    let own_file = fmx_shm::segment_path(&cfg.dir, &cfg.job, cfg.rank);
    let setup = ShmSetup::create(cfg)?;
    let connected = (|| {
        let addresses = boot.allgather(&setup.address())?;
        let mut ep = setup.connect(&addresses)?;
        // Everyone has mapped everyone's segment: the files can go.
        boot.barrier()?;
        ep.unlink();
        Ok(Transport::Shm(ep))
    })();
    if connected.is_err() {
        // A launcher other than fmxrun will not sweep /dev/shm after us.
        let _ = std::fs::remove_file(&own_file);
    }
    connected
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
            #[cfg(test)]
            Transport::Sim($ep) => $e,
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
    fn poll<F>(&mut self, max: usize, sink: F) -> Result<usize, TransportError>
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]),
    {
        dispatch!(self, ep => ep.poll(max, sink))
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
