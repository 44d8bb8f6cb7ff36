use bytemuck::Pod;

use super::util::{check_root, check_v, recv, send, tag};
use crate::comm::Comm;
use crate::error::{Error, Result};

fn equal_counts(n: usize, each: usize) -> (Vec<usize>, Vec<usize>) {
    ((0..n).map(|_| each).collect(), (0..n).map(|i| i * each).collect())
}

impl Comm {
    /// Every rank's `send_buf` into `recv_buf` of `root`, in rank order
    /// (`recv_buf.len()` = size × `send_buf.len()` at the root).
    pub fn gather<T: Pod>(&self, send_buf: &[T], recv_buf: &mut [T], root: u32) -> Result<()> {
        self.sh.check_live("gather")?;
        let _c = self.enter("gather", Some(root), send_buf.len() as u64, std::mem::size_of::<T>())?;
        let n = self.size() as usize;
        if self.rank() == root && recv_buf.len() != n * send_buf.len() {
            return Err(Error::InvalidCount {
                what: "gather",
                detail: format!("receive buffer has {} elements, expected {n} ranks x {}", recv_buf.len(), send_buf.len()),
            });
        }
        let (counts, displs) = equal_counts(n, send_buf.len());
        self.gatherv(send_buf, recv_buf, &counts, &displs, root)
    }

    /// Like [`Comm::gather`] with per-rank counts and displacements (in elements) at the root.
    pub fn gatherv<T: Pod>(&self, send_buf: &[T], recv_buf: &mut [T], counts: &[usize], displs: &[usize], root: u32) -> Result<()> {
        self.sh.check_live("gatherv")?;
        let _c = self.enter("gatherv", Some(root), u64::MAX, std::mem::size_of::<T>())?;
        check_root(self, root)?;
        if self.rank() != root {
            return send(self, send_buf, root, tag::GATHER);
        }
        check_v("gatherv", counts, displs, self.size(), recv_buf.len())?;
        let me = self.rank() as usize;
        if counts[me] != send_buf.len() {
            return Err(Error::InvalidCount {
                what: "gatherv",
                detail: format!("root's own count {} differs from its send buffer of {}", counts[me], send_buf.len()),
            });
        }
        recv_buf[displs[me]..displs[me] + counts[me]].copy_from_slice(send_buf);
        let parts = disjoint_parts(recv_buf, counts, displs, me)?;
        self.scope(|s| {
            for (r, part) in parts {
                let _ = s.irecv_exact(part, r as u32, tag::GATHER)?;
            }
            Ok(())
        })
    }

    /// Block i of `send_buf` at `root` into `recv_buf` of rank i
    /// (`send_buf.len()` = size × `recv_buf.len()` at the root).
    pub fn scatter<T: Pod>(&self, send_buf: &[T], recv_buf: &mut [T], root: u32) -> Result<()> {
        self.sh.check_live("scatter")?;
        let _c = self.enter("scatter", Some(root), recv_buf.len() as u64, std::mem::size_of::<T>())?;
        let n = self.size() as usize;
        if self.rank() == root && send_buf.len() != n * recv_buf.len() {
            return Err(Error::InvalidCount {
                what: "scatter",
                detail: format!("send buffer has {} elements, expected {n} ranks x {}", send_buf.len(), recv_buf.len()),
            });
        }
        let (counts, displs) = equal_counts(n, recv_buf.len());
        self.scatterv(send_buf, &counts, &displs, recv_buf, root)
    }

    /// Like [`Comm::scatter`] with per-rank counts and displacements at the root.
    pub fn scatterv<T: Pod>(&self, send_buf: &[T], counts: &[usize], displs: &[usize], recv_buf: &mut [T], root: u32) -> Result<()> {
        self.sh.check_live("scatterv")?;
        let _c = self.enter("scatterv", Some(root), u64::MAX, std::mem::size_of::<T>())?;
        check_root(self, root)?;
        if self.rank() != root {
            return recv(self, recv_buf, root, tag::SCATTER);
        }
        check_v("scatterv", counts, displs, self.size(), send_buf.len())?;
        let me = self.rank() as usize;
        if counts[me] != recv_buf.len() {
            return Err(Error::InvalidCount {
                what: "scatterv",
                detail: format!("root's own count {} differs from its receive buffer of {}", counts[me], recv_buf.len()),
            });
        }
        recv_buf.copy_from_slice(&send_buf[displs[me]..displs[me] + counts[me]]);
        self.scope(|s| {
            for r in (0..self.size() as usize).filter(|&r| r != me) {
                let _ = s.isend_coll(&send_buf[displs[r]..displs[r] + counts[r]], r as u32, tag::SCATTER)?;
            }
            Ok(())
        })
    }
}

/// Mutable, non-overlapping parts of `buf` for every rank but `skip`; overlapping
/// receive regions are an error (two messages cannot land on the same bytes).
pub(crate) fn disjoint_parts<'a, T>(
    buf: &'a mut [T],
    counts: &[usize],
    displs: &[usize],
    skip: usize,
) -> Result<Vec<(usize, &'a mut [T])>> {
    let mut order: Vec<usize> = (0..counts.len()).filter(|&r| r != skip && counts[r] > 0).collect();
    order.sort_by_key(|&r| displs[r]);
    let mut parts = Vec::with_capacity(order.len());
    let mut rest = buf;
    let mut consumed = 0;
    for r in order {
        if displs[r] < consumed {
            return Err(Error::InvalidCount {
                what: "receive displacements",
                detail: format!("rank {r}'s region at displacement {} overlaps another rank's", displs[r]),
            });
        }
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut(displs[r] - consumed);
        let (part, tail) = tail.split_at_mut(counts[r]);
        parts.push((r, part));
        rest = tail;
        consumed = displs[r] + counts[r];
    }
    // Zero-count ranks still send an (empty) message that must be received.
    for r in (0..counts.len()).filter(|&r| r != skip && counts[r] == 0) {
        parts.push((r, Default::default()));
    }
    Ok(parts)
}
