//! What a process publishes through the bootstrap: who it is (pid and host,
//! for liveness), which provider it chose, where its credit mailbox is, and
//! its endpoint name in the provider's own format.

use fmx_transport::{PeerId, TransportError};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Address {
    pub(crate) pid: u32,
    pub(crate) host: [u8; 24],
    /// The peer-visible address of the mailbox's first word, and its key.
    pub(crate) mailbox_addr: u64,
    pub(crate) mailbox_key: u64,
    pub(crate) provider: String,
    /// It connects on demand (`FMX_CONNECT=lazy`): every rank must.
    pub(crate) lazy: bool,
    pub(crate) name: Vec<u8>,
}

const FIXED: usize = 4 + 24 + 8 + 8 + 1 + 1 + 2;

impl Address {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + self.provider.len() + self.name.len());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.host);
        b.extend_from_slice(&self.mailbox_addr.to_le_bytes());
        b.extend_from_slice(&self.mailbox_key.to_le_bytes());
        b.push(u8::from(self.lazy));
        b.push(self.provider.len() as u8);
        b.extend_from_slice(self.provider.as_bytes());
        b.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.name);
        b
    }

    pub(crate) fn decode(peer: PeerId, b: &[u8]) -> Result<Self, TransportError> {
        let bad = || TransportError::Malformed { peer, what: "libfabric address of the wrong length" };
        if b.len() < FIXED {
            return Err(bad());
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let plen = b[45] as usize;
        let provider = b.get(46..46 + plen).ok_or_else(bad)?;
        let nlen_at = 46 + plen;
        let nlen = u16::from_le_bytes(b.get(nlen_at..nlen_at + 2).ok_or_else(bad)?.try_into().expect("2 bytes")) as usize;
        let name = b.get(nlen_at + 2..).filter(|n| n.len() == nlen).ok_or_else(bad)?;
        Ok(Self {
            pid: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            host: b[4..28].try_into().expect("24 bytes"),
            mailbox_addr: u64_at(28),
            mailbox_key: u64_at(36),
            provider: String::from_utf8_lossy(provider).into_owned(),
            lazy: b[44] != 0,
            name: name.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_truncation() {
        let a = Address {
            pid: 7,
            host: [3; 24],
            mailbox_addr: 0x7f00_0000_1000,
            mailbox_key: 42,
            provider: "tcp;ofi_rxm".into(),
            lazy: true,
            name: vec![2, 0, 0x1f, 0x90, 127, 0, 0, 1],
        };
        let b = a.encode();
        assert_eq!(Address::decode(1, &b).unwrap(), a);
        for cut in [0, 10, FIXED, b.len() - 1] {
            assert!(matches!(Address::decode(1, &b[..cut]), Err(TransportError::Malformed { peer: 1, .. })), "cut {cut}");
        }
    }
}
