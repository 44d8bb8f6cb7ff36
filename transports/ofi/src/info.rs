//! What `fmx-info` shows of libfabric: the providers and domains that offer
//! what fmx needs, with and without RMA.

use crate::fabric::Info;

/// One line per provider and domain fmx could use, or why there is none.
pub fn describe() -> Result<Vec<String>, String> {
    let rma: Vec<(String, String)> = Info::query(None, None, true).map(|i| i.offers()).unwrap_or_default();
    let tagged = Info::query(None, None, false).map_err(|e| e.to_string())?.offers();
    Ok(tagged
        .into_iter()
        .map(|(p, d)| {
            let with_rma = rma.iter().any(|r| r.0 == p && r.1 == d);
            format!(
                "{p:<16} domain {d:<20} tagged, send-after-send order{}",
                if with_rma { ", RMA" } else { " (no RMA: FMX_OFI_RMA=0 path)" }
            )
        })
        .collect())
}
