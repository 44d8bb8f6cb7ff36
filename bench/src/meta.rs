//! What a machine-readable report says about its run: versions, transport,
//! hosts, pinning, counts and the date.

use serde::Serialize;

use crate::params::Params;

/// Hostname bytes kept per rank (Linux's `HOST_NAME_MAX`).
const HOST_BYTES: usize = 64;

/// The metadata block of `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    /// Always "fmx-perf".
    pub tool: &'static str,
    /// fmx's crate version.
    pub fmx_version: &'static str,
    /// The commit fmx-perf was built from, or "unknown".
    pub git: &'static str,
    /// latency, bw or bibw.
    pub test: &'static str,
    /// The world's transport (`shm`, `verbs`, `shm+ofi`, ...).
    pub transport: &'static str,
    /// The transport between the measured pair.
    pub pair_transport: String,
    /// libfabric provider or verbs device asked for, when the transport has one.
    pub provider: Option<String>,
    /// How messages above the eager limit move.
    pub large_messages: String,
    /// Host of rank 0 and of rank 1.
    pub hosts: [String; 2],
    /// Ranks in the world.
    pub ranks: u32,
    /// The measured pair.
    pub pair: [u32; 2],
    /// The cores ranks 0 and 1 were pinned to (None: not pinned).
    pub pinned_cores: [Option<u32>; 2],
    /// Registered once, or plain vectors.
    pub buffers: &'static str,
    /// Iteration counts, in words (each result also carries its own).
    pub iterations: String,
    /// Messages in flight per iteration (bw, bibw).
    pub window: usize,
    /// The unit of `value`.
    pub unit: &'static str,
    /// When the run ended, UTC (RFC 3339).
    pub date: String,
}

/// This host's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".to_owned(), |h| h.trim().to_owned())
}

/// The provider or device the environment asks of the transport in use.
fn provider(transport: &str) -> Option<String> {
    let var = if transport.contains("ofi") {
        "FMX_OFI_PROVIDER"
    } else if transport.contains("verbs") {
        "FMX_VERBS_DEVICE"
    } else {
        return None;
    };
    Some(std::env::var(var).unwrap_or_else(|_| "default".to_owned()))
}

/// Gathers the pair's hosts and cores on rank 0 of `world`, the world split
/// so that the pair (world ranks `pair`) are its ranks 0 and 1 (collective).
pub fn gather(world: &fmx::Comm, p: &Params, core: Option<u32>, pair: (u32, u32)) -> Result<Option<Meta>, String> {
    let e2s = |e: fmx::Error| e.to_string();
    let mut mine = [0u8; HOST_BYTES + 4];
    let host = hostname();
    let n = host.len().min(HOST_BYTES);
    mine[..n].copy_from_slice(&host.as_bytes()[..n]);
    mine[HOST_BYTES..].copy_from_slice(&core.map_or(u32::MAX, |c| c).to_le_bytes());
    let size = world.size() as usize;
    let mut all = vec![0u8; if world.rank() == 0 { mine.len() * size } else { 0 }];
    world.gather(&mine, &mut all, 0).map_err(e2s)?;
    if world.rank() != 0 {
        return Ok(None);
    }
    let rec = |r: usize| {
        let b = &all[r * mine.len()..(r + 1) * mine.len()];
        let end = b[..HOST_BYTES].iter().position(|&c| c == 0).unwrap_or(HOST_BYTES);
        let core = u32::from_le_bytes(b[HOST_BYTES..].try_into().expect("4 bytes"));
        (String::from_utf8_lossy(&b[..end]).into_owned(), (core != u32::MAX).then_some(core))
    };
    let ((h0, c0), (h1, c1)) = (rec(0), rec(1));
    let transport = world.transport_name();
    Ok(Some(Meta {
        tool: "fmx-perf",
        fmx_version: env!("CARGO_PKG_VERSION"),
        git: env!("FMX_GIT_HASH"),
        test: p.test.name(),
        transport,
        pair_transport: world.transport_of(1).map_err(e2s)?.to_owned(),
        provider: provider(transport),
        large_messages: world.large_message_path(),
        hosts: [h0, h1],
        ranks: world.size(),
        pair: [pair.0, pair.1],
        pinned_cores: [c0, c1],
        buffers: if p.plain { "plain" } else { "registered" },
        iterations: p.loops_line(),
        window: p.window,
        unit: crate::report::unit(p),
        date: rfc3339_now(),
    }))
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `secs` since the epoch as RFC 3339 UTC (Howard Hinnant's civil_from_days).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339(1_796_330_096), "2026-12-03T20:34:56Z");
    }
}
