//! Framing of the out-of-band bootstrap protocol between ranks and fmxrun.
//!
//! A frame is a 4-byte little-endian length followed by that many bytes; the
//! first byte of a frame is its op. Every rank runs the same sequence of
//! rounds (hello, allgather, barrier, finalize), so the server answers in
//! lock step.

use std::io::{self, Read, Write};

/// A rank introduces itself: rank, size, pid (u32 each).
pub const OP_HELLO: u8 = b'H';
/// Allgather of one blob per rank; the answer holds all, in rank order.
pub const OP_ALLGATHER: u8 = b'A';
/// Barrier.
pub const OP_BARRIER: u8 = b'B';
/// The rank finalizes (a barrier, then the connection closes).
pub const OP_FINALIZE: u8 = b'F';

/// The world asks fmxrun to start another world (collective): new size (u32),
/// bridge flag (u8), opaque values; the answer says how to reach the bridge.
pub const OP_SPAWN: u8 = b'S';

/// Largest frame accepted (bounds memory against a confused peer).
pub const MAX_FRAME: usize = 64 << 20;

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, op: u8, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len() + 1).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(5 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(op);
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame: its op and body.
pub fn read_frame(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bootstrap frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let op = body.remove(0);
    Ok((op, body))
}

/// Encodes a list of blobs (u32 length + bytes each).
pub fn encode_blobs(blobs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in blobs {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

/// Decodes what [`encode_blobs`] wrote; `None` if malformed.
pub fn decode_blobs(mut b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let len = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        out.push(b.get(4..4 + len)?.to_vec());
        b = &b[4 + len..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_blobs_roundtrip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, OP_ALLGATHER, b"xyz").unwrap();
        write_frame(&mut buf, OP_BARRIER, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), (OP_ALLGATHER, b"xyz".to_vec()));
        assert_eq!(read_frame(&mut r).unwrap(), (OP_BARRIER, vec![]));
        assert!(read_frame(&mut r).is_err());
        let blobs = vec![vec![1, 2], vec![], vec![3; 300]];
        assert_eq!(decode_blobs(&encode_blobs(&blobs)), Some(blobs));
        assert_eq!(decode_blobs(&[5, 0, 0, 0, 1]), None);
    }
}
