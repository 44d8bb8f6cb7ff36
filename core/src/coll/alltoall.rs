use bytemuck::Pod;

use super::gather::disjoint_parts;
use super::util::{check_disjoint, check_v, sendrecv, tag};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Below this many bytes per peer, every transfer is posted at once.
const SCATTERED_BYTES: usize = 8 << 10;

impl Comm {
    /// Block i of `send_buf` to rank i; block j of `recv_buf` from rank j
    /// (both buffers size × block elements).
    pub fn alltoall<T: Pod>(&self, send_buf: &[T], recv_buf: &mut [T]) -> Result<()> {
        self.sh.check_live("alltoall")?;
        let _c = self.enter("alltoall", None, send_buf.len() as u64, std::mem::size_of::<T>())?;
        let n = self.size() as usize;
        if send_buf.len() != recv_buf.len() || send_buf.len() % n != 0 {
            return Err(Error::InvalidCount {
                what: "alltoall",
                detail: format!(
                    "send buffer {} and receive buffer {} elements must be equal multiples of {n} ranks",
                    send_buf.len(),
                    recv_buf.len()
                ),
            });
        }
        let m = send_buf.len() / n;
        let counts = vec![m; n];
        let displs: Vec<usize> = (0..n).map(|i| i * m).collect();
        self.alltoallv(send_buf, &counts, &displs, recv_buf, &counts, &displs)
    }

    /// Like [`Comm::alltoall`] with per-rank counts and displacements (in elements).
    pub fn alltoallv<T: Pod>(
        &self,
        send_buf: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv_buf: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<()> {
        self.sh.check_live("alltoallv")?;
        let _c = self.enter("alltoallv", None, u64::MAX, std::mem::size_of::<T>())?;
        let n = self.size() as usize;
        check_v("alltoallv send", scounts, sdispls, self.size(), send_buf.len())?;
        check_v("alltoallv receive", rcounts, rdispls, self.size(), recv_buf.len())?;
        check_disjoint("alltoallv receive", rcounts, rdispls)?;
        let me = self.rank() as usize;
        if scounts[me] != rcounts[me] {
            return Err(Error::InvalidCount {
                what: "alltoallv",
                detail: format!("rank {me} sends itself {} elements but expects {}", scounts[me], rcounts[me]),
            });
        }
        recv_buf[rdispls[me]..rdispls[me] + rcounts[me]].copy_from_slice(&send_buf[sdispls[me]..sdispls[me] + scounts[me]]);
        let max_bytes = scounts.iter().chain(rcounts).max().copied().unwrap_or(0) * std::mem::size_of::<T>();
        if max_bytes < SCATTERED_BYTES {
            let parts = disjoint_parts(recv_buf, rcounts, rdispls, me)?;
            return self.scope(|s| {
                for (r, part) in parts {
                    let _ = s.irecv_exact(part, r as u32, tag::ALLTOALL)?;
                }
                for k in 1..n {
                    let r = (me + k) % n;
                    let _ = s.isend_coll(&send_buf[sdispls[r]..sdispls[r] + scounts[r]], r as u32, tag::ALLTOALL)?;
                }
                Ok(())
            });
        }
        // Pairwise exchange: in step k send to r + k, receive from r − k.
        for k in 1..n {
            let dst = (me + k) % n;
            let src = (me + n - k) % n;
            sendrecv(
                self,
                &send_buf[sdispls[dst]..sdispls[dst] + scounts[dst]],
                dst as u32,
                &mut recv_buf[rdispls[src]..rdispls[src] + rcounts[src]],
                src as u32,
                tag::ALLTOALL + 1,
            )?;
        }
        Ok(())
    }
}
