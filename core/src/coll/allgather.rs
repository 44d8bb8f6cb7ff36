use bytemuck::Pod;

use super::bcast::split_two;
use super::util::{check_disjoint, check_v, sendrecv, tag};
use super::SMALL_BYTES;
use crate::comm::Comm;
use crate::error::{Error, Result};

impl Comm {
    /// Every rank's `send_buf` into every rank's `recv_buf`, in rank order.
    pub fn allgather<T: Pod>(&self, send_buf: &[T], recv_buf: &mut [T]) -> Result<()> {
        self.sh.check_live("allgather")?;
        let _c = self.enter("allgather", None, send_buf.len() as u64, std::mem::size_of::<T>())?;
        let n = self.size() as usize;
        let m = send_buf.len();
        if recv_buf.len() != n * m {
            return Err(Error::InvalidCount {
                what: "allgather",
                detail: format!("receive buffer has {} elements, expected {n} ranks x {m}", recv_buf.len()),
            });
        }
        let me = self.rank() as usize;
        recv_buf[me * m..(me + 1) * m].copy_from_slice(send_buf);
        if n.is_power_of_two() && std::mem::size_of_val(recv_buf) < SMALL_BYTES {
            // Recursive doubling: in round k exchange the 2^k blocks gathered so far.
            let mut mask = 1;
            let mut round = 0;
            while mask < n {
                let peer = me ^ mask;
                let mine = (me & !(mask - 1)) * m..((me & !(mask - 1)) + mask) * m;
                let theirs = (peer & !(mask - 1)) * m..((peer & !(mask - 1)) + mask) * m;
                let (s, r) = split_two(recv_buf, mine, theirs);
                sendrecv(self, s, peer as u32, r, peer as u32, tag::ALLGATHER + round)?;
                mask <<= 1;
                round += 1;
            }
            return Ok(());
        }
        let counts = vec![m; n];
        let displs: Vec<usize> = (0..n).map(|i| i * m).collect();
        self.allgatherv_ring(recv_buf, &counts, &displs)
    }

    /// Every rank's `send_buf` into `recv_buf` at `displs[rank]` (counts in elements).
    pub fn allgatherv<T: Pod>(&self, send_buf: &[T], recv_buf: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        self.sh.check_live("allgatherv")?;
        let _c = self.enter("allgatherv", None, super::check::digest(counts), std::mem::size_of::<T>())?;
        check_v("allgatherv", counts, displs, self.size(), recv_buf.len())?;
        check_disjoint("allgatherv", counts, displs)?;
        let me = self.rank() as usize;
        if counts[me] != send_buf.len() {
            return Err(Error::InvalidCount {
                what: "allgatherv",
                detail: format!("rank {me}'s count {} differs from its send buffer of {}", counts[me], send_buf.len()),
            });
        }
        recv_buf[displs[me]..displs[me] + counts[me]].copy_from_slice(send_buf);
        self.allgatherv_ring(recv_buf, counts, displs)
    }

    /// Ring: in step k pass block (r − k) right, take block (r − k − 1) from the left.
    fn allgatherv_ring<T: Pod>(&self, buf: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        let n = self.size() as usize;
        let r = self.rank() as usize;
        let right = ((r + 1) % n) as u32;
        let left = ((r + n - 1) % n) as u32;
        for k in 0..n.saturating_sub(1) {
            let sb = (r + n - k) % n;
            let rb = (r + n - k - 1) % n;
            let (s, d) = split_two(buf, displs[sb]..displs[sb] + counts[sb], displs[rb]..displs[rb] + counts[rb]);
            sendrecv(self, s, right, d, left, tag::ALLGATHER + 100)?;
        }
        Ok(())
    }
}
