//! `FMX_LOG`: fmx's events (connection setup, rendezvous, credit stalls,
//! peer failures, transport completions) go through the `tracing` facade.
//! At init, if `FMX_LOG` is set, fmx installs a stderr subscriber with that
//! filter (`info`, `debug`, `trace`, or per module: `fmx=info,fmx_verbs=debug`),
//! unless the program installed its own, which then receives the events.
//! The old switches `FMX_VERBS_DEBUG` and `FMX_OFI_DEBUG` still work: they
//! add `fmx_verbs=debug` / `fmx_ofi=debug`, and say once that FMX_LOG replaces them.

use tracing_subscriber::EnvFilter;

/// The filter the environment asks for, if any.
pub(crate) fn filter_from_env() -> Option<String> {
    let mut parts: Vec<String> = fmx_transport::settings::var("FMX_LOG").into_iter().collect();
    for (old, module) in [("FMX_VERBS_DEBUG", "fmx_verbs"), ("FMX_OFI_DEBUG", "fmx_ofi")] {
        if fmx_transport::settings::is_set(old) {
            eprintln!("fmx: {old} is replaced by FMX_LOG; it still works, as FMX_LOG={module}=debug");
            parts.push(format!("{module}=debug"));
        }
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Installs the stderr subscriber `FMX_LOG` asks for (once per process; a
/// subscriber the program set first wins). A bad filter is an error naming it.
pub(crate) fn init() -> crate::Result<()> {
    let Some(spec) = filter_from_env() else { return Ok(()) };
    let filter = EnvFilter::builder().parse(&spec).map_err(|e| crate::Error::InvalidCount {
        what: "FMX_LOG",
        detail: format!("{spec:?} is not a log filter ({e}); use info, debug, trace or module=level,..."),
    })?;
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).try_init();
    Ok(())
}

/// Logs the loss of `peer` (warn), once per peer and process: every
/// operation that meets the loss reports it to its caller too.
pub(crate) fn peer_lost(peer: u32, reason: &str, during: &str) {
    static LOGGED: std::sync::Mutex<std::collections::BTreeSet<u32>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    if LOGGED.lock().is_ok_and(|mut l| l.insert(peer)) {
        tracing::warn!(peer, "rank {peer} is gone ({reason}), first seen during {during}");
    }
}
