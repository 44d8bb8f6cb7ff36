//! The collectives' checking mode, `FMX_CHECK=collectives` (off by default),
//! after MPE's collchk: before each collective, the ranks of the
//! communicator agree that they all entered the same one, with the same
//! root, count and element size, as the same call on this communicator.
//!
//! Cost: one allreduce of two words per collective (a hash and its
//! complement, reduced with `Min`: equal hashes everywhere iff
//! `min(h) == !min(!h)`); only when they differ, one allgather of every
//! rank's record, to say on every rank which ranks disagree and how.
//! Collectives called inside a collective (gather -> gatherv, split's
//! allreduce and allgather) are not checked again.

use std::cell::Cell;

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::Op;

/// The variable that turns it on (`collectives`), read once at init.
pub const ENV_CHECK: &str = "FMX_CHECK";

/// Whether `FMX_CHECK` asks for the checking mode (an unknown value is an error).
pub(crate) fn enabled_from_env() -> Result<bool> {
    match fmx_transport::settings::var(ENV_CHECK).as_deref() {
        None | Some("off" | "none") => Ok(false),
        Some("collectives") => Ok(true),
        Some(v) => Err(Error::InvalidCount { what: ENV_CHECK, detail: format!("{v:?} is not a checking mode (known: collectives, off)") }),
    }
}

/// One rank's view of a collective call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Call {
    op: &'static str,
    root: Option<u32>,
    count: u64,
    elem: u64,
    seq: u64,
}

const OPS: [&str; 13] = [
    "barrier",
    "bcast",
    "reduce",
    "allreduce",
    "gather",
    "gatherv",
    "scatter",
    "scatterv",
    "allgather",
    "allgatherv",
    "alltoall",
    "alltoallv",
    "unknown",
];

impl Call {
    fn words(&self) -> [u64; 5] {
        let op = OPS.iter().position(|o| *o == self.op).unwrap_or(OPS.len() - 1) as u64;
        [op, self.root.map_or(u64::MAX, u64::from), self.count, self.elem, self.seq]
    }

    fn from_words(w: &[u64]) -> Self {
        Self {
            op: OPS.get(w[0] as usize).copied().unwrap_or("unknown"),
            root: u32::try_from(w[1]).ok(),
            count: w[2],
            elem: w[3],
            seq: w[4],
        }
    }

    fn hash(&self) -> u64 {
        // FNV-1a over the words: equal records hash equal on every rank.
        self.words()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    }

    fn describe(&self) -> String {
        let root = self.root.map(|r| format!("root {r}, ")).unwrap_or_default();
        let count = if self.count == u64::MAX { "per-rank counts".to_string() } else { format!("{} elements", self.count) };
        format!("{} ({root}{count} of {} bytes, collective call #{} on this communicator)", self.op, self.elem, self.seq)
    }
}

/// Ends the collective on drop (collectives it calls are not checked again).
pub(crate) struct Entered<'a>(Option<&'a Cell<bool>>);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.set(false);
        }
    }
}

impl Comm {
    /// Enters a collective: in checking mode, agrees with every rank that
    /// they called the same one (`count` `u64::MAX`: not compared, for the
    /// v-variants whose counts differ by rank by design).
    pub(crate) fn enter(&self, op: &'static str, root: Option<u32>, count: u64, elem: usize) -> Result<Entered<'_>> {
        let sh = &self.sh;
        if !sh.check_colls || sh.in_coll.get() {
            return Ok(Entered(None));
        }
        let seq = self.coll_calls.get();
        self.coll_calls.set(seq + 1);
        sh.in_coll.set(true);
        let entered = Entered(Some(&sh.in_coll));
        let mine = Call { op, root, count, elem: elem as u64, seq };
        let h = mine.hash();
        let mut agreed = [0u64; 2];
        self.allreduce(&[h, !h], &mut agreed, Op::Min)?;
        if agreed[0] == !agreed[1] {
            return Ok(entered);
        }
        let mut all = vec![0u64; 5 * self.size() as usize];
        self.allgather(&mine.words(), &mut all)?;
        let calls: Vec<Call> = all.chunks(5).map(Call::from_words).collect();
        Err(Error::CollectiveMismatch { op, detail: report(&calls) })
    }
}

impl Comm {
    /// At init: every rank runs in the same mode (a rank checking while
    /// another does not would wait for agreement messages that never come).
    pub(crate) fn agree_on_checking(&self) -> Result<()> {
        let mine = [u8::from(self.sh.check_colls)];
        let mut all = vec![0u8; self.size() as usize];
        let was = self.sh.in_coll.replace(true);
        // With connections made on demand, through the launcher's bootstrap:
        // init then opens no connection at all (any collective would).
        let r = if (0..self.size()).any(|p| crate::join::on_demand(self, p)) {
            self.sh.boot.borrow_mut().allgather("FMX_CHECK agreement", &mine).map(|blobs| {
                for (a, b) in all.iter_mut().zip(&blobs) {
                    *a = b.first().copied().unwrap_or(u8::MAX);
                }
            })
        } else {
            self.allgather(&mine, &mut all)
        };
        self.sh.in_coll.set(was);
        r?;
        match all.iter().position(|&f| f != all[0]) {
            None => Ok(()),
            Some(r) => Err(Error::InvalidCount {
                what: ENV_CHECK,
                detail: format!(
                    "rank 0 runs {} checking and rank {r} {}: set {ENV_CHECK} alike on every rank",
                    if all[0] == 1 { "with" } else { "without" },
                    if all[r] == 1 { "with" } else { "without" }
                ),
            }),
        }
    }
}

/// Which ranks called what, grouped: "ranks 0, 2 called ...; rank 1 called ...".
fn report(calls: &[Call]) -> String {
    let mut groups: Vec<(Call, Vec<usize>)> = Vec::new();
    for (r, c) in calls.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| g == c) {
            Some((_, ranks)) => ranks.push(r),
            None => groups.push((*c, vec![r])),
        }
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(c, ranks)| {
            let who = ranks.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{noun} {who} called {}", c.describe())
        })
        .collect();
    format!("the ranks disagree (FMX_CHECK=collectives): {}", parts.join("; "))
}

/// A digest of a counts array that every rank must pass alike (allgatherv).
pub(crate) fn digest(counts: &[usize]) -> u64 {
    counts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3)) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_groups_ranks_and_says_what_differs() {
        let a = Call { op: "bcast", root: Some(0), count: 4, elem: 8, seq: 3 };
        let b = Call { root: Some(1), ..a };
        let r = report(&[a, b, a, b]);
        assert!(r.contains("ranks 0, 2 called bcast (root 0, 4 elements of 8 bytes, collective call #3"), "{r}");
        assert!(r.contains("ranks 1, 3 called bcast (root 1,"), "{r}");
        assert_eq!(Call::from_words(&a.words()), a);
        assert_ne!(a.hash(), b.hash());
        let c = Call { op: "barrier", root: None, count: 0, elem: 0, seq: 3 };
        assert!(report(&[a, c]).contains("rank 1 called barrier (0 elements"), "{}", report(&[a, c]));
    }
}
