//! The UD queue pair that carries the handshakes of connections made on
//! demand ([`crate::wireup`]): its receive buffers (their completions share
//! the endpoint's receive completion queue, told apart by QP number), a few
//! send buffers, and an address handle per peer it has written to.

use std::sync::Arc;

use fmx_transport::rdma::setup_error;
use fmx_transport::{PeerId, TransportError};
use memmap2::MmapMut;

use crate::sys::{ffi, Access, Ah, Cq, Mr, Pd, Qp};
use crate::wireup::{Msg, MSG_BYTES};

/// Receive buffers of the UD queue pair (datagrams that find none are lost,
/// and sent again by their sender).
pub(crate) const RECVS: usize = 64;
/// Send buffers (a datagram finding none is dropped: the handshake resends).
const SENDS: usize = 16;
/// A receive buffer: the 40-byte global route header a UD receive always
/// leaves room for, then the datagram.
const RECV_BYTES: usize = 128;
const GRH_BYTES: usize = 40;
const SEND_BYTES: usize = 64;
/// The `Q_Key` of fmx's handshake datagrams: a datagram with another is dropped by the device.
const QKEY: u32 = 0x464d_5801;

/// Where a peer's UD queue pair is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UdPeer {
    pub(crate) qpn: u32,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    pub(crate) global: bool,
}

/// The UD queue pair and its buffers. Field order is drop order: the queue
/// pair and the address handles go before the memory they use.
pub(crate) struct Channel {
    qp: Qp,
    ahs: Vec<Option<Ah>>,
    recv_mr: Mr,
    send_mr: Mr,
    bufs: MmapMut,
    free: Vec<usize>,
    cq: Arc<Cq>,
    pd: Arc<Pd>,
    port: u8,
    gid_index: u8,
}

impl Channel {
    /// The queue pair, its receives posted on `recv_cq`; ready for datagrams.
    pub(crate) fn open(
        pd: &Arc<Pd>,
        ctx: &Arc<crate::sys::Context>,
        recv_cq: &Arc<Cq>,
        port: u8,
        gid_index: u8,
        size: u32,
    ) -> Result<Self, TransportError> {
        let cq = Cq::create(ctx, SENDS as i32 + 4).map_err(setup_error("create the wire-up completion queue"))?;
        let qp = Qp::create_ud(pd, &cq, recv_cq, SENDS as u32, RECVS as u32).map_err(setup_error("create the wire-up queue pair"))?;
        qp.activate_ud(port, QKEY, std::process::id() & 0x00ff_ffff).map_err(setup_error("activate the wire-up queue pair"))?;
        let mut bufs = MmapMut::map_anon(RECVS * RECV_BYTES + SENDS * SEND_BYTES).map_err(setup_error("map wire-up buffers"))?;
        let recv_mr =
            Mr::register(pd, bufs.as_mut_ptr(), RECVS * RECV_BYTES, Access::Local).map_err(setup_error("register wire-up buffers"))?;
        // SAFETY: the offset lies inside the map (its send part follows the receive part).
        let send_at = unsafe { bufs.as_mut_ptr().add(RECVS * RECV_BYTES) };
        let send_mr = Mr::register(pd, send_at, SENDS * SEND_BYTES, Access::LocalRead).map_err(setup_error("register wire-up buffers"))?;
        let me = Self {
            qp,
            ahs: (0..size).map(|_| None).collect(),
            recv_mr,
            send_mr,
            bufs,
            free: (0..SENDS).collect(),
            cq,
            pd: pd.clone(),
            port,
            gid_index,
        };
        for i in 0..RECVS {
            me.post_recv(i).map_err(setup_error("post a wire-up receive"))?;
        }
        Ok(me)
    }

    /// Our UD queue pair's number (peers send their datagrams to it).
    pub(crate) fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    fn post_recv(&self, i: usize) -> std::io::Result<()> {
        let addr = self.recv_mr.addr + (i * RECV_BYTES) as u64;
        // SAFETY: buffer i lies in the receive region registered for local
        // write, which the channel owns until its queue pair is destroyed.
        unsafe { self.qp.post_recv(i as u64, addr, RECV_BYTES as u32, self.recv_mr.lkey()) }
    }

    /// A receive completion of the channel's queue pair: the datagram (if
    /// the completion is good and holds one), and its buffer posted again.
    pub(crate) fn received(&mut self, wc: &ffi::ibv_wc) -> Option<(Msg, u32)> {
        let i = wc.wr_id() as usize;
        if i >= RECVS || wc.error().is_some() {
            return None; // flushed while closing: nothing to repost
        }
        let at = i * RECV_BYTES + GRH_BYTES;
        let msg = (wc.len() >= GRH_BYTES + MSG_BYTES).then(|| Msg::decode(&self.bufs[at..at + MSG_BYTES])).flatten();
        if let Err(e) = self.post_recv(i) {
            tracing::warn!("reposting a wire-up receive failed: {e}");
        }
        msg.map(|m| (m, wc.src_qp))
    }

    /// Sends `msg` to `to`'s UD queue pair; `false` when it could not go now
    /// (no free buffer, or the device refused): the handshake sends it again.
    pub(crate) fn send(&mut self, msg: &Msg, to: &UdPeer) -> bool {
        self.reap();
        let Some(i) = self.free.pop() else { return false };
        let peer = msg.to as usize;
        if self.ahs[peer].is_none() {
            match Ah::create(&self.pd, self.port, self.gid_index, to.lid, to.gid, to.global) {
                Ok(ah) => self.ahs[peer] = Some(ah),
                Err(e) => {
                    tracing::debug!("address handle toward rank {peer}: {e}");
                    self.free.push(i);
                    return false;
                }
            }
        }
        let at = RECVS * RECV_BYTES + i * SEND_BYTES;
        self.bufs[at..at + MSG_BYTES].copy_from_slice(&msg.encode());
        let local = (self.send_mr.addr + (i * SEND_BYTES) as u64, MSG_BYTES as u32, self.send_mr.lkey());
        let ah = self.ahs[peer].as_ref().expect("made above");
        // SAFETY: buffer i lies in the registered send region and is not
        // written again until its completion gives it back (`reap`).
        match unsafe { self.qp.post_send_ud(i as u64, local, ah, to.qpn, QKEY) } {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("wire-up datagram toward rank {peer}: {e}");
                self.free.push(i);
                false
            }
        }
    }

    /// Frees the send buffers whose datagrams have left.
    fn reap(&mut self) {
        if self.free.len() == SENDS {
            return;
        }
        let mut wcs = [std::mem::MaybeUninit::uninit(); SENDS];
        if let Ok(done) = self.cq.poll(&mut wcs) {
            for wc in done {
                let i = wc.wr_id() as usize;
                if i < SENDS && !self.free.contains(&i) {
                    self.free.push(i);
                }
            }
        }
    }

    /// Stops the device from using the channel's memory (before it is freed).
    pub(crate) fn close(&self) {
        self.qp.set_error();
    }

    /// Whether a datagram from UD queue pair `src_qp` can come from `peer`.
    pub(crate) fn from_peer(peer: PeerId, src_qp: u32, peers: &[UdPeer]) -> bool {
        peers.get(peer as usize).is_some_and(|p| p.qpn == src_qp)
    }
}
