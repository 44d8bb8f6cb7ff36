use bytemuck::Pod;

use super::util::{block, check_root, recv, send, tag};
use super::SMALL_BYTES;
use crate::comm::Comm;
use crate::error::Result;

impl Comm {
    /// Copies `buf` of `root` into `buf` of every rank.
    pub fn bcast<T: Pod>(&self, buf: &mut [T], root: u32) -> Result<()> {
        self.sh.check_live("bcast")?;
        let _c = self.enter("bcast", Some(root), buf.len() as u64, std::mem::size_of::<T>())?;
        check_root(self, root)?;
        let n = self.size();
        if n == 1 {
            return Ok(());
        }
        if std::mem::size_of_val(buf) < SMALL_BYTES || n <= 2 || buf.len() < n as usize {
            self.bcast_binomial(buf, root)
        } else {
            self.bcast_scatter_allgather(buf, root)
        }
    }

    fn bcast_binomial<T: Pod>(&self, buf: &mut [T], root: u32) -> Result<()> {
        let n = self.size();
        let vr = (self.rank() + n - root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                recv(self, buf, (vr - mask + root) % n, tag::BCAST)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                send(self, buf, (vr + mask + root) % n, tag::BCAST)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    /// The root sends block i to rank i, then a ring passes blocks around.
    fn bcast_scatter_allgather<T: Pod>(&self, buf: &mut [T], root: u32) -> Result<()> {
        let n = self.size() as usize;
        let len = buf.len();
        let vr = (self.rank() as usize + n - root as usize) % n;
        let to_rank = |v: usize| ((v + root as usize) % n) as u32;
        if vr == 0 {
            let data: &[T] = buf;
            self.scope(|s| {
                for v in 1..n {
                    let _ = s.isend_coll(&data[block(len, n, v)], to_rank(v), tag::BCAST)?;
                }
                Ok(())
            })?;
        } else {
            recv(self, &mut buf[block(len, n, vr)], root, tag::BCAST)?;
        }
        // Ring: in step k, pass block (vr - k) right and take block (vr - k - 1) from
        // the left. The root has every block: it receives nothing and nobody sends to it.
        let right = to_rank((vr + 1) % n);
        let left = to_rank((vr + n - 1) % n);
        for k in 0..n - 1 {
            let sb = (vr + n - k) % n;
            let rb = (vr + n - k - 1) % n;
            let (sbuf, rbuf) = split_two(buf, block(len, n, sb), block(len, n, rb));
            self.scope(|s| {
                if vr != 0 {
                    let _ = s.irecv_exact(rbuf, left, tag::BCAST + 1)?;
                }
                if vr != n - 1 {
                    let _ = s.isend_coll(sbuf, right, tag::BCAST + 1)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// Two disjoint ranges of `buf`, one to read and one to write (either may be
/// empty, anywhere: a zero-count block may share its displacement with another).
pub(crate) fn split_two<T>(buf: &mut [T], read: std::ops::Range<usize>, write: std::ops::Range<usize>) -> (&[T], &mut [T]) {
    debug_assert!(read.end <= write.start || write.end <= read.start || read.is_empty() || write.is_empty());
    if read.is_empty() {
        return (&[], &mut buf[write]);
    }
    if write.is_empty() {
        return (&buf[read], &mut []);
    }
    if read.start < write.start {
        let (a, b) = buf.split_at_mut(write.start);
        (&a[read], &mut b[..write.len()])
    } else {
        let (a, b) = buf.split_at_mut(read.start);
        (&b[..read.len()], &mut a[write])
    }
}
