//! Block distribution and its redistribution between two worlds (the DMR
//! guide's worked example): `block_range`, the pure overlap plan, and the
//! transfer over an intercommunicator.

use std::ops::Range;

use bytemuck::Pod;

use crate::coll::util::tag;
use crate::error::{Error, Result};
use crate::intercomm::{Intercomm, Side};

/// Largest piece one message carries (bytes): a block larger than this
/// travels as several messages, in order.
const PIECE_BYTES: u64 = 1 << 30;

/// The contiguous block of `n` elements that `rank` of `size` owns: the
/// first `n % size` ranks own one element more.
pub fn block_range(rank: u32, size: u32, n: u64) -> Range<u64> {
    assert!(rank < size, "block_range: rank {rank} is not below size {size}");
    let (base, rem) = (n / u64::from(size), n % u64::from(size));
    let r = u64::from(rank);
    let start = r * base + r.min(rem);
    start..start + base + u64::from(r < rem)
}

/// One slice of the redistribution: old rank `from` sends global elements
/// `range` to new rank `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Rank in the old world.
    pub from: u32,
    /// Rank in the new world.
    pub to: u32,
    /// Global element indices.
    pub range: Range<u64>,
}

/// Every non-empty overlap between an old block and a new block, ordered by
/// old rank, then new rank (the plan is the same on every process).
pub fn overlap_plan(old_size: u32, new_size: u32, global_n: u64) -> Vec<Transfer> {
    let mut plan = Vec::new();
    // Both block lists are sorted, so one merge-like walk finds every overlap.
    let (mut i, mut j) = (0, 0);
    while i < old_size && j < new_size {
        let (a, b) = (block_range(i, old_size, global_n), block_range(j, new_size, global_n));
        let range = a.start.max(b.start)..a.end.min(b.end);
        if range.start < range.end {
            plan.push(Transfer { from: i, to: j, range });
        }
        if a.end <= b.end {
            i += 1;
        } else {
            j += 1;
        }
    }
    plan
}

/// What old rank `from` sends.
pub fn sends_of(from: u32, old_size: u32, new_size: u32, global_n: u64) -> Vec<Transfer> {
    overlap_plan(old_size, new_size, global_n).into_iter().filter(|t| t.from == from).collect()
}

/// What new rank `to` receives.
pub fn receives_of(to: u32, old_size: u32, new_size: u32, global_n: u64) -> Vec<Transfer> {
    overlap_plan(old_size, new_size, global_n).into_iter().filter(|t| t.to == to).collect()
}

/// `rank`'s block of `global_n`, if `len` elements are what it should hold.
pub(crate) fn check_block(rank: u32, size: u32, len: usize, global_n: u64) -> Result<Range<u64>> {
    let r = block_range(rank, size, global_n);
    if len as u64 != r.end - r.start {
        return Err(Error::Reconfig(format!(
            "old rank {rank} of {size} holds {len} elements, but its block of {global_n} is {} elements ({}..{})",
            r.end - r.start,
            r.start,
            r.end
        )));
    }
    Ok(r)
}

/// Element pieces of at most [`PIECE_BYTES`] covering `0..len`.
fn pieces(len: usize, elem: usize) -> impl Iterator<Item = Range<usize>> {
    let step = (PIECE_BYTES as usize / elem.max(1)).max(1);
    (0..len).step_by(step).map(move |s| s..(s + step).min(len))
}

fn to_index(v: u64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::Reconfig(format!("{what} {v} does not fit this machine's address space")))
}

/// A zeroed block of `len` elements of a `global_n`-element array, or an
/// error naming both sizes when this machine cannot hold it (never an
/// allocation failure that aborts the process).
fn zeroed_block<T: Pod>(len: u64, global_n: u64) -> Result<Vec<T>> {
    let elem = std::mem::size_of::<T>() as u64;
    let too_big = |why: String| {
        Error::Reconfig(format!("a block of {len} elements of {elem} bytes (of a global size of {global_n}) cannot be held here: {why}"))
    };
    let bytes = len.checked_mul(elem).ok_or_else(|| too_big("its size in bytes overflows 64 bits".into()))?;
    let ram = rustix::system::sysinfo();
    let total = u64::from(ram.mem_unit).saturating_mul(ram.totalram as u64);
    if bytes > total {
        return Err(too_big(format!("{bytes} bytes exceed this machine's {total} bytes of memory")));
    }
    let n = to_index(len, "block length")?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| too_big(format!("allocating {bytes} bytes failed ({e})")))?;
    v.resize(n, T::zeroed());
    Ok(v)
}

/// Old side: sends this rank's block (of the old world's block distribution
/// of `global_n` elements) to the new ranks whose blocks overlap it, straight
/// from `local` (large pieces go by rendezvous, without a copy).
pub fn send_blocks<T: Pod>(ic: &Intercomm, local: &[T], global_n: u64) -> Result<()> {
    let (me, old, new) = (ic.rank(), ic.local_size(), ic.remote_size());
    let mine = check_block(me, old, local.len(), global_n)?;
    let plan = sends_of(me, old, new, global_n);
    let remote = ic.remote();
    remote
        .scope(|s| {
            let mut reqs = Vec::new();
            for t in &plan {
                let lo = to_index(t.range.start - mine.start, "offset")?;
                let slice = &local[lo..lo + to_index(t.range.end - t.range.start, "length")?];
                for p in pieces(slice.len(), std::mem::size_of::<T>()) {
                    reqs.push(s.isend_coll(&slice[p], t.to, tag::REDISTRIBUTE)?);
                }
            }
            s.wait_all(reqs).map(drop)
        })
        .map_err(Intercomm::name_remote)
}

