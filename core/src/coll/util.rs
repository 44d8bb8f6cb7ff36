//! Pieces the collective algorithms share.

use std::ops::Range;

use bytemuck::Pod;

use crate::comm::Comm;
use crate::error::{Error, Result};

/// Collective tags (on the communicator's collective context).
pub(crate) mod tag {
    pub(crate) const BARRIER: u32 = 1 << 20;
    pub(crate) const BCAST: u32 = 2 << 20;
    pub(crate) const REDUCE: u32 = 3 << 20;
    pub(crate) const ALLREDUCE: u32 = 4 << 20;
    pub(crate) const GATHER: u32 = 5 << 20;
    pub(crate) const SCATTER: u32 = 6 << 20;
    pub(crate) const ALLGATHER: u32 = 7 << 20;
    pub(crate) const ALLTOALL: u32 = 8 << 20;
    pub(crate) const JOIN: u32 = 9 << 20;
    pub(crate) const NEIGHBOR: u32 = 10 << 20;
    pub(crate) const REDISTRIBUTE: u32 = 11 << 20;
}

/// The collective a collective-context tag belongs to (for error messages:
/// users know "bcast", not tag 2097152).
pub(crate) fn coll_name(t: u32) -> &'static str {
    match t >> 20 {
        1 => "barrier",
        2 => "bcast",
        3 => "reduce",
        4 => "allreduce",
        5 => "gather",
        6 => "scatter",
        7 => "allgather",
        8 => "alltoall",
        9 => "join",
        10 => "neighborhood collective",
        11 => "block redistribution",
        _ => "collective",
    }
}

/// Block `i` of `n` elements split over `parts`: the first `n % parts` blocks get one more.
pub(crate) fn block(n: usize, parts: usize, i: usize) -> Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Exchanges with two peers at once on the collective context.
pub(crate) fn sendrecv<T: Pod>(c: &Comm, send: &[T], dest: u32, recv: &mut [T], src: u32, tag: u32) -> Result<()> {
    c.scope(|s| {
        let r = s.irecv_exact(recv, src, tag)?;
        let w = s.isend_coll(send, dest, tag)?;
        s.wait(w)?;
        s.wait(r).map(drop)
    })
}

pub(crate) fn send<T: Pod>(c: &Comm, buf: &[T], dest: u32, tag: u32) -> Result<()> {
    c.scope(|s| {
        let w = s.isend_coll(buf, dest, tag)?;
        s.wait(w).map(drop)
    })
}

pub(crate) fn recv<T: Pod>(c: &Comm, buf: &mut [T], src: u32, tag: u32) -> Result<()> {
    c.scope(|s| {
        let r = s.irecv_exact(buf, src, tag)?;
        s.wait(r).map(drop)
    })
}

/// Checks that two lengths agree.
pub(crate) fn same_len(what: &'static str, a: usize, b: usize) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(Error::InvalidCount { what, detail: format!("send buffer has {a} elements but receive buffer {b}") })
    }
}

/// Checks per-rank counts and displacements against a buffer.
pub(crate) fn check_v(what: &'static str, counts: &[usize], displs: &[usize], size: u32, buf_len: usize) -> Result<()> {
    if counts.len() != size as usize || displs.len() != size as usize {
        return Err(Error::InvalidCount {
            what,
            detail: format!("{} counts and {} displacements for {size} ranks", counts.len(), displs.len()),
        });
    }
    for (r, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        if d.checked_add(c).is_none_or(|end| end > buf_len) {
            return Err(Error::InvalidCount {
                what,
                detail: format!("rank {r}'s count {c} at displacement {d} exceeds the buffer of {buf_len} elements"),
            });
        }
    }
    Ok(())
}

/// Checks that the non-empty regions of a receive buffer do not overlap (two
/// messages cannot land on the same elements).
pub(crate) fn check_disjoint(what: &'static str, counts: &[usize], displs: &[usize]) -> Result<()> {
    let mut regions: Vec<(usize, usize, usize)> =
        counts.iter().zip(displs).enumerate().filter(|(_, (&c, _))| c > 0).map(|(r, (&c, &d))| (d, d + c, r)).collect();
    regions.sort_unstable();
    for w in regions.windows(2) {
        let ((_, end, a), (start, _, b)) = (w[0], w[1]);
        if start < end {
            return Err(Error::InvalidCount {
                what,
                detail: format!("rank {b}'s region at displacement {start} overlaps rank {a}'s, which ends at {end}"),
            });
        }
    }
    Ok(())
}

/// Checks that a root rank exists.
pub(crate) fn check_root(c: &Comm, root: u32) -> Result<()> {
    c.check_rank("root", root).map(drop)
}

#[cfg(test)]
mod tests {
    use super::block;

    #[test]
    fn blocks_tile_and_balance() {
        for n in [0usize, 1, 5, 16, 17] {
            for parts in 1..9 {
                let v: Vec<_> = (0..parts).map(|i| block(n, parts, i)).collect();
                assert_eq!(v[0].start, 0);
                assert_eq!(v[parts - 1].end, n);
                for w in v.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }
}
