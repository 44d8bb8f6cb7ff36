//! The wire header that leads every message, and its codec.
//!
//! 32 bytes, little-endian, fixed layout, so that a header plus a small
//! payload fits in one 64-byte cache line next to a transport's own flag
//! word (one cache-line handoff per small message on shared memory).
//!
//! | bytes  | field        | meaning |
//! |--------|--------------|---------|
//! | 0      | `kind`       | [`MsgKind`] |
//! | 1      | `ctrl_credits` | control credits returned to the receiver |
//! | 2..4   | `credits`    | data credits returned to the receiver |
//! | 4..8   | `payload_len`| bytes that follow the header in this message |
//! | 8..16  | `match_bits` | opaque to transports (fmx: context and tag) |
//! | 16..24 | `len`        | total message length (rendezvous: the whole buffer) |
//! | 24..32 | `cookie`     | opaque to transports (fmx: request ids) |

/// Size of an encoded [`MsgHeader`].
pub const HEADER_BYTES: usize = 32;

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgKind {
    /// Data carried in the message itself.
    Eager = 1,
    /// Request to send: the payload is a [`crate::RemoteKey`] of the sender's buffer.
    Rts = 2,
    /// Clear to send: the receiver's buffer key, for write-based rendezvous.
    Cts = 3,
    /// Rendezvous finished: the exposed buffer may be released.
    Fin = 4,
    /// Explicit credit return (no payload).
    Credit = 5,
    /// A transport's own message (its meaning in `match_bits`): handled inside
    /// the transport, never handed to the core.
    Internal = 6,
}

impl MsgKind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Eager,
            2 => Self::Rts,
            3 => Self::Cts,
            4 => Self::Fin,
            5 => Self::Credit,
            6 => Self::Internal,
            _ => return None,
        })
    }
}

/// The decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgHeader {
    /// What the message is.
    pub kind: MsgKind,
    /// Data credits returned to the receiver of this message (set by the transport).
    pub credits: u16,
    /// Control credits returned to the receiver of this message (set by the transport).
    pub ctrl_credits: u8,
    /// Bytes of payload that follow the header in this message.
    pub payload_len: u32,
    /// Opaque matching information (fmx: context id and tag).
    pub match_bits: u64,
    /// Total message length; for rendezvous, the length of the exposed buffer.
    pub len: u64,
    /// Opaque per-message value (fmx: request ids).
    pub cookie: u64,
}

/// Why a header did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than [`HEADER_BYTES`] bytes.
    #[error("header truncated: {0} of 32 bytes")]
    Truncated(usize),
    /// Unknown kind byte.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// An eager message whose payload length and total length disagree.
    #[error("eager message with payload_len {payload_len} but len {len}")]
    LengthMismatch {
        /// Bytes in this message.
        payload_len: u32,
        /// Declared total.
        len: u64,
    },
}

impl MsgHeader {
    /// An eager header for `payload_len` bytes of data.
    pub fn eager(match_bits: u64, payload_len: usize, cookie: u64) -> Self {
        Self {
            kind: MsgKind::Eager,
            credits: 0,
            ctrl_credits: 0,
            payload_len: payload_len as u32,
            match_bits,
            len: payload_len as u64,
            cookie,
        }
    }

    /// A control header (`Rts`, `Cts`, `Fin`, `Credit`) with a payload of `payload_len` bytes.
    pub fn control(kind: MsgKind, match_bits: u64, len: u64, cookie: u64, payload_len: usize) -> Self {
        Self { kind, credits: 0, ctrl_credits: 0, payload_len: payload_len as u32, match_bits, len, cookie }
    }

