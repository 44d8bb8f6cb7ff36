use super::bcast::split_two;
use super::op::{Op, Reduce};
use super::util::{block, check_root, recv, same_len, send, sendrecv, tag};
use super::SMALL_BYTES;
use crate::comm::Comm;
use crate::error::Result;

impl Comm {
    /// Combines `send` of every rank with `op` into `recv` at `root` (`recv` is
    /// only written at the root; other ranks may pass an empty slice).
    pub fn reduce<T: Reduce>(&self, send_buf: &[T], recv_buf: &mut [T], op: Op<'_, T>, root: u32) -> Result<()> {
        self.sh.check_live("reduce")?;
        let _c = self.enter("reduce", Some(root), send_buf.len() as u64, std::mem::size_of::<T>())?;
        check_root(self, root)?;
        if self.rank() == root {
            same_len("reduce", send_buf.len(), recv_buf.len())?;
        }
        let n = self.size();
        let vr = (self.rank() + n - root) % n;
        let mut acc = send_buf.to_vec();
        let mut tmp = vec![T::zeroed(); send_buf.len()];
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                send(self, &acc, (vr - mask + root) % n, tag::REDUCE)?;
                break;
            }
            if vr + mask < n {
                recv(self, &mut tmp, (vr + mask + root) % n, tag::REDUCE)?;
                op.apply(&tmp, &mut acc);
            }
            mask <<= 1;
        }
        if vr == 0 {
            recv_buf.copy_from_slice(&acc);
        }
        Ok(())
    }

    /// Combines `send` of every rank with `op` into `recv` of every rank.
    pub fn allreduce<T: Reduce>(&self, send_buf: &[T], recv_buf: &mut [T], op: Op<'_, T>) -> Result<()> {
        self.sh.check_live("allreduce")?;
        let _c = self.enter("allreduce", None, send_buf.len() as u64, std::mem::size_of::<T>())?;
        same_len("allreduce", send_buf.len(), recv_buf.len())?;
        recv_buf.copy_from_slice(send_buf);
        let n = self.size() as usize;
        if n == 1 {
            return Ok(());
        }
        if std::mem::size_of_val(send_buf) < SMALL_BYTES || send_buf.len() < n {
            self.allreduce_recursive_doubling(recv_buf, op)
        } else {
            self.allreduce_ring(recv_buf, op)
        }
    }

    /// Recursive doubling over the largest power of two p ≤ n; the first
    /// 2(n−p) ranks pair up first (odd ones carry their even neighbour's data).
    fn allreduce_recursive_doubling<T: Reduce>(&self, acc: &mut [T], op: Op<'_, T>) -> Result<()> {
        let n = self.size();
        let r = self.rank();
        let p = 1u32 << n.ilog2();
        let rem = n - p;
        let mut tmp = vec![T::zeroed(); acc.len()];
        // Fold: even ranks below 2*rem hand their data to the odd neighbour and sit out.
        let newrank = if r < 2 * rem {
            if r % 2 == 0 {
                send(self, acc, r + 1, tag::ALLREDUCE)?;
                None
            } else {
                recv(self, &mut tmp, r - 1, tag::ALLREDUCE)?;
                op.apply(&tmp, acc);
                Some(r / 2)
            }
        } else {
            Some(r - rem)
        };
        let real = |nr: u32| if nr < rem { nr * 2 + 1 } else { nr + rem };
        if let Some(nr) = newrank {
            let mut mask = 1;
            let mut round = 1;
            while mask < p {
                let peer = real(nr ^ mask);
                sendrecv(self, acc, peer, &mut tmp, peer, tag::ALLREDUCE + round)?;
                op.apply(&tmp, acc);
                mask <<= 1;
                round += 1;
            }
        }
        // Unfold: odd ranks below 2*rem give the result back.
        if r < 2 * rem {
            if r % 2 == 0 {
                recv(self, acc, r + 1, tag::ALLREDUCE + 100)?;
            } else {
                send(self, acc, r - 1, tag::ALLREDUCE + 100)?;
            }
        }
        Ok(())
    }

    /// Ring reduce-scatter then ring allgather: each rank sends 2(n−1)/n of the data.
    fn allreduce_ring<T: Reduce>(&self, acc: &mut [T], op: Op<'_, T>) -> Result<()> {
        let n = self.size() as usize;
        let r = self.rank() as usize;
        let len = acc.len();
        let right = ((r + 1) % n) as u32;
        let left = ((r + n - 1) % n) as u32;
        let mut tmp = vec![T::zeroed(); block(len, n, 0).len()];
        // Reduce-scatter: after step k, block (r - k - 1) holds k + 2 contributions.
        for k in 0..n - 1 {
            let sb = block(len, n, (r + n - k) % n);
            let rb = block(len, n, (r + n - k - 1) % n);
            let rlen = rb.len();
            sendrecv(self, &acc[sb], right, &mut tmp[..rlen], left, tag::ALLREDUCE + 200)?;
            op.apply(&tmp[..rlen], &mut acc[rb]);
        }
        // Allgather: rank r now owns block (r + 1) fully reduced.
        for k in 0..n - 1 {
            let sb = block(len, n, (r + 1 + n - k) % n);
            let rb = block(len, n, (r + n - k) % n);
            let (s, d) = split_two(acc, sb, rb);
            sendrecv(self, s, right, d, left, tag::ALLREDUCE + 300)?;
        }
        Ok(())
    }
}
