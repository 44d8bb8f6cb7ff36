//! Hints to the graph constructors (`MPI_Info`). Every key fmx accepts is
//! listed in [`Info::KEYS`]; any other key is an error, so a misspelt hint
//! never goes silently unused.

use crate::error::{Error, Result};

/// Key-value hints; every process must pass the same set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    pairs: Vec<(String, String)>,
}

impl Info {
    /// The keys fmx accepts, with their values and meaning.
    pub const KEYS: &'static [(&'static str, &'static str)] = &[
        (
            "fmx_check_adjacent",
            "true (default) | false: dist_graph_create_adjacent proves that both ends of every edge declare it with the same \
             weights (one extra exchange); false skips the check",
        ),
        (
            "fmx_size_credits",
            "true (default) | false: when the graph spans every process, each process sizes senders' shares of its eager \
             pool by its in-edges (weights set the share; other senders keep a one-slot window) and gives the rest of \
             the pool back to the system",
        ),
        (
            "fmx_preconnect",
            "true | false (default): with connections made on demand (FMX_CONNECT=lazy), connect to every declared \
             neighbour while the graph is created, so the first exchange pays no set-up",
        ),
        (
            "fmx_reorder_group",
            "a positive number K: for reordering, ranks 0..K, K..2K, ... are one place each (say, the cores of a socket); \
             default: the hosts the launcher reports",
        ),
    ];

    /// No hints.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a hint.
    #[must_use]
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.pairs.retain(|(k, _)| k != key);
        self.pairs.push((key.into(), value.into()));
        self
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Checks every key and value; returns the adjacency check setting.
    pub(crate) fn check_adjacent(&self, op: &'static str) -> Result<bool> {
        for (k, v) in &self.pairs {
            match k.as_str() {
                "fmx_check_adjacent" | "fmx_size_credits" | "fmx_preconnect" if v == "true" || v == "false" => {}
                "fmx_reorder_group" if v.parse::<u32>().is_ok_and(|k| k > 0) => {}
                flag @ ("fmx_check_adjacent" | "fmx_size_credits" | "fmx_preconnect") => {
                    return Err(Error::InvalidGraph { op, detail: format!("info {flag}={v:?}: expected true or false") })
                }
                "fmx_reorder_group" => {
                    return Err(Error::InvalidGraph {
                        op,
                        detail: format!("info fmx_reorder_group={v:?}: expected a positive number of ranks"),
                    })
                }
                other => {
                    let known: Vec<&str> = Self::KEYS.iter().map(|k| k.0).collect();
                    return Err(Error::InvalidGraph {
                        op,
                        detail: format!("info key {other:?} is not known to fmx (known: {})", known.join(", ")),
                    });
                }
            }
        }
        Ok(self.get("fmx_check_adjacent") != Some("false"))
    }

    /// A digest every process must agree on (order of keys does not matter).
    pub(crate) fn digest(&self) -> u64 {
        let mut pairs = self.pairs.clone();
        pairs.sort();
        // FNV-1a over "k=v;" pairs: stable across processes and builds.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (k, v) in &pairs {
            for b in k.bytes().chain([b'=']).chain(v.bytes()).chain([b';']) {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::Info;

    #[test]
    fn unknown_keys_and_bad_values_are_errors_and_digest_ignores_order() {
        assert!(Info::new().check_adjacent("x").unwrap());
        assert!(!Info::new().set("fmx_check_adjacent", "false").check_adjacent("x").unwrap());
        let e = Info::new().set("reorder_quality", "high").check_adjacent("x").unwrap_err().to_string();
        assert!(e.contains("\"reorder_quality\" is not known") && e.contains("fmx_check_adjacent"), "{e}");
        assert!(Info::new().set("fmx_check_adjacent", "maybe").check_adjacent("x").is_err());
        let a = Info::new().set("a", "1").set("b", "2");
        let b = Info::new().set("b", "2").set("a", "1");
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), Info::new().digest());
    }
}