    /// Writes the header into `out`.
    #[inline]
    pub fn encode(&self, out: &mut [u8; HEADER_BYTES]) {
        out[0] = self.kind as u8;
        out[1] = self.ctrl_credits;
        out[2..4].copy_from_slice(&self.credits.to_le_bytes());
        out[4..8].copy_from_slice(&self.payload_len.to_le_bytes());
        out[8..16].copy_from_slice(&self.match_bits.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out[24..32].copy_from_slice(&self.cookie.to_le_bytes());
    }

    /// Reads a header from the start of `b`, checking what can be checked locally.
    #[inline]
    pub fn decode(b: &[u8]) -> Result<Self, HeaderError> {
        let Some(b) = b.get(..HEADER_BYTES) else {
            return Err(HeaderError::Truncated(b.len()));
        };
        let kind = MsgKind::from_u8(b[0]).ok_or(HeaderError::UnknownKind(b[0]))?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let h = Self {
            kind,
            credits: u16::from_le_bytes([b[2], b[3]]),
            ctrl_credits: b[1],
            payload_len: u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")),
            match_bits: u64_at(8),
            len: u64_at(16),
            cookie: u64_at(24),
        };
        if h.kind == MsgKind::Eager && u64::from(h.payload_len) != h.len {
            return Err(HeaderError::LengthMismatch { payload_len: h.payload_len, len: h.len });
        }
        Ok(h)
    }

    /// Whether an encoded header is of an eager message with no cookie: what
    /// a transport may carry without its header (the receiver rebuilds it
    /// from the match bits, the credits and the length). Reads two fields,
    /// not the whole header: it is asked of every eager send.
    #[inline]
    pub fn is_plain_eager(b: &[u8; HEADER_BYTES]) -> bool {
        b[0] == MsgKind::Eager as u8 && b[24..32] == [0; 8]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_eager_header_without_a_cookie_is_plain() {
        let mut b = [0u8; HEADER_BYTES];
        MsgHeader::eager(7, 8, 0).encode(&mut b);
        assert!(MsgHeader::is_plain_eager(&b));
        MsgHeader::eager(7, 8, 1).encode(&mut b);
        assert!(!MsgHeader::is_plain_eager(&b));
        MsgHeader::control(MsgKind::Rts, 7, 8, 0, 0).encode(&mut b);
        assert!(!MsgHeader::is_plain_eager(&b));
    }

    #[test]
    fn roundtrip_every_kind() {
        for kind in [MsgKind::Eager, MsgKind::Rts, MsgKind::Cts, MsgKind::Fin, MsgKind::Credit] {
            let len = if kind == MsgKind::Eager { 77 } else { 1 << 40 };
            let h = MsgHeader {
                kind,
                credits: 513,
                ctrl_credits: 2,
                payload_len: if kind == MsgKind::Eager { 77 } else { 24 },
                match_bits: 0xdead_beef_0000_0007,
                len,
                cookie: u64::MAX - 3,
            };
            let mut buf = [0u8; HEADER_BYTES];
            h.encode(&mut buf);
            assert_eq!(MsgHeader::decode(&buf), Ok(h));
        }
    }

    /// 10^6 mutated headers (FMX_FUZZ_ITERS for more): decoding never
    /// panics, and whatever decodes encodes back to the same bytes.
    #[test]
    fn fuzz_decode_never_panics_and_roundtrips() {
        let mut corpus = Vec::new();
        for h in [
            MsgHeader::eager(7, 100, 3),
            MsgHeader::control(MsgKind::Rts, 1 << 33, 1 << 40, 9, 24),
            MsgHeader::control(MsgKind::Credit, 0, 0, 0, 0),
        ] {
            let mut b = [0u8; HEADER_BYTES];
            h.encode(&mut b);
            corpus.push(b.to_vec());
        }
        let corpus: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        let mut m = crate::mutate::Mutator::new(0x4845_4144);
        let mut input = Vec::new();
        let (n, t) = (crate::mutate::iterations(1_000_000), std::time::Instant::now());
        let mut decoded = 0u64;
        for _ in 0..n {
            m.mutate(&corpus, &mut input);
            if let Ok(h) = MsgHeader::decode(&input) {
                decoded += 1;
                let mut back = [0u8; HEADER_BYTES];
                h.encode(&mut back);
                assert_eq!(&back[..], &input[..HEADER_BYTES], "{h:?}");
            }
        }
        eprintln!("fuzz header: {n} inputs ({decoded} decoded) in {:?}", t.elapsed());
        assert!(decoded > 0 && decoded < n, "the mutations reach both outcomes");
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(MsgHeader::decode(&[1u8; 5]), Err(HeaderError::Truncated(5)));
        let mut buf = [0u8; HEADER_BYTES];
        MsgHeader::eager(1, 8, 0).encode(&mut buf);
        buf[0] = 99;
        assert_eq!(MsgHeader::decode(&buf), Err(HeaderError::UnknownKind(99)));
        buf[0] = 1;
        buf[16] = 9; // len 9 != payload_len 8
        assert!(matches!(MsgHeader::decode(&buf), Err(HeaderError::LengthMismatch { .. })));
    }
}
