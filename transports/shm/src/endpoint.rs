//! The shared-memory endpoint: one segment of our own, the peers' mapped.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use fmx_transport::{Endpoint, MsgHeader, OpStatus, PeerId, PeerState, RemoteKey, SendOutcome, TransportError};

use crate::cma;
use crate::layout::{state, Layout};
use crate::liveness::PeerWatch;
use crate::ring::{RxRing, TxRing};
use crate::segment::{segment_path, shm_dir, validate_job_id, Segment};

/// Default slots per inbound ring (credits per sender).
pub const DEFAULT_SLOTS: u32 = 16;
/// Default bytes per slot: eager messages up to this minus 40 bytes of header;
/// larger ones move with one `process_vm_readv`.
pub const DEFAULT_SLOT_BYTES: usize = 16 << 10;

/// How to build the endpoint.
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// Job id (names the segment files).
    pub job: String,
    /// Our index.
    pub rank: u32,
    /// Processes in the job.
    pub size: u32,
    /// Slots per inbound ring.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// Directory of the segment files.
    pub dir: PathBuf,
}

impl ShmConfig {
    /// Defaults, overridden by `FMX_SHM_SLOTS`, `FMX_SHM_SLOT_BYTES` and `FMX_SHM_DIR`.
    pub fn from_env(job: &str, rank: u32, size: u32) -> Result<Self, TransportError> {
        let num = |var: &str, default: usize| -> Result<usize, TransportError> {
            match std::env::var(var) {
                Err(_) => Ok(default),
                Ok(v) => v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| TransportError::Setup {
                    what: format!("{var}={v:?} is not a positive integer"),
                    source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
                }),
            }
        };
        Ok(Self {
            job: job.to_owned(),
            rank,
            size,
            slots: num("FMX_SHM_SLOTS", DEFAULT_SLOTS as usize)? as u32,
            slot_bytes: num("FMX_SHM_SLOT_BYTES", DEFAULT_SLOT_BYTES)?,
            dir: shm_dir(),
        })
    }

    fn layout(&self) -> Layout {
        Layout::new(self.size, self.slots, self.slot_bytes)
    }
}

/// Our segment exists; the peers' are not mapped yet. Publish [`ShmSetup::address`]
/// through the bootstrap, then [`ShmSetup::connect`] with everyone's.
pub struct ShmSetup {
    cfg: ShmConfig,
    own: Segment,
}

impl ShmSetup {
    /// Creates our segment file.
    pub fn create(cfg: ShmConfig) -> Result<Self, TransportError> {
        validate_job_id(&cfg.job)?;
        let path = segment_path(&cfg.dir, &cfg.job, cfg.rank);
        let own = Segment::create(path, cfg.rank, cfg.layout())?;
        Ok(Self { cfg, own })
    }

    /// What peers need to reach us: our pid (4 bytes, little-endian).
    pub fn address(&self) -> Vec<u8> {
        std::process::id().to_le_bytes().to_vec()
    }