/// New side: receives this rank's block (of the new world's block
/// distribution) from the old ranks whose blocks overlap it, straight into
/// the returned vector; every element must arrive, or it is an error.
pub fn recv_blocks<T: Pod>(ic: &Intercomm, global_n: u64) -> Result<Vec<T>> {
    let (me, new, old) = (ic.rank(), ic.local_size(), ic.remote_size());
    let mine = block_range(me, new, global_n);
    let mut out: Vec<T> = zeroed_block(mine.end - mine.start, global_n)?;
    let plan = receives_of(me, old, new, global_n);
    let remote = ic.remote();
    let statuses = remote
        .scope(|s| {
            let mut reqs = Vec::new();
            let mut expect = Vec::new();
            let mut rest = &mut out[..];
            for t in &plan {
                let len = to_index(t.range.end - t.range.start, "length")?;
                let (slice, tail) = rest.split_at_mut(len);
                rest = tail;
                for p in pieces(len, std::mem::size_of::<T>()) {
                    expect.push((t.from, p.len()));
                }
                let mut left = slice;
                for p in pieces(len, std::mem::size_of::<T>()) {
                    let (piece, tail) = left.split_at_mut(p.len());
                    left = tail;
                    reqs.push(s.irecv_coll(piece, t.from, tag::REDISTRIBUTE)?);
                }
            }
            Ok((s.wait_all(reqs)?, expect))
        })
        .map_err(Intercomm::name_remote)?;
    let (statuses, expect) = statuses;
    for (st, (from, len)) in statuses.iter().zip(expect) {
        if st.count != len {
            return Err(Error::Reconfig(format!(
                "new rank {me} expected {len} elements from old rank {from} but got {} (do both worlds pass global_n = {global_n} and the same element type?)",
                st.count
            )));
        }
    }
    Ok(out)
}

/// Moves a block-distributed array of `global_n` elements from the old world
/// to the new one over a reconfiguration's intercommunicator: the old side
/// passes its block and gets an empty vector back; the new side passes `&[]`
/// and gets its new block. An intercommunicator from `intercomm_create` has no
/// direction: use [`send_blocks`] and [`recv_blocks`] there.
pub fn redistribute_blocks<T: Pod>(ic: &Intercomm, local_block: &[T], global_n: u64) -> Result<Vec<T>> {
    match ic.side() {
        Some(Side::Old) => send_blocks(ic, local_block, global_n).map(|()| Vec::new()),
        Some(Side::New) if !local_block.is_empty() => Err(Error::Reconfig(format!(
            "redistribute_blocks: new rank {} passed {} elements; the new side receives its block and must pass an empty slice",
            ic.rank(),
            local_block.len()
        ))),
        Some(Side::New) => recv_blocks(ic, global_n),
        None => Err(Error::Intercomm {
            op: "redistribute_blocks",
            detail: "this intercommunicator joins two groups of one world and has no old and new side; use send_blocks and recv_blocks"
                .into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_array_with_the_remainder_first() {
        assert_eq!(block_range(0, 3, 7), 0..3);
        assert_eq!(block_range(1, 3, 7), 3..5);
        assert_eq!(block_range(2, 3, 7), 5..7);
        assert_eq!(block_range(3, 4, 2), 2..2, "empty blocks when n < size");
        let n = (1u64 << 40) + 3; // 2^40 = 2 (mod 7): a remainder of 5
        assert_eq!(block_range(6, 7, n).end, n, "no overflow at 2^40");
        assert_eq!(block_range(0, 7, n).end - block_range(0, 7, n).start, n / 7 + 1);
    }

    #[test]
    fn the_plan_moves_every_element_once() {
        for n in [0u64, 1, 7, 10, 1_000_003, (1 << 40) + 3] {
            for old in 1..=6 {
                for new in 1..=6 {
                    let plan = overlap_plan(old, new, n);
                    let mut at = 0;
                    for t in &plan {
                        assert_eq!(t.range.start, at, "{old}->{new} n={n}: contiguous in order");
                        assert!(t.range.end > t.range.start);
                        let (a, b) = (block_range(t.from, old, n), block_range(t.to, new, n));
                        assert!(a.start <= t.range.start && t.range.end <= a.end && b.start <= t.range.start && t.range.end <= b.end);
                        at = t.range.end;
                    }
                    assert_eq!(at, n);
                }
            }
        }
    }

    #[test]
    fn pieces_split_at_a_gibibyte() {
        let v: Vec<_> = pieces((1 << 28) + 3, 8).collect();
        assert_eq!(v, vec![0..1 << 27, 1 << 27..1 << 28, 1 << 28..(1 << 28) + 3]);
        assert_eq!(pieces(0, 8).count(), 0);
    }
}
