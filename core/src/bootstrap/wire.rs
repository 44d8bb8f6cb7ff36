//! Framing of the out-of-band bootstrap protocol between ranks and fmxrun.
//!
//! A frame is a 4-byte little-endian length followed by that many bytes; the
//! first byte of a frame is its op. Every rank runs the same sequence of
//! rounds (hello, allgather, barrier, finalize), so the server answers in
//! lock step. Outside the rounds, fmxrun may send a failure notice at any
//! time ([`OP_NOTICE`]), and a rank may announce that it is failing
//! ([`OP_ABORT`]).

use std::io::{self, Read, Write};
use std::time::Instant;

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

/// fmxrun tells every rank that the job is failing: [`Notice`].
pub const OP_NOTICE: u8 = b'N';

/// A rank tells fmxrun it is failing (it panicked): the body is the reason.
pub const OP_ABORT: u8 = b'X';

/// fmxrun refuses a rank's hello: the body says why (a wrong rank or size).
pub const OP_ERROR: u8 = b'E';

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
    let len = frame_len(len)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let op = body.remove(0);
    Ok((op, body))
}

/// The body length a frame's 4-byte prefix announces, checked.
pub fn frame_len(prefix: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bootstrap frame of {len} bytes")));
    }
    Ok(len)
}

/// Reads one frame from a socket: its first byte before `first_byte_by`
/// (`None`: however long that takes), then the rest of it within `whole`,
/// so that a peer that trickles bytes cannot stretch a read without end.
pub fn read_frame_by(s: &std::net::TcpStream, first_byte_by: Option<Instant>, whole: std::time::Duration) -> io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    read_exact_by(s, &mut len[..1], first_byte_by)?;
    let rest_by = Some(Instant::now() + whole);
    read_exact_by(s, &mut len[1..], rest_by)?;
    let mut body = vec![0u8; frame_len(len)?];
    read_exact_by(s, &mut body, rest_by)?;
    let op = body.remove(0);
    Ok((op, body))
}

fn read_exact_by(mut s: &std::net::TcpStream, mut buf: &mut [u8], deadline: Option<Instant>) -> io::Result<()> {
    while !buf.is_empty() {
        let left = match deadline {
            None => None,
            Some(d) => match d.checked_duration_since(Instant::now()).filter(|l| !l.is_zero()) {
                Some(l) => Some(l),
                None => return Err(io::Error::new(io::ErrorKind::TimedOut, "no complete answer before the deadline")),
            },
        };
        s.set_read_timeout(left)?;
        match s.read(buf) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection was closed")),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The first failure of a job, as fmxrun tells every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The failed process's rank in the receiving group (world or bridge), if it is a member.
    pub member: Option<u32>,
    /// The failed process's world: 0 for the first, k for the k-th spawned.
    pub generation: u32,
    /// Its rank in that world.
    pub rank: u32,
    /// What happened ("was killed by signal 9", "panicked", ...).
    pub reason: String,
}

impl Notice {
    /// Encodes the notice: member (u32, `u32::MAX` for none), generation, rank, reason.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(12 + self.reason.len());
        for x in [self.member.unwrap_or(u32::MAX), self.generation, self.rank] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(self.reason.as_bytes());
        v
    }

    /// Decodes what [`Notice::encode`] wrote; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let at = |i: usize| b.get(i..i + 4).map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")));
        let member = at(0)?;
        Some(Self {
            member: (member != u32::MAX).then_some(member),
            generation: at(4)?,
            rank: at(8)?,
            reason: String::from_utf8_lossy(&b[12..]).into_owned(),
        })
    }
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

    /// 10^6 mutated frames (FMX_FUZZ_ITERS for more): reading a frame, its
    /// blobs and a notice never panics, never allocates past MAX_FRAME, and
    /// what decodes encodes back.
    #[test]
    fn fuzz_frames_blobs_and_notices() {
        let mut corpus = Vec::new();
        let mut f = Vec::new();
        write_frame(&mut f, OP_ALLGATHER, &encode_blobs(&[b"abc".to_vec(), vec![], vec![7; 40]])).unwrap();
        corpus.push(f);
        let n = Notice { member: Some(3), generation: 1, rank: 3, reason: "was killed by signal 9".into() };
        let mut f = Vec::new();
        write_frame(&mut f, OP_NOTICE, &n.encode()).unwrap();
        corpus.push(f);
        corpus.push(vec![5, 0, 0, 0, OP_HELLO, 1, 2, 3, 4]);
        let corpus: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        let mut m = fmx_transport::mutate::Mutator::new(0x464d_5852);
        let mut input = Vec::new();
        let (iters, t) = (fmx_transport::mutate::iterations(1_000_000), std::time::Instant::now());
        let mut frames = 0u64;
        for _ in 0..iters {
            m.mutate(&corpus, &mut input);
            let Ok((op, body)) = read_frame(&mut &input[..]) else { continue };
            frames += 1;
            assert!(body.len() < MAX_FRAME);
            if let Some(blobs) = decode_blobs(&body) {
                assert_eq!(encode_blobs(&blobs), body);
            }
            if op == OP_NOTICE {
                if let Some(n) = Notice::decode(&body) {
                    assert_eq!(Notice::decode(&n.encode()), Some(n));
                }
            }
        }
        eprintln!("fuzz fmxrun frames: {iters} inputs ({frames} frames) in {:?}", t.elapsed());
        assert!(frames > 0 && frames < iters);
    }

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