    /// Maps every peer's segment. `addresses[r]` is rank r's [`ShmSetup::address`].
    pub fn connect(self, addresses: &[Vec<u8>]) -> Result<ShmEndpoint, TransportError> {
        let Self { cfg, own } = self;
        if addresses.len() != cfg.size as usize {
            return Err(TransportError::Setup {
                what: format!("shm connect got {} addresses for a job of {}", addresses.len(), cfg.size),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let layout = cfg.layout();
        let mut peers = Vec::with_capacity(cfg.size as usize);
        let mut pids = Vec::with_capacity(cfg.size as usize);
        for (r, addr) in addresses.iter().enumerate() {
            let r = r as u32;
            let pid = addr
                .get(..4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or(TransportError::Malformed { peer: r, what: "shm address shorter than 4 bytes" })?;
            if r == cfg.rank {
                peers.push(None);
            } else {
                let seg = Segment::open(segment_path(&cfg.dir, &cfg.job, r), r, layout)?;
                if seg.owner_pid() != pid {
                    return Err(TransportError::Setup {
                        what: format!("rank {r}'s segment is owned by pid {} but rank {r} announced pid {pid}", seg.owner_pid()),
                        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
                    });
                }
                peers.push(Some(seg));
            }
            pids.push(pid);
        }
        Ok(ShmEndpoint {
            rank: cfg.rank,
            size: cfg.size,
            max_eager: layout.max_payload(),
            tx: (0..cfg.size).map(|_| TxRing::new(cfg.rank, layout.slots)).collect(),
            rx: (0..cfg.size).map(RxRing::new).collect(),
            watches: pids.iter().map(|&p| PeerWatch::new(p)).collect(),
            pids,
            peers,
            own,
            poll_from: 0,
            unlinked: false,
        })
    }
}

/// The shared-memory endpoint.
pub struct ShmEndpoint {
    rank: u32,
    size: u32,
    max_eager: usize,
    own: Segment,
    peers: Vec<Option<Segment>>,
    tx: Vec<TxRing>,
    rx: Vec<RxRing>,
    pids: Vec<u32>,
    watches: Vec<PeerWatch>,
    poll_from: u32,
    unlinked: bool,
}

impl ShmEndpoint {
    /// Removes our segment file once every peer has mapped it (the mappings stay
    /// valid): after this no file is left behind, whatever happens to the job.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            let _ = std::fs::remove_file(self.own.path());
            self.unlinked = true;
        }
    }

    /// Bytes of receive memory this process owns (its segment).
    pub fn receive_bytes(&self) -> usize {
        self.own.layout().segment_bytes()
    }

    fn segment_of(&self, peer: PeerId) -> &Segment {
        self.peers[peer as usize].as_ref().unwrap_or(&self.own)
    }

    fn check_peer(&self, peer: PeerId) -> Result<(), TransportError> {
        if peer < self.size {
            Ok(())
        } else {
            Err(TransportError::NoSuchPeer { peer, size: self.size })
        }
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        self.own.state().store(state::FINALIZED, Ordering::Release);
        self.unlink();
    }
}

impl Endpoint for ShmEndpoint {
    fn local_id(&self) -> PeerId {
        self.rank
    }

    fn num_peers(&self) -> u32 {
        self.size
    }

    fn max_eager(&self) -> usize {
        self.max_eager
    }

    #[inline]
    fn try_send(&mut self, peer: PeerId, header: &MsgHeader, payload: &[u8]) -> Result<SendOutcome, TransportError> {
        self.check_peer(peer)?;
        if payload.len() > self.max_eager {
            return Err(TransportError::EagerTooLarge { len: payload.len(), max: self.max_eager });
        }
        let seg = match &self.peers[peer as usize] {
            Some(s) => s,
            None => &self.own,
        };
        if self.tx[peer as usize].try_send(seg, header, payload) {
            Ok(SendOutcome::Sent)
        } else {
            Ok(SendOutcome::Backpressure)
        }
    }

    #[inline]
    fn poll<F>(&mut self, max: usize, mut sink: F) -> Result<usize, TransportError>
    where
        F: FnMut(PeerId, &MsgHeader, &[u8]),
    {
        let mut n = 0;
        let size = self.size;
        for k in 0..size {
            let peer = (self.poll_from + k) % size;
            let ring = &mut self.rx[peer as usize];
            while n < max {
                let Some(slot) = ring.peek(&self.own) else {
                    break;
                };
                match slot.header {
                    Ok(h) => sink(peer, &h, slot.payload),
                    Err(_) => {
                        ring.release(&self.own);
                        return Err(TransportError::Malformed { peer, what: "undecodable header in a shared-memory slot" });
                    }
                }
                ring.release(&self.own);
                n += 1;
            }
        }
        self.poll_from = (self.poll_from + 1) % size;
        Ok(n)
    }

    fn expose(&mut self, buf: &[u8]) -> Result<RemoteKey, TransportError> {
        Ok(RemoteKey { addr: buf.as_ptr() as u64, len: buf.len() as u64, key: 0 })
    }

    fn expose_mut(&mut self, buf: &mut [u8]) -> Result<RemoteKey, TransportError> {
        self.expose(buf)
    }

    fn revoke(&mut self, _key: &RemoteKey) {}

    fn read(&mut self, peer: PeerId, remote: &RemoteKey, local: &mut [u8]) -> Result<OpStatus, TransportError> {
        self.check_peer(peer)?;
        let r = remote.slice(peer, 0, local.len() as u64)?;
        cma::read_from(peer, self.pids[peer as usize], r.addr, local)?;
        Ok(OpStatus::Done)
    }

    fn write(&mut self, peer: PeerId, local: &[u8], remote: &RemoteKey) -> Result<OpStatus, TransportError> {
        self.check_peer(peer)?;
        let r = remote.slice(peer, 0, local.len() as u64)?;
        cma::write_to(peer, self.pids[peer as usize], local, r.addr)?;
        Ok(OpStatus::Done)
    }

    fn poll_ops<F>(&mut self, _done: F) -> Result<usize, TransportError>
    where
        F: FnMut(u64, Result<(), TransportError>),
    {
        Ok(0) // every one-sided operation completes inside its call
    }

    fn peer_state(&mut self, peer: PeerId) -> PeerState {
        if peer >= self.size {
            return PeerState::Dead;
        }
        if self.segment_of(peer).state().load(Ordering::Acquire) == state::FINALIZED {
            PeerState::Finalized
        } else if peer != self.rank && self.watches[peer as usize].exited() {
            PeerState::Dead
        } else {
            PeerState::Alive
        }
    }

    fn finalize(&mut self) -> Result<(), TransportError> {
        self.own.state().store(state::FINALIZED, Ordering::Release);
        self.unlink();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fmx_transport::MsgKind;

    fn pair(job: &str, slots: u32) -> (ShmEndpoint, ShmEndpoint, PathBuf) {
        let dir = std::env::temp_dir().join(format!("fmx-shm-test-{job}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = |rank| ShmConfig { job: job.into(), rank, size: 2, slots, slot_bytes: 256, dir: dir.clone() };
        let a = ShmSetup::create(cfg(0)).unwrap();
        let b = ShmSetup::create(cfg(1)).unwrap();
        let addrs = vec![a.address(), b.address()];
        let mut a = a.connect(&addrs).unwrap();
        let mut b = b.connect(&addrs).unwrap();
        a.unlink();
        b.unlink();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "unlinked after connect");
        (a, b, dir)
    }

    fn drain(ep: &mut ShmEndpoint) -> Vec<(u32, u64, Vec<u8>)> {
        let mut got = Vec::new();
        ep.poll(usize::MAX, |p, h, d| got.push((p, h.match_bits, d.to_vec()))).unwrap();
        got
    }

    #[test]
    fn messages_arrive_in_order_and_backpressure_never_overwrites() {
        let (mut a, mut b, dir) = pair("order", 2);
        let max = a.max_eager();
        assert_eq!(max, 256 - 40);
        for i in 0..2u64 {
            assert_eq!(a.try_send(1, &MsgHeader::eager(i, 3, 0), &[i as u8; 3]).unwrap(), SendOutcome::Sent);
        }
        // Two slots, both unreleased: the third send must not write.
        assert_eq!(a.try_send(1, &MsgHeader::eager(2, 1, 0), &[2]).unwrap(), SendOutcome::Backpressure);
        assert!(matches!(a.try_send(1, &MsgHeader::eager(9, max + 1, 0), &vec![0; max + 1]), Err(TransportError::EagerTooLarge { .. })));
        assert!(matches!(a.try_send(2, &MsgHeader::eager(9, 0, 0), &[]), Err(TransportError::NoSuchPeer { peer: 2, size: 2 })));
        assert_eq!(drain(&mut b), vec![(0, 0, vec![0; 3]), (0, 1, vec![1; 3])]);
        assert_eq!(a.try_send(1, &MsgHeader::eager(2, max, 0), &vec![7; max]).unwrap(), SendOutcome::Sent);
        // self-send through our own ring
        assert_eq!(b.try_send(1, &MsgHeader::eager(5, 0, 0), &[]).unwrap(), SendOutcome::Sent);
        let got = drain(&mut b);
        assert_eq!(got.len(), 2);
        assert!(got.contains(&(0, 2, vec![7; max])) && got.contains(&(1, 5, vec![])));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn single_copy_read_and_write_and_bounds() {
        let (mut a, mut b, dir) = pair("cma", 4);
        let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let key = a.expose(&src).unwrap();
        let mut dst = vec![0u8; src.len()];
        assert_eq!(b.read(0, &key, &mut dst).unwrap(), OpStatus::Done);
        assert_eq!(dst, src);
        let mut target = vec![0u8; 10];
        let tkey = a.expose_mut(&mut target).unwrap();
        assert_eq!(b.write(0, &[9; 10], &tkey).unwrap(), OpStatus::Done);
        assert_eq!(target, [9; 10]);
        let mut big = vec![0u8; 11];
        assert!(matches!(b.read(0, &tkey, &mut big), Err(TransportError::RemoteBounds { len: 11, region: 10, .. })));
        let h = MsgHeader::control(MsgKind::Rts, 1, 5, 2, RemoteKey::BYTES);
        assert_eq!(a.try_send(1, &h, &key.encode()).unwrap(), SendOutcome::Sent);
        let got = drain(&mut b);
        assert_eq!(RemoteKey::decode(&got[0].2), Some(key));
        assert_eq!(b.peer_state(0), PeerState::Alive);
        a.finalize().unwrap();
        assert_eq!(b.peer_state(0), PeerState::Finalized);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
