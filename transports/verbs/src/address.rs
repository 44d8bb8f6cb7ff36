//! What a rank publishes through the bootstrap so that every peer can
//! connect its queue pair to ours and write credits into our mailbox.

use fmx_transport::{PeerId, TransportError};

/// One rank's connection information.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Address {
    pub(crate) pid: u32,
    /// Same boot id and PID namespace: a pidfd can watch the process.
    pub(crate) host: [u8; 24],
    pub(crate) lid: u16,
    pub(crate) global: bool,
    pub(crate) mtu: u32,
    pub(crate) gid: [u8; 16],
    pub(crate) mailbox_addr: u64,
    pub(crate) mailbox_rkey: u32,
    /// Connections made on demand: the rank's UD queue pair, which takes the handshakes.
    pub(crate) ud_qpn: u32,
    /// Whether the rank connects on demand (`FMX_CONNECT`, alike in the whole job).
    pub(crate) lazy: bool,
    /// Eagerly, `qp[r]`: the QP number and initial PSN this rank uses toward
    /// rank r. Lazily empty: the address has a fixed size whatever the job's.
    pub(crate) qp: Vec<(u32, u32)>,
}

const FIXED: usize = 4 + 24 + 2 + 1 + 1 + 16 + 8 + 4 + 4 + 1;
/// Where the mode byte is: read before the length, whose check depends on it.
const LAZY_AT: usize = FIXED - 1;

impl Address {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + 8 * self.qp.len());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.host);
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.push(u8::from(self.global));
        b.push(self.mtu as u8);
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&self.mailbox_addr.to_le_bytes());
        b.extend_from_slice(&self.mailbox_rkey.to_le_bytes());
        b.extend_from_slice(&self.ud_qpn.to_le_bytes());
        b.push(u8::from(self.lazy));
        for (qpn, psn) in &self.qp {
            b.extend_from_slice(&qpn.to_le_bytes());
            b.extend_from_slice(&psn.to_le_bytes());
        }
        b
    }

    /// Rank `peer`'s address in a job of `size`, where we connect `lazy`ly or not.
    pub(crate) fn decode(peer: PeerId, me: PeerId, size: u32, lazy: bool, b: &[u8]) -> Result<Self, TransportError> {
        match b.get(LAZY_AT) {
            Some(&mode) if b.len() >= FIXED && (mode != 0) != lazy => {
                return Err(fmx_transport::rdma::connect::mode_mismatch(peer, me, lazy))
            }
            _ => {}
        }
        let qps = if lazy { 0 } else { size as usize };
        if b.len() != FIXED + 8 * qps {
            return Err(TransportError::Malformed {
                peer,
                what: "verbs address of the wrong length (different fmx versions or job sizes?)",
            });
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let mut host = [0u8; 24];
        host.copy_from_slice(&b[4..28]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let qp = (0..qps).map(|r| (u32_at(FIXED + 8 * r), u32_at(FIXED + 8 * r + 4))).collect();
        Ok(Self {
            pid: u32_at(0),
            host,
            lid: u16::from_le_bytes([b[28], b[29]]),
            global: b[30] != 0,
            mtu: u32::from(b[31]),
            gid,
            mailbox_addr: u64::from_le_bytes(b[48..56].try_into().expect("8 bytes")),
            mailbox_rkey: u32_at(56),
            ud_qpn: u32_at(60),
            lazy,
            qp,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fmx_transport::liveness::host_identity;

    #[test]
    fn round_trips_and_rejects_wrong_lengths() {
        let a = Address {
            pid: 42,
            host: host_identity(),
            lid: 7,
            global: true,
            mtu: 3,
            gid: [9; 16],
            mailbox_addr: 0xdead_beef_0000,
            mailbox_rkey: 0x1234,
            ud_qpn: 0x55,
            lazy: false,
            qp: vec![(0, 0), (17, 99), (18, 100)],
        };
        let b = a.encode();
        assert_eq!(Address::decode(1, 0, 3, false, &b).unwrap(), a);
        assert!(matches!(Address::decode(1, 0, 4, false, &b), Err(TransportError::Malformed { peer: 1, .. })));
        // Lazily the address has a fixed size whatever the job's.
        let lazy = Address { lazy: true, qp: Vec::new(), ..a };
        let b = lazy.encode();
        assert_eq!(b.len(), FIXED);
        assert_eq!(Address::decode(1, 0, 100_000, true, &b).unwrap(), lazy);
        // A rank in the other mode is named.
        let e = Address::decode(1, 0, 3, false, &b).unwrap_err().to_string();
        assert!(e.contains("rank 1 connects lazy but rank 0 connects eager"), "{e}");
    }
}
