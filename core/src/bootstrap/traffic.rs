//! What this process exchanged through its launcher: one entry per
//! allgather, named by what it carried, with the bytes it gave and the bytes
//! it was given by the other ranks. `Fmx::bootstrap_exchanges` reports it,
//! and `fmx-perf scale-model --measure` checks the network addresses'
//! share against the model.

/// One allgather through the launcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapExchange {
    /// What it carried (`"node identities"`, `"verbs addresses"`, ...).
    pub what: &'static str,
    /// Bytes this rank put.
    pub bytes_put: usize,
    /// Bytes this rank read: every other rank's blob.
    pub bytes_read: usize,
}

impl BootstrapExchange {
    /// The entry for an allgather of `what` in which rank `me` put `blob` and got `all`.
    pub(crate) fn of(what: &'static str, me: u32, blob: &[u8], all: &[Vec<u8>]) -> Self {
        let others = all.iter().enumerate().filter(|&(r, _)| r != me as usize).map(|(_, b)| b.len()).sum();
        Self { what, bytes_put: blob.len(), bytes_read: others }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_counts_what_the_others_gave_not_our_own_blob() {
        let all = vec![vec![0u8; 3], vec![0u8; 5], vec![0u8; 7]];
        let e = BootstrapExchange::of("x", 1, &all[1], &all);
        assert_eq!(e, BootstrapExchange { what: "x", bytes_put: 5, bytes_read: 10 });
    }
}
